"""`serve_http`'s options for servers that read request bodies (the admission webhook): the body
reaches the responder, a body over `max_body` is a 413 whether declared or chunked, a client
waiting for `100 Continue` gets it, and a connection over `max_connections` takes the place of
the one idle longest, else of the request started first.

Deadline tests use `autojump_clock` with real loopback sockets, as in test_observe_http.py.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from akri_trio.runtime.http import (
    DEFAULT_MAX_CONNECTIONS,
    Reply,
    connection_cap,
    evictee,
    serve_http,
)

HOST = "127.0.0.1"


def echo(method: str, target: str, body: bytes) -> Reply:
    return Reply(200, f"{method} {target} {len(body)}:".encode() + body)


@asynccontextmanager
async def running(
    *,
    max_body: int = 100,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    request_timeout: float = 10.0,
    idle_timeout: float | None = None,
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
                idle_timeout=idle_timeout,
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


async def test_a_connection_over_the_cap_takes_the_place_of_the_one_idle_longest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_connections=2, request_timeout=5) as port:
        oldest = await trio.open_tcp_stream(HOST, port)
        await trio.sleep(1)
        newer = await trio.open_tcp_stream(HOST, port)
        await trio.sleep(1)
        start = trio.current_time()
        raw = await exchange(port, post(b"", b"Content-Length: 0"))
        assert raw.startswith(b"HTTP/1.1 200 ")
        with trio.fail_after(1):
            assert await oldest.receive_some() == b""  # closed at once for the newcomer
        assert trio.current_time() == pytest.approx(start)
        with trio.move_on_after(2):
            await newer.receive_some()
            pytest.fail("the newer idle connection was closed too")


async def test_with_none_idle_the_request_started_first_gives_way(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_connections=2, request_timeout=5) as port:
        slow = []
        for _ in range(2):
            stream = await trio.open_tcp_stream(HOST, port)
            await stream.send_all(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab")
            slow.append(stream)
            await trio.sleep(1)
        raw = await exchange(port, post(b"", b"Content-Length: 0"))
        assert raw.startswith(b"HTTP/1.1 200 ")
        with trio.fail_after(1):
            assert await slow[0].receive_some() == b""
        with trio.move_on_after(2):
            await slow[1].receive_some()
            pytest.fail("the younger slow request was closed too")


def test_evictee_is_the_one_idle_longest_else_the_oldest_request() -> None:
    assert evictee({}) is None
    assert evictee({"a": (False, 1.0), "b": (True, 5.0), "c": (True, 3.0)}) == "c"
    assert evictee({"a": (False, 4.0), "b": (False, 2.0)}) == "b"


@pytest.mark.parametrize(
    ("requested", "fd_limit", "cap"),
    [(64, 1024, 64), (1000, 1024, 256), (64, 128, 32), (64, 2, 1), (64, -1, 64), (5, 0, 5)],
)
def test_the_cap_is_at_most_a_quarter_of_the_fd_limit(
    requested: int, fd_limit: int, cap: int
) -> None:
    assert connection_cap(requested, fd_limit) == cap


async def test_a_kept_alive_connection_is_closed_at_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(request_timeout=10, idle_timeout=2) as port:
        stream = await trio.open_tcp_stream(HOST, port)
        await stream.send_all(b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await stream.receive_some()).startswith(b"HTTP/1.1 200 ")
        answered = trio.current_time()
        with trio.fail_after(60):
            assert await stream.receive_some() == b""
        assert trio.current_time() - answered == pytest.approx(2)
