"""`akri-trio agent` for the benchmarks, in its own process: the same CLI flags and the same
`run_agent`, with the isolation of _common.py (akri objects of `akri-bench` only, the embedded
debugEcho registered as `benchEcho`). Usage: python -m bench._agent_proc <agent flags>."""

from __future__ import annotations

import os
import signal
import sys

import trio

from akri_trio.agent.cli import parse_args
from akri_trio.agent.run import AgentSettings, run_agent
from bench._common import scoped_api, use_bench_echo


async def _main(settings: AgentSettings) -> None:
    kubeconfig = str(settings.kubeconfig or os.environ["KUBECONFIG"])
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with scoped_api(kubeconfig) as api, trio.open_nursery() as nursery:
            nursery.start_soon(lambda: run_agent(settings, api=api))
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


def main(argv: list[str]) -> int:
    settings = parse_args(argv, os.environ)
    use_bench_echo(float(os.environ.get("BENCH_ECHO_POLL", "1.0")))
    trio.run(_main, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
