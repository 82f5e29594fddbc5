"""`akri-trio agent` for the benchmarks, in its own process: the same CLI flags and the same
`run_agent`, with the isolation of _common.py (akri objects of `akri-bench` only, the embedded
debugEcho registered as `benchEcho`). Usage: python -m bench._agent_proc <agent flags>."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import attrs
import trio

from akri_trio.agent.cli import parse_args
from akri_trio.agent.run import AgentSettings, run_agent
from bench._common import BENCH_NS, bench_api, bench_echo


async def _main(settings: AgentSettings) -> None:
    kubeconfig = str(settings.kubeconfig or os.environ["KUBECONFIG"])
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with bench_api(kubeconfig) as api, trio.open_nursery() as nursery:
            nursery.start_soon(lambda: run_agent(settings, api=api))
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


def main(argv: list[str]) -> int:
    settings = parse_args(argv, os.environ)
    availability = settings.debug_echo_availability or Path("/tmp/debug-echo-availability.txt")
    echo = bench_echo(availability, float(os.environ.get("BENCH_ECHO_POLL", "0.2")))
    settings = attrs.evolve(settings, namespace=BENCH_NS, enable_debug_echo=False, handlers=(echo,))
    trio.run(_main, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
