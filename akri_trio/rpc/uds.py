"""gRPC over Unix domain sockets (and TCP) with purerpc on trio: servers, channels, and fixes.

Akri's agent speaks gRPC on Unix sockets in both directions: it serves the discovery-handler
Registration socket and one DevicePlugin socket per resource (the kubelet dials in), and it calls
the kubelet's Registration and PodResources sockets and the handlers' Discover streams. purerpc
is the only pure-Python gRPC stack that runs on trio, but 0.8.0 (pinned exactly for this module)
serves TCP only and has bugs that matter here. Everything that touches purerpc's internals is in
this one module; see research/stack.md §2 and research/real-k8s.md §8 for the measurements.

Patches to purerpc, applied once at import (idempotent; `_PATCH_MARK` guards re-application;
the letters are shared with the glue below):

(a) `SocketWrapper._set_socket_options` sets TCP options unconditionally, which fail with
    EOPNOTSUPP on AF_UNIX: skipped for Unix sockets.
(b) `GRPCConnection._stream_reset` drops RST_STREAM on the floor: it now calls the connection's
    `on_stream_reset(stream_id, error_code, reason="")` hook when one is set (only our server
    and client set one; purerpc's own classes behave as before; (h) calls it too). The server
    cancels that stream's handler (or never starts it, when the reset came in the batch that
    opened the stream); the client ends the call with a status, in order with the batch's
    other events.
(e) purerpc's server catches everything with bare `except:` and logs "Got exception ..." at
    WARNING even for trio's `Cancelled`, i.e. every time we cancel a handler on purpose: a
    filter on the `purerpc.server` logger drops exactly those records; real errors still log.
(h) A message marked compressed (`grpc-encoding: gzip` / `deflate`) is inflated with a bound:
    purerpc checked only the compressed size and then inflated without limit (a 0.5 MB
    message made 1.6 GiB). `inflate_bounded` stops at the same limit as an uncompressed
    message (`MAX_MESSAGE_BYTES`); such a message, an uncompressed one over the limit, an
    encoding we do not know and corrupt compressed data all end that one stream with
    RST_STREAM(ENHANCE_YOUR_CALM), which gRPC clients report as RESOURCE_EXHAUSTED, instead of
    failing the whole connection. The flow-control credit of the discarded bytes is returned.
    Our side never compresses (nor advertises an encoding), and neither the kubelet nor grpcio
    compress unless asked to.
(i) `GRPCConnection._stream_ended` now tells the server (`on_request_ended(stream_id)`, when
    set) that a call's request is complete, so a call whose request never completes can be
    timed out ((g) below).
(j) purerpc advertises, and h2 enforces, 65,536 concurrent streams per connection, and h2 ends
    the whole connection (GOAWAY) when a peer opens one more. Our servers advertise their
    `ServerLimits.max_streams` (`--grpc-max-streams`, default `MAX_CONCURRENT_STREAMS`) as
    SETTINGS_MAX_CONCURRENT_STREAMS (well-behaved clients such as grpcio queue their calls past
    it) and refuse a stream past it with RST_STREAM(REFUSED_STREAM) (RFC 9113 §5.1.2), which
    gRPC clients report as UNAVAILABLE; the connection and its other calls carry on. One
    connection thus holds at most that many calls' tasks.

Glue (subclasses, not patches):

(b) The server's connection handler runs each stream in its own cancel scope, cancelled on
    RST_STREAM and on connection EOF, so a parked server-streaming generator (ListAndWatch,
    Discover) runs its `finally` at once instead of at its next `yield`. The kubelet never sends
    RST_STREAM; it just drops the connection, so the EOF path is the one that matters.
(c) Per-connection errors arrive wrapped in ExceptionGroups (anyio 4 / trio strict groups):
    `except*` keeps one broken connection (EPIPE, BrokenResourceError) from ever taking the
    listener down.
(d) purerpc's channel never closes the socket it opens (one fd leaked per channel): ours do.
(f) On the client, purerpc leaves a call waiting forever when the server goes away mid-call
    (EOF) or resets the stream: our channels end such calls with UNAVAILABLE / CANCELLED, so
    the agent notices a dead discovery handler instead of hanging on its Discover stream.
(g) Anything may connect to a socket we serve. A peer that does not speak HTTP/2 (or breaks
    its rules) costs one log line, not a traceback; a connection with no call in progress
    for `ServerLimits.idle_timeout` seconds (default IDLE_TIMEOUT_S; never while a stream is
    open, so a
    kubelet's ListAndWatch or an agent's Discover stream is untouched) is closed, so idle or
    half-open connections cannot pile up. A call whose request has not fully arrived within
    `idle_timeout` of its opening (a peer that opens a stream and then stalls) is ended with
    RST_STREAM(CANCEL): every method we serve takes one request message, so a live client
    sends it at once; a stream past its request (ListAndWatch, Discover) is never timed out.
    Each server is given its `ServerLimits` (the agent's and the discovery handlers'
    `--grpc-idle-timeout` and `--grpc-max-streams`, passed down to every server they start);
    nothing about them is process-wide.

A purerpc `Server`'s service context managers can be entered only once, so every (re)serve
builds a fresh one (`make_server`); `serve_unix` / `serve_tcp` do that themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import os
import secrets
import socket
import stat
import sys
import zlib
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Protocol, Self
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h2.exceptions
import purerpc
import trio
from h2.connection import AllowedStreamIDs, HeadersFrame  # h2 3.x has no types
from h2.errors import ErrorCodes
from purerpc import grpc_socket
from purerpc.client import _Channel
from purerpc.grpc_proto import GRPCProtoSocket
from purerpc.grpc_socket import GRPCStreamState
from purerpc.grpclib import connection as grpc_connection_module
from purerpc.grpclib.buffers import MessageReadBuffer
from purerpc.grpclib.config import GRPCConfiguration
from purerpc.grpclib.connection import GRPCConnection
from purerpc.grpclib.events import MessageReceived, RequestReceived, ResponseEnded, WindowUpdated
from purerpc.grpclib.exceptions import (
    MessageTooLargeError,
    ProtocolError,
    UnsupportedMessageEncodingError,
)
from purerpc.server import ConnectionHandler

from akri_trio.flaghelp import add_env_argument

log = logging.getLogger(__name__)

PURERPC_VERSION = "0.8.0"
_PATCH_MARK = "_akri_trio_patched"

# Errors that mean "this connection is gone"; anything else on a connection is logged loudly.
_CONNECTION_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
# accept() failures that mean "out of resources right now": back off instead of dying (as
# trio.serve_listeners does).
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_BACKOFF_S = 0.1
# A connection without any call in progress is closed after this long; a call whose request
# has not arrived this long after it opened is reset (the default `ServerLimits.idle_timeout`).
IDLE_TIMEOUT_S = 300.0
# Calls one connection to our servers may have open at once ((j) above): the kubelet holds a
# ListAndWatch and a few Allocates on a plugin's socket, the agent one Discover stream per
# connection, so no legitimate client comes near it (the default `ServerLimits.max_streams`).
MAX_CONCURRENT_STREAMS: Final = 128
# The largest gRPC message read, before and after decompression: purerpc's limit (32 MiB).
MAX_MESSAGE_BYTES: int = GRPCConfiguration(client_side=False).max_message_length


def add_server_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """`--grpc-idle-timeout` (env AKRI_GRPC_IDLE_TIMEOUT) and `--grpc-max-streams` (env
    AKRI_GRPC_MAX_STREAMS), for every command serving gRPC; `ServerLimits.of(args)` reads them."""
    add_env_argument(
        parser,
        "--grpc-idle-timeout",
        env=env,
        var="AKRI_GRPC_IDLE_TIMEOUT",
        type=_positive_seconds,
        default=IDLE_TIMEOUT_S,
        metavar="SECONDS",
        help="close a gRPC connection to our sockets without a call in progress, and reset a "
        "call whose request has not arrived, after this long",
    )
    add_env_argument(
        parser,
        "--grpc-max-streams",
        env=env,
        var="AKRI_GRPC_MAX_STREAMS",
        type=_positive_int,
        default=MAX_CONCURRENT_STREAMS,
        metavar="N",
        help="calls one gRPC connection to our sockets may have open at once (HTTP/2 "
        "SETTINGS_MAX_CONCURRENT_STREAMS); one more is refused, the connection goes on",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


@dataclass(frozen=True)
class ServerLimits:
    """What one of our gRPC servers allows each connection: `idle_timeout` seconds without a
    call in progress (or for a call's request to arrive), `max_streams` calls open at once."""

    idle_timeout: float = IDLE_TIMEOUT_S
    max_streams: int = MAX_CONCURRENT_STREAMS

    def __post_init__(self) -> None:
        if not self.idle_timeout > 0:
            raise ValueError(f"the gRPC idle timeout must be positive, got {self.idle_timeout!r}")
        if self.max_streams < 1:
            raise ValueError(
                f"the gRPC calls per connection must be at least 1, got {self.max_streams!r}"
            )

    @classmethod
    def of(cls, args: argparse.Namespace) -> ServerLimits:
        """From the flags `add_server_arguments` added."""
        return cls(args.grpc_idle_timeout, args.grpc_max_streams)


DEFAULT_LIMITS: Final = ServerLimits()


# Connections one server handles at once; more are closed as soon as accepted. Each costs the
# event loop a task, so a flood of them must not become thousands of tasks run in one batch.
MAX_CONNECTIONS = 64
# A peer that is not a gRPC client (or a broken one): said in one line, no traceback.
_PROTOCOL_ERRORS = (h2.exceptions.H2Error, ProtocolError)


# ---- (a), (b), (e): patches, once -------------------------------------------------------------


def _is_cancellation(exc: BaseException | None) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_cancellation(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)


class _DropCancelledWarnings(logging.Filter):
    """Drop purerpc.server's records logged while handling a cancellation (they are logged
    from inside bare `except:` blocks, so the exception in flight tells them apart). That
    includes errors raised *during* the cancellation, e.g. h2's StreamClosedError when purerpc
    tries to send trailers on a stream the client has just reset."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else sys.exception()
        while exc is not None:
            if _is_cancellation(exc):
                return False
            exc = exc.__context__
        return True


class CorruptMessageError(ProtocolError):  # type: ignore[misc]  # purerpc is untyped
    """Compressed data that does not inflate."""


def inflate_bounded(data: bytes, encoding: str | None, limit: int) -> bytes:
    """A compressed gRPC message's payload, inflated to at most `limit` bytes.

    gzip and deflate (zlib-wrapped, as gRPC means it) are told apart by their header. Raises
    MessageTooLargeError past `limit` (never inflating more than `limit + 1` bytes),
    UnsupportedMessageEncodingError for another encoding, CorruptMessageError for data that
    is not one whole compressed stream.
    """
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMessageEncodingError(f"unsupported grpc-encoding {encoding!r}")
    inflater = zlib.decompressobj(wbits=32 + zlib.MAX_WBITS)  # zlib or gzip header
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise CorruptMessageError(f"bad {encoding} data: {exc}") from None
    if len(out) > limit:
        raise MessageTooLargeError(
            f"{encoding} message inflates past the limit of {limit} bytes "
            f"({len(data)} bytes compressed)"
        )
    if not inflater.eof or inflater.unused_data:
        raise CorruptMessageError(f"bad {encoding} data: not one whole compressed stream")
    return out


class _BoundedReadBuffer(MessageReadBuffer):  # type: ignore[misc]  # purerpc is untyped
    """purerpc's per-stream message parser with a bounded inflater, counting the flow-control
    credit it holds (received, not yet handed on as a message) so a refusal can return it."""

    def __init__(self, message_encoding: str | None = None, max_message_length: int = 0) -> None:
        super().__init__(message_encoding, max_message_length)
        self.credit_held = 0

    def data_received(self, data: bytes, flow_controlled_length: int | None = None) -> None:
        self.credit_held += len(data) if flow_controlled_length is None else flow_controlled_length
        super().data_received(data, flow_controlled_length)

    def decompress(self, data: bytes) -> bytes:
        return inflate_bounded(data, self._message_encoding, self._max_message_length)

    def read_all_complete_messages_flowcontrol(self) -> Any:
        messages = super().read_all_complete_messages_flowcontrol()
        self.credit_held -= sum(length for _, length in messages)
        return messages


def _refuse_stream(conn: GRPCConnection, stream_id: int, reason: str) -> list[Any]:
    """End one stream whose message we will not read; the connection carries on."""
    buffer = conn.message_read_buffers.pop(stream_id, None)
    credit = buffer.credit_held if isinstance(buffer, _BoundedReadBuffer) else 0
    log.warning("refused a gRPC message on stream %d: %s", stream_id, reason)
    conn.reset_stream(stream_id, ErrorCodes.ENHANCE_YOUR_CALM)
    if credit:
        conn.acknowledge_received_data(stream_id, credit)  # the connection's window
    hook = getattr(conn, "on_stream_reset", None)
    if hook is None:
        return []
    return list(hook(stream_id, ErrorCodes.ENHANCE_YOUR_CALM, f"message refused: {reason}") or ())


def _refuse_streams_past_the_limit(h2c: Any) -> None:
    """Make a server's h2 connection refuse a stream past its MAX_CONCURRENT_STREAMS with
    RST_STREAM(REFUSED_STREAM) instead of ending the connection ((j) above)."""
    receive_headers = h2c._frame_dispatch_table[HeadersFrame]

    def receive(frame: Any) -> tuple[list[Any], list[Any]]:
        limit = h2c.local_settings.max_concurrent_streams
        if frame.stream_id in h2c.streams or h2c.open_inbound_streams < limit:
            return receive_headers(frame)  # type: ignore[no-any-return]
        # Opened first, so h2 reads the headers as usual (the HPACK state both sides share
        # stays in step), then refused; the call's events never reach purerpc.
        h2c._begin_new_stream(frame.stream_id, AllowedStreamIDs.ODD)
        frames, _events = receive_headers(frame)
        h2c.reset_stream(frame.stream_id, ErrorCodes.REFUSED_STREAM)
        log.debug("refused gRPC stream %d: %d calls already open", frame.stream_id, limit)
        return frames, []

    h2c._frame_dispatch_table[HeadersFrame] = receive


def _apply_patches() -> None:
    if getattr(GRPCConnection, _PATCH_MARK, False):
        return
    if purerpc.__version__ != PURERPC_VERSION:
        # The patches reach into private code; a different version must be re-checked by hand.
        raise ImportError(
            f"akri_trio.rpc.uds is written against purerpc {PURERPC_VERSION}, "
            f"found {purerpc.__version__}"
        )

    set_tcp_options = grpc_socket.SocketWrapper._set_socket_options

    def set_socket_options(stream: anyio.abc.SocketStream) -> None:
        if stream.extra(anyio.abc.SocketAttribute.family) != socket.AF_UNIX:
            set_tcp_options(stream)

    def stream_reset(self: GRPCConnection, event: Any) -> list[Any]:
        # The hook may return events to deliver in order with the rest of this batch.
        hook = getattr(self, "on_stream_reset", None)
        return list(hook(event.stream_id, event.error_code) or ()) if hook is not None else []

    def data_received(self: GRPCConnection, event: Any) -> list[Any]:
        buffer = self.message_read_buffers.get(event.stream_id)
        if buffer is None:  # no request/response headers on this stream: purerpc's answer
            self.h2_connection.reset_stream(event.stream_id, ErrorCodes.PROTOCOL_ERROR)
            return []
        try:
            buffer.data_received(event.data, event.flow_controlled_length)
        except ProtocolError as exc:
            return _refuse_stream(self, event.stream_id, str(exc))
        return [
            MessageReceived(event.stream_id, message, length)
            for message, length in buffer.read_all_complete_messages_flowcontrol()
        ]

    stream_ended = GRPCConnection._stream_ended

    def stream_ended_with_hook(self: GRPCConnection, event: Any) -> list[Any]:
        events: list[Any] = stream_ended(self, event)
        hook = getattr(self, "on_request_ended", None)
        if hook is not None and events:
            hook(event.stream_id)
        return events

    grpc_socket.SocketWrapper._set_socket_options = staticmethod(set_socket_options)
    GRPCConnection._stream_reset = stream_reset
    GRPCConnection._data_received = data_received
    GRPCConnection._stream_ended = stream_ended_with_hook
    grpc_connection_module.MessageReadBuffer = _BoundedReadBuffer
    logging.getLogger("purerpc.server").addFilter(_DropCancelledWarnings())
    setattr(GRPCConnection, _PATCH_MARK, True)


_apply_patches()


# ---- servers ----------------------------------------------------------------------------------


class HasService(Protocol):
    """What purerpc-generated servicers (`...Servicer` subclasses) provide."""

    @property
    def service(self) -> purerpc.Service: ...


def make_server(*servicers: HasService) -> purerpc.Server:
    """A fresh purerpc Server holding `servicers`: one per (re)serve, never reused."""
    server = purerpc.Server(port=0)
    for servicer in servicers:
        server.add_service(servicer.service)
    return server


class _ConnectionHandler(ConnectionHandler):  # type: ignore[misc]  # purerpc is untyped
    """purerpc's per-connection handler with per-stream cancellation, contained failures and
    an idle timeout."""

    def __init__(self, services: Any, server: Any, limits: ServerLimits) -> None:
        super().__init__(services, server)
        self.idle_timeout = limits.idle_timeout
        self.max_streams = limits.max_streams

    async def __call__(self, conn: anyio.abc.SocketStream) -> None:
        scopes: dict[int, trio.CancelScope] = {}
        # Per call until its request is complete: cancelled at the deadline (a stalled call).
        # The hook runs while purerpc parses, possibly before the call's task has started.
        awaiting_request: dict[int, trio.CancelScope] = {}
        request_complete: set[int] = set()
        # Stream ids only grow, so a reset of a stream above the last started one is a reset of
        # a call whose task has yet to start.
        last_started = 0
        reset_before_start: set[int] = set()
        idle = trio.CancelScope(deadline=trio.current_time() + self.idle_timeout)

        def on_stream_reset(stream_id: int, error_code: int, reason: str = "") -> None:
            scope = scopes.get(stream_id)
            if scope is not None:
                scope.cancel()
            elif stream_id > last_started:  # reset in the batch that opened it: never start it
                reset_before_start.add(stream_id)

        def on_request_ended(stream_id: int) -> None:
            stall = awaiting_request.pop(stream_id, None)
            if stall is None:
                request_complete.add(stream_id)
            else:
                stall.deadline = math.inf

        async def run_stream(stream: Any) -> None:
            nonlocal last_started
            sid = stream.stream_id
            last_started = max(last_started, sid)
            if sid in reset_before_start:
                reset_before_start.discard(sid)
                request_complete.discard(sid)
                return
            stall = trio.CancelScope(deadline=trio.current_time() + self.idle_timeout)
            with trio.CancelScope() as scope, stall:
                scopes[sid] = scope
                if sid in request_complete:
                    request_complete.discard(sid)
                    stall.deadline = math.inf
                else:
                    awaiting_request[sid] = stall
                idle.deadline = math.inf  # a call in progress: never idle
                try:
                    await self.request_received(stream)
                finally:
                    del scopes[sid]
                    awaiting_request.pop(sid, None)
                    if not scopes:
                        idle.deadline = trio.current_time() + self.idle_timeout
            # purerpc's handler swallows the Cancelled (bare except), so ask the scope.
            if stall.cancel_called:
                log.debug("reset a gRPC call whose request stalled for %.0f s", self.idle_timeout)
                with contextlib.suppress(h2.exceptions.H2Error):
                    grpc_conn._grpc_connection.reset_stream(sid, ErrorCodes.CANCEL)
                await grpc_conn._socket.flush()

        try:
            grpc_conn = GRPCProtoSocket(self.config, conn)
            # The connection's own limit, in its HTTP/2 settings before they are sent.
            grpc_conn._grpc_connection.MAX_CONCURRENT_STREAMS = self.max_streams
            grpc_conn._grpc_connection._set_h2_connection_local_settings()
            async with conn, grpc_conn:
                grpc_conn._grpc_connection.on_stream_reset = on_stream_reset
                grpc_conn._grpc_connection.on_request_ended = on_request_ended
                _refuse_streams_past_the_limit(grpc_conn._grpc_connection.h2_connection)
                with idle:
                    async with trio.open_nursery() as nursery:
                        async for stream in grpc_conn.listen():
                            nursery.start_soon(run_stream, stream)
                        # listen() ends on EOF: the peer is gone, so nobody awaits these.
                        nursery.cancel_scope.cancel()
                if idle.cancelled_caught:
                    log.debug("closed a gRPC connection idle for %.0f s", self.idle_timeout)
        except* _CONNECTION_ERRORS as group:
            log.debug("gRPC connection dropped: %r", group.exceptions)
        except* _PROTOCOL_ERRORS as group:
            log.warning("closed a connection that is not valid gRPC: %s", _first_line(group))
        except* Exception as group:
            log.warning("gRPC connection failed", exc_info=group)


def _first_line(group: BaseExceptionGroup[BaseException]) -> str:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    text = " ".join(str(leaf).split())[:200]
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__


async def _accept_forever(
    listener: anyio.abc.SocketListener,
    handle: Callable[[anyio.abc.SocketStream], Awaitable[None]],
) -> None:
    slots = trio.Semaphore(MAX_CONNECTIONS)

    async def handle_in_slot(conn: anyio.abc.SocketStream) -> None:
        try:
            await handle(conn)
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        while True:
            try:
                conn = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                    raise
                log.error("accept() failed, backing off: %s", exc)
                await trio.sleep(_ACCEPT_BACKOFF_S)
                continue
            try:
                slots.acquire_nowait()
            except trio.WouldBlock:
                log.debug("closed a gRPC connection: %d open", MAX_CONNECTIONS)
                await conn.aclose()
                continue
            nursery.start_soon(handle_in_slot, conn)


async def _serve(
    server: purerpc.Server, listener: anyio.abc.SocketListener, limits: ServerLimits
) -> None:
    async with AsyncExitStack() as stack:
        services = {
            name: await stack.enter_async_context(cm) for name, cm in server.services.items()
        }
        await _accept_forever(listener, _ConnectionHandler(services, server, limits))


def bind_unix_socket(path: Path, mode: int | None, backlog: int = 128) -> tuple[socket.socket, int]:
    """A listening AF_UNIX socket at `path`, replacing a stale socket file there, and the
    inode of its file (to tell it from a later replacement).

    The socket is bound under a temporary name in the same directory, chmod-ed, renamed over
    `path` and only then put into listening state: no client can ever connect to it with the
    wrong mode, and a stale file at `path` is replaced atomically. Anything at `path` that is
    not a socket is left alone (FileExistsError).
    """
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(errno.EEXIST, "exists and is not a socket", str(path))
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        tmp = path.parent / f".{secrets.token_hex(4)}.sock"
        sock.bind(os.fspath(tmp))
        try:
            if mode is not None:
                os.chmod(tmp, mode)
            inode = os.lstat(tmp).st_ino
            os.rename(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock, inode


def _remove_if_ours(path: Path, inode: int) -> None:
    # A newer server may already have replaced the file (a restart racing our exit): leave it.
    try:
        if os.lstat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass


async def serve_unix(
    path: str | os.PathLike[str],
    *servicers: HasService,
    mode: int | None = None,
    limits: ServerLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `servicers` over gRPC on a Unix socket at `path` until cancelled.

    Reports the socket's path through `task_status` once it accepts connections (use
    `await nursery.start(serve_unix, path, servicer)`; `functools.partial` for `mode`). A stale
    socket file at `path` is replaced; `mode` (e.g. 0o600) is in force before anyone can
    connect. The socket file is removed on the way out, cancellation included, unless someone
    else has replaced it meanwhile. Each call builds a fresh purerpc Server. A connection
    without a call in progress for `limits.idle_timeout` seconds is closed, and so is a call
    whose request has not arrived by then; one has at most `limits.max_streams` calls open.
    """
    sock_path = Path(path)
    server = make_server(*servicers)
    sock, inode = bind_unix_socket(sock_path, mode)
    try:
        listener = await anyio.abc.SocketListener.from_socket(sock)
    except BaseException:
        sock.close()
        _remove_if_ours(sock_path, inode)
        raise
    try:
        async with listener:
            task_status.started(sock_path)
            await _serve(server, listener, limits)
    finally:
        _remove_if_ours(sock_path, inode)


async def serve_tcp(
    host: str,
    port: int,
    *servicers: HasService,
    limits: ServerLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `servicers` over gRPC on TCP `host:port` (0 picks a free port) until cancelled.

    For discovery handlers registered as NETWORK endpoints. Reports the bound port through
    `task_status`. Same per-stream cancellation and failure containment as `serve_unix`.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = make_server(*servicers)
    sock = socket.create_server((host, port), family=family)
    try:
        listener = await anyio.abc.SocketListener.from_socket(sock)
    except BaseException:
        sock.close()
        raise
    async with listener:
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        await _serve(server, listener, limits)


# ---- clients ----------------------------------------------------------------------------------

# How a reset stream surfaces to the caller, as gRPC clients map it. Keys are HTTP/2 error
# codes (RFC 9113 §7): REFUSED_STREAM = 0x7, CANCEL = 0x8.
_RESET_STATUS = {
    0x7: purerpc.StatusCode.UNAVAILABLE,
    0x8: purerpc.StatusCode.CANCELLED,
    0xB: purerpc.StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
}


@dataclass(frozen=True)
class _Reset:
    """RST_STREAM as an event on the client's queue: ends that call, in order."""

    stream_id: int
    error_code: int
    message: str


_REMOTE_OPEN = (GRPCStreamState.OPEN, GRPCStreamState.HALF_CLOSED_LOCAL)


class _ClientSocket(GRPCProtoSocket):  # type: ignore[misc]  # purerpc is untyped
    """purerpc's client connection, ending open calls when the server goes away ((f) above).

    The read loop replaces purerpc's `_listen` on the client side: same dispatch, plus resets,
    and events for calls that already ended are dropped instead of raising KeyError.
    """

    def __init__(self, config: GRPCConfiguration, sock: anyio.abc.SocketStream) -> None:
        super().__init__(config, sock)
        self._grpc_connection.on_stream_reset = self._on_stream_reset

    @staticmethod
    def _on_stream_reset(stream_id: int, error_code: int, reason: str = "") -> list[_Reset]:
        message = reason or f"stream reset by the server (HTTP/2 error code {error_code})"
        return [_Reset(stream_id, error_code, message)]

    async def _read_responses(self) -> None:
        while True:
            try:
                data = await self._socket.recv(self._receive_buffer_size)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            events = self._grpc_connection.receive_data(data)
            await self._socket.flush()  # h2 may owe the server ACKs / window updates
            for event in events:
                if isinstance(event, WindowUpdated):
                    ids = list(self._streams) if event.stream_id == 0 else [event.stream_id]
                    for sid in ids:
                        if sid in self._streams:
                            await self._streams[sid]._set_flow_control_update()
                    continue
                if isinstance(event, RequestReceived):
                    raise ProtocolError("Received request on client end")
                stream = self._streams.get(event.stream_id)
                if stream is None or stream.state not in _REMOTE_OPEN:
                    continue  # e.g. RST_STREAM(NO_ERROR) after the trailers
                if isinstance(event, _Reset):
                    code = _RESET_STATUS.get(event.error_code, purerpc.StatusCode.INTERNAL)
                    event = ResponseEnded(event.stream_id, purerpc.Status(code, event.message))
                await stream._incoming_events[0].send(event)
                if isinstance(event, ResponseEnded):
                    stream._close_remote()

    async def _reader_thread(self) -> None:
        try:
            await self._read_responses()
        finally:
            # EOF (or our own exit): calls still waiting for an answer will never get one.
            status = purerpc.Status(purerpc.StatusCode.UNAVAILABLE, "connection closed")
            for sid, stream in list(self._streams.items()):
                if stream.state in _REMOTE_OPEN:
                    stream._incoming_events[0].send_nowait(ResponseEnded(sid, status))
                    stream._close_remote()


class _ClosingChannel(_Channel):  # type: ignore[misc]  # purerpc is untyped
    """purerpc's channel, but it closes the socket it opened ((d) above)."""

    async def _connect(self) -> anyio.abc.SocketStream:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await AsyncExitStack.__aenter__(self)
        try:
            sock = await self._connect()
            self.push_async_callback(sock.aclose)
            self._grpc_socket = await self.enter_async_context(
                _ClientSocket(GRPCConfiguration(client_side=True), sock)
            )
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        # purerpc's task group wraps whatever the body raised in an ExceptionGroup, together
        # with its own tasks' errors. Give callers one exception: the body's own (connection
        # errors beside it are incidental), or UnavailableError when the broken connection
        # interrupted the body. Anything else (a bug) stays a group.
        try:
            return bool(await super().__aexit__(exc_type, exc, tb))
        except BaseExceptionGroup as group:
            leaves = _leaves(group)
            if any(e is not exc and not isinstance(e, _CONNECTION_ERRORS) for e in leaves):
                raise
            if exc is not None and any(e is exc for e in leaves):
                raise exc from None
            if exc is None:
                return False  # every call in the body completed; the hang-up came after
            raise purerpc.UnavailableError(f"connection lost: {leaves[0]!r}") from group


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for e in group.exceptions
        for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    ]


class UnixChannel(_ClosingChannel):
    """A purerpc channel to a gRPC server on a Unix socket (the kubelet, a discovery handler).

    `async with UnixChannel(path) as channel: stub = XStub(channel)`. A missing socket raises
    FileNotFoundError from `__aenter__`. A failed call inside the block raises one exception,
    not a group: its status error (`purerpc.InvalidArgumentError`, ...), or
    `purerpc.UnavailableError` when the server went away mid-call.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # purerpc sends ":authority: localhost:0"; gRPC servers on sockets ignore it.
        super().__init__("localhost", 0)
        self.path = os.fspath(path)

    async def _connect(self) -> anyio.abc.SocketStream:
        return await anyio.connect_unix(self.path)


class TcpChannel(_ClosingChannel):
    """A purerpc channel over plain TCP (a discovery handler's NETWORK endpoint); no TLS."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)

    async def _connect(self) -> anyio.abc.SocketStream:
        return await anyio.connect_tcp(self._host, self._port)


@dataclass(frozen=True)
class UnixEndpoint:
    path: str


@dataclass(frozen=True)
class TcpEndpoint:
    host: str
    port: int


def parse_endpoint(endpoint: str) -> UnixEndpoint | TcpEndpoint:
    """Parse a gRPC endpoint as discovery handlers register it.

    Unix: `/abs/path`, `unix:///abs/path`, `unix:path`. TCP: `http://host:port`, `host:port`,
    `[v6addr]:port`. Raises ValueError for anything else, including `https://` (no TLS here).
    """
    if endpoint.startswith("/"):
        return UnixEndpoint(endpoint)
    if endpoint.startswith("unix:"):
        path = endpoint.removeprefix("unix:")
        if path.startswith("//"):
            path = path.removeprefix("//")
        if not path:
            raise ValueError(f"empty socket path in endpoint {endpoint!r}")
        return UnixEndpoint(path)
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"unsupported endpoint scheme {parts.scheme!r} in {endpoint!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in endpoint {endpoint!r}") from exc
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"expected http://host:port, got {endpoint!r}")
    return TcpEndpoint(parts.hostname, port)


def open_channel(endpoint: str | UnixEndpoint | TcpEndpoint) -> UnixChannel | TcpChannel:
    """The channel for an endpoint string (see `parse_endpoint`); enter it with `async with`."""
    target = parse_endpoint(endpoint) if isinstance(endpoint, str) else endpoint
    if isinstance(target, UnixEndpoint):
        return UnixChannel(target.path)
    return TcpChannel(target.host, target.port)
