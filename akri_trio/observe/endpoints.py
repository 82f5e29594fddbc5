"""The observability endpoint: /healthz, /readyz and /metrics, served by the runtime's HTTP server.

Kubelet probes and Prometheus scrapes need three GET routes in every agent and controller pod.
Routing is a pure function of (method, target) (`route`), so it is tested without sockets;
akri_trio.runtime.http's `serve_http` moves the bytes, with its timeouts and connection cap.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias

import trio

from akri_trio.flaghelp import add_env_argument
from akri_trio.observe.metrics import CONTENT_TYPE, Registry, render
from akri_trio.runtime.http import (
    DEFAULT_MAX_CONNECTIONS,
    Reply,
    Respond,
    serve_connection,
    serve_http,
)

__all__ = [
    "NamedChecks",
    "Readiness",
    "add_metrics_max_connections",
    "evaluate_readiness",
    "handle_connection",
    "route",
    "serve_observe",
]

log = logging.getLogger(__name__)

NamedChecks: TypeAlias = Mapping[str, Callable[[], bool]] | Sequence[tuple[str, Callable[[], bool]]]
# Either one callable saying (ready, why) or named boolean checks, reported one per line.
Readiness: TypeAlias = Callable[[], tuple[bool, str]] | NamedChecks


def evaluate_readiness(ready: Readiness) -> tuple[bool, str]:
    """Run the checks; (all passed, a body naming each check). A check that raises fails."""
    if callable(ready):
        try:
            ok, why = ready()
        except Exception as exc:
            return False, f"readiness check raised {exc!r}\n"
        return ok, (why or ("ok" if ok else "not ready")) + "\n"
    checks = list(ready.items()) if isinstance(ready, Mapping) else list(ready)
    lines: list[str] = []
    failing: list[str] = []
    for name, check in checks:
        try:
            ok = bool(check())
            detail = "ok" if ok else "failed"
        except Exception as exc:
            ok, detail = False, f"failed: {exc!r}"
        if not ok:
            failing.append(name)
        # The kube-apiserver's verbose /readyz layout, familiar to anyone reading probe output.
        lines.append(f"[{'+' if ok else '-'}]{name} {detail}")
    lines.append(f"not ready: {', '.join(failing)}" if failing else "ok")
    return not failing, "\n".join(lines) + "\n"


def route(
    method: str, target: str, *, registry: Registry, ready: Readiness, live: Readiness = ()
) -> Reply:
    """The response to one request. HEAD is GET without the body (the shell drops it).
    /healthz runs the `live` checks (the event loop's lag), /readyz the `ready` ones."""
    path = target.split("?", 1)[0]
    if path not in ("/healthz", "/readyz", "/metrics"):
        return Reply(404, b"not found\n")
    if method not in ("GET", "HEAD"):
        return Reply(405, b"method not allowed\n", headers=(("allow", "GET, HEAD"),))
    if path in ("/healthz", "/readyz"):
        # Answering at all is most of /healthz: a wedged event loop never gets here. A loop
        # that only crawls does, and its lag check says so.
        ok, why = evaluate_readiness(live if path == "/healthz" else ready)
        return Reply(200 if ok else 503, why.encode())
    try:
        body = render(registry)
    except Exception:
        # A broken gauge callback: a 500 makes the scrape fail visibly (up == 0) instead of
        # silently exporting a partial set that dashboards would read as real zeros.
        log.exception("rendering /metrics failed")
        return Reply(500, b"metrics collection failed\n")
    return Reply(200, body, content_type=CONTENT_TYPE)


def add_metrics_max_connections(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """--metrics-max-connections (METRICS_MAX_CONNECTIONS): the observe endpoint's cap."""
    add_env_argument(
        parser,
        "--metrics-max-connections",
        env=env,
        var="METRICS_MAX_CONNECTIONS",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="connections the health and metrics server serves at once (at most a quarter of "
        "the file descriptor limit); one more takes the place of the one idle longest",
    )


async def serve_observe(
    host: str | None,
    port: int,
    *,
    registry: Registry,
    ready: Readiness = (),
    live: Readiness = (),
    request_timeout: float = 10.0,
    idle_timeout: float | None = None,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve /healthz (`live` checks), /readyz (`ready` checks) and /metrics until cancelled
    (see `serve_http`)."""
    await serve_http(
        host,
        port,
        _observe(registry, ready, live),
        name="observe endpoint",
        request_timeout=request_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
        task_status=task_status,
    )


async def handle_connection(
    stream: trio.abc.HalfCloseableStream,
    *,
    registry: Registry,
    ready: Readiness,
    request_timeout: float,
) -> None:
    """The observe endpoint on one connection (see `serve_connection`)."""
    await serve_connection(stream, _observe(registry, ready), request_timeout=request_timeout)


def _observe(registry: Registry, ready: Readiness, live: Readiness = ()) -> Respond:
    return lambda method, target, _body: route(
        method, target, registry=registry, ready=ready, live=live
    )
