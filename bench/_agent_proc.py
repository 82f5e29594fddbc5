"""`akri-trio agent` for the benchmarks, in its own process: the same CLI flags and the same
`run_agent`, with the isolation of _common.py (akri objects of `akri-bench` only, the embedded
debugEcho registered as `benchEcho`). Usage: python -m bench._agent_proc <agent flags>."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from akri_trio.agent.cli import parse_args
from akri_trio.agent.run import AgentSettings, run_agent
from akri_trio.observe.logs import log_level, setup_logging
from bench._common import BENCH_NS, REPO, bench_api, bench_echo


@asynccontextmanager
async def agent_process(
    root: Path, kubeconfig: str, node: str, *extra: str
) -> AsyncIterator[trio.Process]:
    """This module as a child process, sockets under `root` (the kubelet's device-plugin dir
    is `root/dp`), its log in `root/agent.log`; SIGTERM (then SIGKILL) on exit."""
    (root / "dp").mkdir(exist_ok=True)
    cmd = [
        sys.executable, "-m", "bench._agent_proc",
        "--node-name", node,
        "--kubeconfig", kubeconfig,
        "--enable-debug-echo",
        "--debug-echo-availability", str(root / "avail"),
        "--device-plugin-dir", str(root / "dp"),
        "--pod-resources-socket", str(root / "pr.sock"),
        "--discovery-handlers-directory", str(root / "akri"),
        "--metrics-port", "-1",
        "--log-level", "WARNING",
        *extra,
    ]  # fmt: skip
    with (root / "agent.log").open("w") as log:
        proc = await trio.lowlevel.open_process(cmd, cwd=REPO, stdout=log, stderr=log)
        try:
            yield proc
        finally:
            with trio.CancelScope(shield=True):
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(20):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


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
    setup_logging(log_level(os.environ.get("AKRI_LOG_LEVEL", "INFO")), "text")
    availability = settings.debug_echo_availability or Path("/tmp/debug-echo-availability.txt")
    poll = float(os.environ.get("BENCH_ECHO_POLL", "0.2"))
    echo = bench_echo(availability, poll, shared=settings.debug_echo_shared)
    namespace = settings.namespace or BENCH_NS  # a bench may give its own with --namespace
    settings = attrs.evolve(
        settings, namespace=namespace, enable_debug_echo=False, handlers=(echo,)
    )
    trio.run(_main, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
