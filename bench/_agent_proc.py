"""`akri-trio agent` for the benchmarks, in its own process: the same CLI flags and the same
`run_agent`, with the isolation of _common.py (akri objects of `akri-bench` only, or of the
namespace given with `--namespace`; the embedded debugEcho registered as `benchEcho`).
Usage: python -m bench._agent_proc <agent flags>."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from akri_trio.agent.cli import parse_args
from akri_trio.agent.run import AgentSettings, run_agent
from akri_trio.kube.client import PATCH_APPLY
from akri_trio.runtime.logs import log_level, setup_logging
from bench._common import BENCH_NS, REPO, bench_api, bench_echo


def agent_args(root: Path, kubeconfig: str, node: str) -> list[str]:
    """The agent's flags for a bench run: debugEcho on, its sockets and files under `root`
    (the kubelet's device-plugin dir is `root/dp`), no metrics port, warnings only."""
    return [
        "--node-name", node,
        "--kubeconfig", kubeconfig,
        "--enable-debug-echo",
        "--debug-echo-availability", str(root / "avail"),
        "--device-plugin-dir", str(root / "dp"),
        "--pod-resources-socket", str(root / "pr.sock"),
        "--discovery-handlers-directory", str(root / "akri"),
        "--metrics-port", "-1",
        "--log-level", "WARNING",
    ]  # fmt: skip


@asynccontextmanager
async def agent_process(
    root: Path, kubeconfig: str, node: str, *extra: str, count_requests: bool = True
) -> AsyncIterator[trio.Process]:
    """This module as a child process, sockets under `root` (the kubelet's device-plugin dir
    is `root/dp`), its log in `root/agent.log`, the count of its API requests in
    `root/requests.json` unless `count_requests` is False (see `requests_of`); SIGTERM (then
    SIGKILL) on exit."""
    (root / "dp").mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "bench._agent_proc", *agent_args(root, kubeconfig, node), *extra]
    # Counting wakes the agent every REQUESTS_PERIOD_S: a bench of idleness goes without.
    env = {**os.environ, REQUESTS_ENV: str(root / "requests.json")} if count_requests else None
    async with child_process(cmd, root / "agent.log", env) as proc:
        yield proc


@asynccontextmanager
async def child_process(
    cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[trio.Process]:
    """`cmd` run from the repository with its output in `log`; SIGTERM on exit, SIGKILL if it
    is still there 20 s later (shielded: it also runs when the bench is cancelled)."""
    with log.open("w") as out:
        proc = await trio.lowlevel.open_process(cmd, cwd=REPO, stdout=out, stderr=out, env=env)
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


REQUESTS_ENV = "BENCH_REQUESTS_FILE"
REQUESTS_PERIOD_S = 0.5


def requests_of(root: Path) -> Counter[str]:
    """What the agent under `root` has sent the API server so far, by "verb resource code"
    (verb APPLY for a server-side apply, code "gave-up" for a request it abandoned), as of
    at most REQUESTS_PERIOD_S ago. Exact per agent, unlike the API server's cluster-wide
    counters on a cluster other sessions use too."""
    try:
        return Counter(json.loads((root / "requests.json").read_text()))
    except FileNotFoundError:
        return Counter()


class _RequestCounts:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts: Counter[str] = Counter()

    @staticmethod
    def _name(request: httpx.Request) -> str:
        verb = request.method
        if request.headers.get("content-type") == PATCH_APPLY:
            verb = "APPLY"
        elif verb == "GET":
            verb = "WATCH" if request.url.params.get("watch") else "GET"
        parts = request.url.path.strip("/").split("/")
        # /apis/<group>/<version>[/namespaces/<ns>]/<resource>[/<name>[/<sub>]], /api/v1/...
        rest = parts[3:] if parts[0] == "apis" else parts[2:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        if verb == "GET" and len(rest) == 1:
            verb = "LIST"
        return f"{verb} {rest[0] if rest else '?'}"

    async def on_response(self, response: httpx.Response) -> None:
        self.counts[f"{self._name(response.request)} {response.status_code}"] += 1

    def count_given_up(self, http: httpx.AsyncClient) -> None:
        """Count the requests that end without an answer (cancelled, timed out, refused)."""
        send = http.send

        async def counted(request: httpx.Request, **kwargs: Any) -> httpx.Response:
            try:
                return await send(request, **kwargs)
            except BaseException:
                self.counts[f"{self._name(request)} gave-up"] += 1
                raise

        http.send = counted  # type: ignore[method-assign]

    async def dump_forever(self) -> None:
        """Write the counts when they changed: the write blocks the agent's loop, and done every
        period regardless it held a fleet agent for a tenth of the time py-spy sampled."""
        written: Counter[str] = Counter()
        while True:
            if self.counts != written:
                written = self.counts.copy()
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(written))
                tmp.replace(self.path)
            await trio.sleep(REQUESTS_PERIOD_S)


async def _main(settings: AgentSettings) -> None:
    kubeconfig = str(settings.kubeconfig or os.environ["KUBECONFIG"])
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with bench_api(kubeconfig) as api, trio.open_nursery() as nursery:
            if path := os.environ.get(REQUESTS_ENV):
                counts = _RequestCounts(Path(path))
                api.http.event_hooks["response"].append(counts.on_response)
                counts.count_given_up(api.http)
                nursery.start_soon(counts.dump_forever)
            nursery.start_soon(lambda: run_agent(settings, api=api))
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


def main(argv: list[str]) -> int:
    settings = parse_args(argv, os.environ)
    setup_logging(log_level(os.environ.get("AKRI_LOG_LEVEL", "INFO")), "text")
    availability = settings.debug_echo_availability or Path("/tmp/debug-echo-availability.txt")
    poll = float(os.environ.get("BENCH_ECHO_POLL", settings.debug_echo_poll_period))
    echo = bench_echo(availability, poll, shared=settings.debug_echo_shared)
    namespace = settings.namespace or BENCH_NS  # a bench may give its own with --namespace
    settings = attrs.evolve(
        settings, namespace=namespace, enable_debug_echo=False, handlers=(echo,)
    )
    trio.run(_main, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
