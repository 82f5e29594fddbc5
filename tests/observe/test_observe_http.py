"""The observe endpoint over real loopback sockets: routes, readiness, abuse and shutdown.

Deadline tests use `autojump_clock` with real sockets. That is sound here because loopback
delivery happens inside the sender's syscall: by the time every task is blocked, any data in
flight is already readable, so trio's I/O poll sees it before the mock clock is allowed to jump.
The clock then only jumps when the silent client is truly silent, straight to the deadline.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import Counter, Gauge

from akri_trio.observe.endpoints import (
    Readiness,
    evaluate_readiness,
    handle_connection,
    route,
    serve_observe,
)
from akri_trio.observe.metrics import CONTENT_TYPE, Registry, render

HOST = "127.0.0.1"


@asynccontextmanager
async def running(
    registry: Registry | None = None, ready: Readiness = (), request_timeout: float = 10.0
) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            functools.partial(
                serve_observe,
                HOST,
                0,
                registry=registry or Registry(),
                ready=ready,
                request_timeout=request_timeout,
            )
        )
        yield port
        nursery.cancel_scope.cancel()


def client(port: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://{HOST}:{port}")


async def read_until_eof(stream: trio.abc.ReceiveStream) -> bytes:
    chunks = []
    while chunk := await stream.receive_some():
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------
# Pure core


def test_route_table() -> None:
    reg = Registry()
    assert route("GET", "/healthz", registry=reg, ready=()).status == 200
    assert route("GET", "/metrics?name[]=x", registry=reg, ready=()).status == 200
    assert route("GET", "/metricsx", registry=reg, ready=()).status == 404
    assert route("DELETE", "/nope", registry=reg, ready=()).status == 404
    reply = route("PUT", "/readyz", registry=reg, ready=())
    assert (reply.status, reply.headers) == (405, (("allow", "GET, HEAD"),))


def test_readiness_named_checks_name_the_failures() -> None:
    def broken() -> bool:
        raise RuntimeError("store gone")

    ok, body = evaluate_readiness(
        {"informers": lambda: True, "discovery": lambda: False, "store": broken}
    )
    assert not ok
    assert body == (
        "[+]informers ok\n"
        "[-]discovery failed\n"
        "[-]store failed: RuntimeError('store gone')\n"
        "not ready: discovery, store\n"
    )
    assert evaluate_readiness([("a", lambda: True)]) == (True, "[+]a ok\nok\n")
    assert evaluate_readiness(()) == (True, "ok\n")


def test_readiness_single_callable() -> None:
    assert evaluate_readiness(lambda: (False, "waiting for kubelet")) == (
        False,
        "waiting for kubelet\n",
    )
    assert evaluate_readiness(lambda: (True, "")) == (True, "ok\n")


# ---------------------------------------------------------------------------------------------
# Endpoints over loopback


async def test_healthz_and_metrics() -> None:
    reg = Registry()
    Counter("akri_scrapes_total", "Scrapes.", registry=reg).inc(7)
    async with running(reg) as port, client(port) as http:
        health = await http.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok\n")
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"] == CONTENT_TYPE
        assert metrics.content == render(reg)
        assert "akri_scrapes_total 7.0\n" in metrics.text


async def test_readiness_flips_from_503_to_200() -> None:
    synced = False
    checks = {"informers-synced": lambda: synced, "always": lambda: True}
    async with running(ready=checks) as port, client(port) as http:
        before = await http.get("/readyz")
        assert before.status_code == 503
        assert "[-]informers-synced failed" in before.text
        assert before.text.endswith("not ready: informers-synced\n")
        synced = True
        after = await http.get("/readyz")
        assert after.status_code == 200
        assert after.text.endswith("ok\n")


async def test_404_405_and_head() -> None:
    async with running() as port, client(port) as http:
        assert (await http.get("/")).status_code == 404
        assert (await http.get("/metrics/extra")).status_code == 404
        post = await http.post("/metrics", content=b"x" * 10)
        assert post.status_code == 405
        assert post.headers["allow"] == "GET, HEAD"
        head = await http.head("/healthz")
        assert head.status_code == 200
        assert head.headers["content-length"] == "3"
        assert head.content == b""
        # The same client (kept-alive connection) still works after the 405 and the HEAD.
        assert (await http.get("/healthz")).status_code == 200


async def test_broken_metrics_callback_is_a_500_and_the_server_carries_on() -> None:
    reg = Registry()
    Gauge("bad", "h", registry=reg).set_function(lambda: 1 / 0)
    async with running(reg) as port, client(port) as http:
        assert (await http.get("/metrics")).status_code == 500
        assert (await http.get("/healthz")).status_code == 200


async def test_pipelined_requests_on_one_connection_are_answered_in_order() -> None:
    async with running() as port:
        stream = await trio.open_tcp_stream(HOST, port)
        await stream.send_all(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        raw = await read_until_eof(stream)
        # Bodies end in "\n" without "\r\n", so the status lines are found by pattern.
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", raw) == [b"200", b"404", b"200"]


async def test_many_concurrent_clients() -> None:
    async with running() as port, client(port) as http:
        results: list[int] = []

        async def one() -> None:
            results.append((await http.get("/healthz")).status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(one)
        assert results == [200] * 50


# ---------------------------------------------------------------------------------------------
# Abuse


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET /healthz HTTP/1.1\r\n\r\n", b"400"),  # HTTP/1.1 requires Host
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"400"),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100_000 + b"\r\n\r\n", b"431"),
    ],
)
async def test_malformed_request_gets_an_error_and_the_server_keeps_serving(
    request_bytes: bytes, status: bytes
) -> None:
    async with running() as port:
        stream = await trio.open_tcp_stream(HOST, port)
        await stream.send_all(request_bytes)
        await stream.send_eof()
        raw = await read_until_eof(stream)
        assert raw.split(b" ", 2)[:2] == [b"HTTP/1.1", status]
        assert b"connection: close" in raw.lower()
        async with client(port) as http:
            assert (await http.get("/healthz")).status_code == 200


async def test_peer_vanishing_mid_request_does_not_crash_the_server() -> None:
    async with running() as port:
        stream = await trio.open_tcp_stream(HOST, port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHo")
        await stream.aclose()
        async with client(port) as http:
            assert (await http.get("/healthz")).status_code == 200


async def test_silent_client_is_dropped_at_the_deadline_while_others_are_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(request_timeout=10) as port:
        silent = await trio.open_tcp_stream(HOST, port)
        start = trio.current_time()
        # Just before the deadline the connection is still open: no data, no EOF.
        with trio.move_on_after(9.5) as before:
            await silent.receive_some()
        assert before.cancelled_caught
        # A silent connection does not block anybody else.
        probe = await trio.open_tcp_stream(HOST, port)
        await probe.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await read_until_eof(probe)).startswith(b"HTTP/1.1 200 ")
        with trio.fail_after(60):  # a missing deadline fails here instead of hanging
            assert await silent.receive_some() == b""
        assert trio.current_time() - start == pytest.approx(10)


async def test_the_deadline_covers_the_whole_request_not_each_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(request_timeout=10) as port:
        slow = await trio.open_tcp_stream(HOST, port)
        start = trio.current_time()
        closed_at = None
        # A byte every 3 s would reset an idle timer forever; the request deadline still fires.
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n":
            try:
                await slow.send_all(bytes([byte]))
            except trio.BrokenResourceError:
                closed_at = trio.current_time()
                break
            with trio.move_on_after(3):
                if await slow.receive_some() == b"":
                    closed_at = trio.current_time()
                    break
        assert closed_at is not None
        assert closed_at - start == pytest.approx(10, abs=0.01)


async def test_keep_alive_connection_idle_between_requests_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(request_timeout=5) as port:
        stream = await trio.open_tcp_stream(HOST, port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await stream.receive_some()
        assert first.startswith(b"HTTP/1.1 200 ")
        answered = trio.current_time()
        with trio.fail_after(60):
            assert await stream.receive_some() == b""
        assert trio.current_time() - answered == pytest.approx(5)


async def test_handle_connection_on_a_memory_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server_side, client_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(
                handle_connection,
                server_side,
                registry=Registry(),
                ready=lambda: (False, "nope"),
                request_timeout=1,
            )
        )
        await client_side.send_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(60):
            reply = await read_until_eof(client_side)  # answered, then dropped idle after 1 s
    assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert reply.endswith(b"\r\n\r\nnope\n")


# ---------------------------------------------------------------------------------------------
# Shutdown


async def test_cancellation_closes_the_listener_and_open_connections() -> None:
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            functools.partial(serve_observe, HOST, 0, registry=Registry())
        )
        idle = await trio.open_tcp_stream(HOST, port)
        await idle.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await idle.receive_some()).startswith(b"HTTP/1.1 200 ")
        nursery.cancel_scope.cancel()
    assert await idle.receive_some() == b""
    with pytest.raises(OSError):
        await trio.open_tcp_stream(HOST, port)


async def test_a_taken_port_fails_before_reporting_started() -> None:
    async with running() as port, trio.open_nursery() as nursery:
        with pytest.raises(OSError, match="in use"):
            await nursery.start(functools.partial(serve_observe, HOST, port, registry=Registry()))


# ---------------------------------------------------------------------------------------------
# A connection flood at a low descriptor limit

FLOODED_SERVER = """
import resource, sys, trio
from akri_trio.observe.endpoints import serve_observe
from akri_trio.observe.metrics import Registry

resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

def can_open_files():
    # The process's own needs: 40 files at once.
    files = [open("/dev/null") for _ in range(40)]
    for f in files:
        f.close()
    return True

async def main():
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_observe(
            "127.0.0.1", 0, registry=Registry(), ready=[("files", can_open_files)],
            task_status=task_status))
        print(port, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_a_keep_alive_flood_never_takes_the_processs_descriptors() -> None:
    """At a 128-descriptor limit the cap is 32 (a quarter): 300 kept-alive connections leave
    the server able to accept /readyz and the process able to open 40 files for it."""
    async with trio.open_nursery() as nursery:
        proc = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-c", FLOODED_SERVER],
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        try:
            with trio.fail_after(60):
                assert proc.stdout is not None
                port = int((await proc.stdout.receive_some()).decode())
                held = []
                for _ in range(300):
                    stream = await trio.open_tcp_stream(HOST, port)
                    await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    held.append(stream)
                async with client(port) as http:
                    answer = await http.get("/readyz")
                assert (answer.status_code, answer.text) == (200, "[+]files ok\nok\n")
            for stream in held:
                await trio.aclose_forcefully(stream)
        finally:
            proc.kill()
