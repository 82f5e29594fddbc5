"""A small HTTP/1.1 server on trio: the health/metrics endpoints and the admission webhook.

Kubelet probes, Prometheus scrapes and the API server's AdmissionReviews need a tiny HTTP server;
pulling in a web framework for a few routes is not worth it. h11 (already here as an httpx
dependency) does the protocol, so a malformed request is h11's to reject and ours only to answer
with 400. What to answer is the caller's pure function of (method, target, body) (`Respond`;
akri_trio.observe.endpoints routes /healthz, /readyz and /metrics); this shell only moves bytes.
`serve_http`, with TLS, a bounded request body and a cap on open connections, serves the
admission webhook (akri_trio.webhook.server) too.

The timeouts this module owns are protocol-level: a connection waiting for its next request
(a fresh one, or a kept-alive one between requests; a TLS handshake included) is closed after
`idle_timeout`, and each request/response exchange, from the request's first byte, must finish
within `request_timeout`. So a client that connects and says nothing, or dribbles a byte at a
time, cannot hold a connection (and its file descriptor) forever.

Open connections are capped per server (`ConnectionCap`), and the cap is never more than a
quarter of the process's file descriptor limit, so a flood of connections never leaves the
process unable to open its own files. A connection over the cap takes the place of one that is
idle (the one idle longest), else of the one whose request started first (a slow client's),
which is closed at once: clients that hold connections open, idle or dribbling, cannot lock
out the one that has something to ask (the API server's AdmissionReview); one that opens
connections faster than the cap turns over still leaves each request cap/rate seconds. Choosing
whom to close is a pure function (`evictee`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import resource
import ssl
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, Final, TypeAlias, TypeVar

import h11
import trio

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "ConnectionCap",
    "Reply",
    "Respond",
    "connection_cap",
    "evictee",
    "linger",
    "send_reply",
    "serve_connection",
    "serve_http",
]

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"
# Request heads are a line and a Host header; anything bigger is not one of our clients. h11
# checks the limit only while a head is incomplete, so a head is refused (431) once it exceeds
# this by up to one read; heads that arrive whole in one read may be a little larger.
MAX_HEAD_BYTES = 16 * 1024
RECEIVE_BYTES = 16 * 1024
# Connections per server when the caller does not say: Prometheus and the kubelet's probes need
# a few at once.
DEFAULT_MAX_CONNECTIONS: Final = 64
# A server holds at most this share of the process's file descriptor limit; the rest is the
# process's own (sockets, watches, files).
FD_SHARE: Final = 4

K = TypeVar("K", bound=Hashable)

_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
    505: b"HTTP Version Not Supported",
}


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()


# (method, target, body) -> the response; a pure function, called once per request.
Respond: TypeAlias = Callable[[str, str, bytes], Reply]


# --------------------------------------------------------------------------------------------
# Pure core


def connection_cap(requested: int, fd_limit: int) -> int:
    """The connections a server may hold: `requested`, but at most 1/FD_SHARE of `fd_limit`
    (the process's soft RLIMIT_NOFILE; <= 0 or RLIM_INFINITY: no bound from it), at least 1."""
    if fd_limit > 0 and fd_limit != resource.RLIM_INFINITY:
        requested = min(requested, fd_limit // FD_SHARE)
    return max(1, requested)


def evictee(connections: Mapping[K, tuple[bool, float]]) -> K | None:
    """Which open connection (key -> (idle, since when)) to close for a new one at the cap: the
    one idle longest, else the one whose request started first (None when there is none)."""
    if not connections:
        return None
    # False sorts first: idle ones before busy ones, then the oldest.
    return min(connections, key=lambda key: (not connections[key][0], connections[key][1]))


# --------------------------------------------------------------------------------------------
# I/O shell


@dataclasses.dataclass(eq=False)
class Activity:
    """What one connection is doing, for the cap: waiting for a request (idle) or busy with
    one, and since when."""

    idle: bool = True
    since: float = dataclasses.field(default_factory=trio.current_time)

    def mark(self, *, idle: bool) -> None:
        self.idle, self.since = idle, trio.current_time()


class ConnectionCap:
    """At most `limit` connections served at once (see the module docstring). That bounds what
    a flood of connections can take: file descriptors, and the memory of request bodies being
    read (`limit` x `max_body`)."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit = limit
        self.name = name
        self.open: dict[trio.CancelScope, Activity] = {}

    async def serve(
        self,
        handler: Callable[[trio.abc.Stream, Activity], Awaitable[None]],
        stream: trio.abc.Stream,
    ) -> None:
        if len(self.open) >= self.limit:
            states = {scope: (a.idle, a.since) for scope, a in self.open.items()}
            victim = evictee(states)
            if victim is not None:
                kind = "an idle" if self.open.pop(victim).idle else "the oldest busy"
                log.debug("%s: %d connections open; closing %s one", self.name, self.limit, kind)
                victim.cancel()
        activity = Activity()
        with trio.CancelScope() as scope:  # cancelled: evicted (the handler closes the stream)
            self.open[scope] = activity
            try:
                await handler(stream, activity)
            finally:
                self.open.pop(scope, None)


def fd_limit() -> int:
    """This process's soft limit on open file descriptors."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def serve_http(
    host: str | None,
    port: int,
    respond: Respond,
    *,
    name: str,
    request_timeout: float,
    idle_timeout: float | None = None,
    max_body: int = 0,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer requests with `respond` until cancelled; `task_status.started(bound_port)` once
    accepting (port 0 = any). With `ssl_context` it is HTTPS: the handshake happens while the
    connection is idle, before its first request. The timeouts and `max_body` are as in
    `serve_connection`; at most `connection_cap(max_connections, fd_limit())` connections are
    served at once (`ConnectionCap`).

    `host` None listens on every local address (IPv4 and IPv6), which needs a fixed port: with
    port 0 each address family would get a different one, and that is refused.

    Every connection is a task in this function's nursery, so cancelling the server closes the
    listener and every open connection before it returns.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        ports = {listener.socket.getsockname()[1] for listener in listeners}
        if len(ports) != 1:
            # port 0 on a name resolving to several addresses binds each to a different port.
            raise OSError(f"{host!r} port {port} bound several ports {sorted(ports)}")
        bound = ports.pop()
        served: list[trio.abc.Listener[Any]] = list(listeners)
        if ssl_context is not None:
            served = [trio.SSLListener(t, ssl_context, https_compatible=True) for t in listeners]
        cap = ConnectionCap(connection_cap(max_connections, fd_limit()), name)

        async def handler(stream: trio.abc.Stream, activity: Activity) -> None:
            await serve_connection(
                stream,
                respond,
                request_timeout=request_timeout,
                idle_timeout=idle_timeout,
                max_body=max_body,
                activity=activity,
            )

        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, functools.partial(cap.serve, handler), served)
            log.info("%s listening on %s:%d (at most %d connections)", name, host, bound, cap.limit)
            task_status.started(bound)
    finally:
        # serve_listeners closes them when it ran; this covers failing before it started.
        for listener in listeners:
            await trio.aclose_forcefully(listener)


async def serve_connection(
    stream: trio.abc.Stream,
    respond: Respond,
    *,
    request_timeout: float,
    idle_timeout: float | None = None,
    max_body: int = 0,
    activity: Activity | None = None,
) -> None:
    """Answer requests on one connection until it closes, errs or misses a deadline: the next
    request's first bytes must come within `idle_timeout` (None: `request_timeout`), and the
    exchange must end within `request_timeout` of them. `activity`, when given, is kept told
    whether the connection is idle or busy.

    `max_body` 0 answers as soon as a request's head is here and never reads a body; above 0
    the body is read first, and one longer than `max_body` bytes is answered with 413.
    Never raises an Exception: one bad client must not take the server's nursery down.
    """
    activity = activity or Activity()
    idle_for = request_timeout if idle_timeout is None else idle_timeout
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        while True:
            activity.mark(idle=True)
            if not conn.trailing_data[0]:  # no pipelined request already here: wait for one
                with trio.move_on_after(idle_for) as idle:
                    conn.receive_data(bytes(await stream.receive_some(RECEIVE_BYTES)))
                if idle.cancelled_caught:
                    log.debug("dropping connection: idle for %ss", idle_for)
                    return
            activity.mark(idle=False)
            with trio.move_on_after(request_timeout) as scope:
                keep_alive = await _exchange(conn, stream, respond, max_body)
            if scope.cancelled_caught:
                log.debug("dropping connection: no complete exchange in %ss", request_timeout)
                return
            if not keep_alive:
                return
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        pass  # the peer went away mid-exchange (or failed its TLS handshake); nothing to answer
    except Exception:
        log.exception("HTTP connection failed")
    finally:
        await trio.aclose_forcefully(stream)


class _TooLarge(Exception):
    pass


async def _exchange(
    conn: h11.Connection, stream: trio.abc.Stream, respond: Respond, max_body: int
) -> bool:
    """One request and its response; True if the connection may carry another."""
    try:
        received = await _receive_request(conn, stream, max_body)
    except (h11.RemoteProtocolError, _TooLarge) as exc:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return False
        if isinstance(exc, _TooLarge):
            error = Reply(413, f"request body over {max_body} bytes\n".encode())
        else:
            error = Reply(exc.error_status_hint, b"bad request\n")
        await send_reply(conn, stream, error, head=False)
        await linger(stream)
        return False
    if received is None:
        return False
    request, body = received
    method = request.method.decode("ascii", "replace")
    reply = respond(method, request.target.decode("ascii", "replace"), body)
    await send_reply(conn, stream, reply, head=method == "HEAD")
    # A client still sending a body (we read none) cannot be followed by a next request.
    if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
        return True
    await linger(stream)
    return False


async def _receive_request(
    conn: h11.Connection, stream: trio.abc.Stream, max_body: int
) -> tuple[h11.Request, bytes] | None:
    """The next request and its body (b"" unless `max_body`); None on EOF."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if request is not None and not max_body:
                # The head is complete but a body is still coming: answer without it.
                return request, b""
            conn.receive_data(bytes(await stream.receive_some(RECEIVE_BYTES)))
        elif isinstance(event, h11.Request):
            request = event
            if max_body:
                length = dict(event.headers).get(b"content-length", b"0")
                if int(length) > max_body:
                    raise _TooLarge
                if conn.they_are_waiting_for_100_continue:
                    go_on = conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                    assert go_on is not None
                    await stream.send_all(go_on)
        elif isinstance(event, h11.Data):
            if max_body:
                body += event.data
                if len(body) > max_body:  # a chunked body declares no length up front
                    raise _TooLarge
            # otherwise a body we do not need; keep draining what is buffered.
        elif isinstance(event, h11.EndOfMessage):
            return None if request is None else (request, bytes(body))
        else:
            # ConnectionClosed (clean EOF between requests), or PAUSED, which cannot happen
            # before start_next_cycle but would spin here forever if it did.
            return None if request is None else (request, bytes(body))


async def send_reply(
    conn: h11.Connection, stream: trio.abc.Stream, reply: Reply, *, head: bool
) -> None:
    headers = [
        ("content-type", reply.content_type),
        ("content-length", str(len(reply.body))),
        ("cache-control", "no-store"),
        *reply.headers,
    ]
    if reply.status >= 400 and reply.status not in (404, 405, 503):
        # After a protocol error the byte stream cannot be trusted for a next request.
        headers.append(("connection", "close"))
    reason = _REASONS.get(reply.status, b"")
    data = conn.send(h11.Response(status_code=reply.status, headers=headers, reason=reason))
    assert data is not None
    if not head:
        body = conn.send(h11.Data(data=reply.body))
        assert body is not None
        data += body
    end = conn.send(h11.EndOfMessage())
    assert end is not None
    await stream.send_all(data + end)


async def linger(stream: trio.abc.Stream) -> None:
    """Half-close, then discard input until the peer closes (bounded by the caller's deadline).

    Closing a socket with unread input makes the kernel send RST, which can destroy the
    response we just sent before the client reads it; a 400 the client never sees is useless.
    """
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()
    # TLS cannot half-close; a client told `connection: close` closes after reading anyway.
    while await stream.receive_some(RECEIVE_BYTES):
        pass
