"""Running a command's main task until SIGTERM or SIGINT.

Kubernetes stops a container with SIGTERM and a developer stops a command with Ctrl-C; either
must cancel the command's nursery tree, so that each task removes what it created (sockets,
listeners, streams) on the way out, instead of the process dying mid-write. Every long-running
command (agent, webhook) starts its main task through `run_until_signalled`.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import trio


async def run_until_signalled(main: Callable[[], Awaitable[object]], log: logging.Logger) -> None:
    """Run `main` until it returns or the first SIGTERM / SIGINT cancels it."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def run_main() -> None:
                await main()
                nursery.cancel_scope.cancel()  # returning ends the command, signal or not

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("%s: shutting down", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(run_main)
            nursery.start_soon(stop_on_signal)
