"""`akri-trio dashboard`: the live picture in a browser, from one process and one port.

An operator wants to watch devices appear and slots be claimed without re-running a command.
The process keeps the picture current with `ClusterWatch` (the same watches as `status
--watch`) and serves two things on one port: `/` a self-contained page (no external assets, so
it works offline and behind `kubectl port-forward`) and `/ws` a websocket sending the picture,
then only what changed (`feed`). Read-only; it binds to localhost unless told otherwise.

Binding to localhost does not keep other web pages out: a page on the internet, open in the
operator's browser, can open a websocket to 127.0.0.1 (browsers do not apply the same-origin
policy to websockets), or point its own DNS name at 127.0.0.1 and read the page (DNS
rebinding). So every request must carry a `Host` the dashboard serves (its loopback names and
its bind address with its port, or one given with `--allowed-host`), and a websocket upgrade
(any request that carries one) an `Origin` of that same host: anything else is 403.

One port for both means telling a page request from a websocket upgrade before either
protocol owns the connection: the request head is read here, then replayed into
trio-websocket's handshake (`_Replay`). Each client sends from its own task, from the last
picture it sent to the newest, so a slow client skips intermediate pictures instead of queueing
them, and one stuck client (a send that exceeds `SEND_TIMEOUT_S`) is dropped without holding
up the others. Everything runs in one nursery: cancelling `run_dashboard` closes every client.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.resources
import json
import logging
import os
import sys
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs
import trio
import trio_websocket

from akri_trio.flaghelp import Parser, add_env_argument, add_log_arguments, comma_list
from akri_trio.kube import Client, ConfigError, KubeConfig, load_config
from akri_trio.observe import feed
from akri_trio.observe.cli import add_picture_arguments
from akri_trio.observe.watcher import ClusterWatch
from akri_trio.runtime import Changed
from akri_trio.runtime.logs import log_startup, setup_logging
from akri_trio.shutdown import run_until_signalled

__all__ = [
    "Hub",
    "Route",
    "parse_dashboard_args",
    "route",
    "run_dashboard",
    "serve_client",
    "served_hosts",
]

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 10.0  # a connection must send its request head within this
SEND_TIMEOUT_S = 10.0  # a client that cannot take one message within this is dropped
PING_EVERY_S = 20.0  # an idle connection is pinged this often (and dropped if it never answers)
MAX_HEAD_BYTES = 16 * 1024
PAGE = importlib.resources.files("akri_trio.observe").joinpath("dashboard.html").read_bytes()


@attrs.frozen
class Route:
    """What to do with a request head: a websocket, or a plain response (status, body)."""

    websocket: bool
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"


def served_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The `Host` header values the dashboard answers (lower case): 127.0.0.1, localhost and
    [::1] and its bind address `host` (unless that is every address), each with `port` (and
    without it too when `port` is 80, as browsers send it), and `extra` as given."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if host not in ("", "0.0.0.0", "::"):
        names.add(f"[{host}]" if ":" in host else host)
    served = {f"{name}:{port}" for name in names} | (names if port == 80 else set())
    return frozenset(name.lower() for name in (*served, *extra))


def _foreign(headers: Mapping[str, str], hosts: Collection[str]) -> bytes | None:
    """Why a request is refused as not from a page of the dashboard's own (None: it is)."""
    host = headers.get("host", "")
    if host not in hosts:
        return b"unknown Host: this dashboard answers only the names it serves\n"
    origin = headers.get("origin")
    if "upgrade" in headers and origin is None:
        return b"a websocket needs an Origin\n"
    if origin is not None and origin != f"http://{host}":
        return b"cross-origin request refused\n"
    return None


def route(head: bytes, hosts: Collection[str]) -> Route:
    """Decide from a request head alone (pure): a `Host` not in `hosts` or a foreign `Origin`
    is 403 (see the module docstring); else GET /ws with an Upgrade is the websocket, GET /
    (or /index.html) is the page, anything else is 404 / 405 / 400."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
    except ValueError:
        return Route(False, 400, b"bad request\n")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    refused = _foreign(headers, hosts)
    if refused is not None:
        return Route(False, 403, refused)
    path = target.split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return Route(False, 405, b"read-only: GET only\n")
    if path == "/ws":
        if headers.get("upgrade") == "websocket":
            return Route(True)
        return Route(False, 400, b"/ws is a websocket\n")
    if path in ("/", "/index.html"):
        return Route(False, 200, PAGE, "text/html; charset=utf-8")
    return Route(False, 404, b"not found\n")


def _response(r: Route, *, head_only: bool) -> bytes:
    reason = {
        200: "OK",
        400: "Bad Request",
        403: "Forbidden",
        404: "Not Found",
        405: "Method Not Allowed",
    }
    lines = [
        f"HTTP/1.1 {r.status} {reason.get(r.status, '')}",
        f"Content-Type: {r.content_type}",
        f"Content-Length: {len(r.body)}",
        "Cache-Control: no-store",
        "X-Content-Type-Options: nosniff",
        "Connection: close",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else r.body)


class _Replay(trio.abc.Stream):
    """A stream that first yields bytes already read from `inner`, then reads `inner`."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self.inner = inner
        self.prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.prefix:
            n = len(self.prefix) if max_bytes is None else max_bytes
            out, self.prefix = self.prefix[:n], self.prefix[n:]
            return out
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if isinstance(self.inner, trio.abc.HalfCloseableStream):
            await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


class Hub:
    """The newest picture and a way to wait for a newer one."""

    def __init__(self, picture: Mapping[str, Any]) -> None:
        self.picture: Mapping[str, Any] = picture
        self._newer = Changed()

    def publish(self, picture: Mapping[str, Any]) -> None:
        self.picture = picture
        self._newer.bump()

    async def wait_newer(self, than: Mapping[str, Any]) -> None:
        while self.picture is than:
            await self._newer.wait_past(self._newer.version)


async def serve_client(ws: trio_websocket.WebSocketConnection, hub: Hub) -> None:
    """Send a snapshot, then a change per newer picture, until the client goes."""
    sent = hub.picture
    with trio.fail_after(SEND_TIMEOUT_S):
        await ws.send_message(json.dumps(feed.snapshot(sent)))
    while True:
        with trio.move_on_after(PING_EVERY_S):
            await hub.wait_newer(sent)
        now = hub.picture
        with trio.fail_after(SEND_TIMEOUT_S):
            if now is sent:
                await ws.ping()  # idle: a vanished client shows up here
                continue
            change = feed.diff(sent, now)
            if change is not None:
                await ws.send_message(json.dumps(change))
        sent = now


async def _read_head(stream: trio.abc.Stream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk or len(data) > MAX_HEAD_BYTES:
            return b""
        data += chunk
    return data


async def _connection(stream: trio.SocketStream, hub: Hub, hosts: Collection[str]) -> None:
    try:
        head = b""
        with trio.move_on_after(HEAD_TIMEOUT_S):
            head = await _read_head(stream)
        if not head:
            return  # closed, too big, or too slow
        r = route(head.split(b"\r\n\r\n", 1)[0], hosts)
        if not r.websocket:
            with trio.fail_after(SEND_TIMEOUT_S):
                await stream.send_all(_response(r, head_only=head.startswith(b"HEAD ")))
            return
        async with trio.open_nursery() as nursery:  # holds trio-websocket's reader task
            with trio.fail_after(HEAD_TIMEOUT_S):
                request = await trio_websocket.wrap_server_stream(nursery, _Replay(stream, head))
                ws = await request.accept()
            try:
                await serve_client(ws, hub)
            except (trio_websocket.ConnectionClosed, trio.TooSlowError):
                pass
            finally:
                with trio.move_on_after(1, shield=True):
                    await ws.aclose()
            nursery.cancel_scope.cancel()
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
        pass  # the client went or stalled; nothing to tell it
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


async def run_dashboard(
    api: Client,
    namespace: str | None,
    host: str,
    port: int,
    *,
    allowed_hosts: Iterable[str] = (),
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Watch and serve until cancelled; started (with the bound port) once the first picture
    is complete and the socket listens. Requests must name a host of
    `served_hosts(host, port, allowed_hosts)`."""
    watch = ClusterWatch(api, namespace)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        hub = Hub(watch.picture())

        async def publish() -> None:
            async for pic in watch.changes():
                hub.publish(pic)

        nursery.start_soon(publish)
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        nursery.start_soon(
            functools.partial(
                trio.serve_listeners,
                functools.partial(
                    _connection, hub=hub, hosts=served_hosts(host, bound, allowed_hosts)
                ),
                listeners,
                handler_nursery=nursery,
            )
        )
        log.info("dashboard at http://%s:%d/", host if ":" not in host else f"[{host}]", bound)
        task_status.started(bound)


def parse_dashboard_args(argv: list[str], env: Mapping[str, str]) -> argparse.Namespace:
    p = Parser(
        prog="akri-trio dashboard",
        description="A live page of Configurations, nodes, Instances, slots and their Pods, "
        "and brokers: / is the page, /ws the websocket feeding it. Read-only.",
    )
    add_picture_arguments(p, env)
    add_env_argument(
        p,
        "--host",
        env=env,
        var="AKRI_DASHBOARD_HOST",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    add_env_argument(
        p,
        "--port",
        env=env,
        var="AKRI_DASHBOARD_PORT",
        type=int,
        default=8090,
        help="port; 0 picks a free one, logged",
    )
    add_env_argument(
        p,
        "--allowed-host",
        env=env,
        var="AKRI_DASHBOARD_ALLOWED_HOSTS",
        from_env=comma_list,
        action="append",
        dest="allowed_hosts",
        default=[],
        metavar="HOST:PORT",
        help="another Host the page is reached by, as the browser sends it (a name, a "
        "port-forward's local port; repeatable; the env var takes a list). Always served: "
        "127.0.0.1, localhost, [::1] and --host, with --port",
    )
    add_log_arguments(p, env)
    return p.parse_args(argv)


async def _dashboard(config: KubeConfig, args: argparse.Namespace) -> None:
    async with Client.open(config) as api:
        await run_dashboard(
            api, args.namespace, args.host, args.port, allowed_hosts=args.allowed_hosts
        )


def dashboard_main(argv: list[str]) -> int:
    args = parse_dashboard_args(argv, os.environ)
    setup_logging(args.log_level, args.log_format)
    try:
        config = load_config(args.kubeconfig, context=args.context)
    except ConfigError as exc:
        hint = "hint: --kubeconfig FILE or KUBECONFIG"
        print(f"akri-trio dashboard: {exc} ({hint})", file=sys.stderr)
        return 1
    log_startup(log, "dashboard", vars(args))
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run_until_signalled, functools.partial(_dashboard, config, args), log)
    return 0
