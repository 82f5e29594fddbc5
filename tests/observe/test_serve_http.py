"""`serve_http`'s options for servers that read request bodies (the admission webhook): the body
reaches the responder, a body over `max_body` is a 413 whether declared or chunked, a client
waiting for `100 Continue` gets it, and `max_connections` closes connections over the cap.

Deadline tests use `autojump_clock` with real loopback sockets, as in test_observe_http.py.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from akri_trio.observe.http import Reply, serve_http

HOST = "127.0.0.1"


def echo(method: str, target: str, body: bytes) -> Reply:
    return Reply(200, f"{method} {target} {len(body)}:".encode() + body)


@asynccontextmanager
async def running(
    *, max_body: int = 100, max_connections: int | None = None, request_timeout: float = 10.0
) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            functools.partial(
                serve_http,
                HOST,
                0,
                echo,
                name="test",
                request_timeout=request_timeout,
                max_body=max_body,
                max_connections=max_connections,
            )
        )
        yield port
        nursery.cancel_scope.cancel()


async def exchange(port: int, raw: bytes) -> bytes:
    stream = await trio.open_tcp_stream(HOST, port)
    await stream.send_all(raw)
    chunks = []
    with trio.fail_after(10):
        while chunk := await stream.receive_some():
            chunks.append(chunk)
    await stream.aclose()
    return b"".join(chunks)


def post(body: bytes, *headers: bytes) -> bytes:
    head = [b"POST /p HTTP/1.1", b"Host: x", b"Connection: close", *headers]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def test_the_body_reaches_the_responder() -> None:
    async with running() as port:
        raw = await exchange(port, post(b"hello", b"Content-Length: 5"))
    assert raw.startswith(b"HTTP/1.1 200 ")
    assert raw.endswith(b"\r\n\r\nPOST /p 5:hello")


async def test_chunked_body_is_reassembled() -> None:
    async with running() as port:
        raw = await exchange(
            port, post(b"3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n", b"Transfer-Encoding: chunked")
        )
    assert raw.endswith(b"\r\n\r\nPOST /p 5:hello")


@pytest.mark.parametrize(
    "request_bytes",
    [
        post(b"", b"Content-Length: 101"),  # refused on the declared length, before any body
        post(2 * (b"40\r\n" + b"a" * 64 + b"\r\n"), b"Transfer-Encoding: chunked"),
    ],
    ids=["declared", "chunked"],
)
async def test_body_over_the_limit_is_a_413(request_bytes: bytes) -> None:
    async with running(max_body=100) as port:
        stream = await trio.open_tcp_stream(HOST, port)
        await stream.send_all(request_bytes)
        await stream.send_eof()
        chunks = []
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                chunks.append(chunk)
    raw = b"".join(chunks)
    assert raw.startswith(b"HTTP/1.1 413 Content Too Large\r\n")
    assert b"connection: close" in raw.lower()
    assert raw.endswith(b"request body over 100 bytes\n")


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    async with running() as port:
        stream = await trio.open_tcp_stream(HOST, port)
        await stream.send_all(post(b"", b"Content-Length: 2", b"Expect: 100-continue"))
        with trio.fail_after(10):
            interim = await stream.receive_some()
        assert interim.startswith(b"HTTP/1.1 100 ")
        await stream.send_all(b"ok")
        chunks = []
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                chunks.append(chunk)
    assert b"".join(chunks).endswith(b"POST /p 2:ok")


async def test_connections_over_the_cap_are_closed_until_a_slot_frees(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_connections=2, request_timeout=5) as port:
        idle = [await trio.open_tcp_stream(HOST, port) for _ in range(2)]
        extra = await trio.open_tcp_stream(HOST, port)
        start = trio.current_time()
        with trio.fail_after(1):
            assert await extra.receive_some() == b""  # closed at once, unanswered
        assert trio.current_time() == pytest.approx(start)
        # The idle ones are dropped at the deadline; then there is room again.
        with trio.fail_after(60):
            for stream in idle:
                assert await stream.receive_some() == b""
        raw = await exchange(port, post(b"", b"Content-Length: 0"))
        assert raw.startswith(b"HTTP/1.1 200 ")
