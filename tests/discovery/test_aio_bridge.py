"""The asyncio bridge: results and errors cross over, trio cancellation reaches the asyncio task
and waits for it to unwind, one thread serves everyone, and the thread stops cleanly."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest
import trio

from akri_trio.discovery import aio_bridge
from akri_trio.discovery.aio_bridge import AioBridge, BridgeStopped


@pytest.fixture
def bridge() -> Iterator[AioBridge]:
    with AioBridge(name="test-aio-bridge") as b:
        yield b
    assert not b.running


async def test_result_and_exception_cross_over(bridge: AioBridge) -> None:
    async def answer() -> tuple[int, bool]:
        await asyncio.sleep(0.01)
        return threading.get_ident(), asyncio.get_running_loop().is_running()

    ident, running = await bridge.run(answer())
    assert running
    assert bridge.thread is not None and ident == bridge.thread.ident != threading.get_ident()

    async def refuse() -> None:
        # a real refused connection, as asyncua would meet it
        await asyncio.open_connection("127.0.0.1", _closed_port())

    with pytest.raises(ConnectionRefusedError):
        await bridge.run(refuse())


async def test_trio_cancel_cancels_task_and_waits_for_unwind(bridge: AioBridge) -> None:
    events: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        finally:
            await asyncio.sleep(0.05)  # an async cleanup, like closing a session
            events.append("unwound")

    start = trio.current_time()
    with trio.move_on_after(0.2) as scope:
        await bridge.run(slow())
    assert scope.cancelled_caught
    # the cleanup had finished before the cancellation reached us
    assert events == ["cancelled", "unwound"]
    assert 0.2 <= trio.current_time() - start < 1.0


async def test_unwind_wait_is_bounded() -> None:
    release = threading.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            await asyncio.to_thread(release.wait, 5)  # ignores its cancellation for a while

    with AioBridge(unwind_grace=0.2) as b:
        start = trio.current_time()
        with trio.move_on_after(0.1):
            await b.run(stubborn())
        assert 0.3 - 0.05 <= trio.current_time() - start < 1.5
        release.set()


async def test_concurrent_runs_share_one_thread(bridge: AioBridge) -> None:
    idents: set[int] = set()
    before = threading.active_count()

    async def where(delay: float) -> None:
        await asyncio.sleep(delay)
        idents.add(threading.get_ident())

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(bridge.run, where(0.01 * (i % 5)))
    assert len(idents) == 1
    assert threading.active_count() == before


async def test_stop_fails_pending_runs_and_restart_works() -> None:
    b = AioBridge()
    b.start()
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(100)

    async def stop_soon() -> None:
        await trio.to_thread.run_sync(started.wait)
        await trio.to_thread.run_sync(b.stop)

    with pytest.RaisesGroup(BridgeStopped):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_soon)
            await b.run(forever())
    assert not b.running

    async def one() -> int:
        return 1

    assert await b.run(one()) == 1  # a stopped bridge starts again on demand
    b.stop()
    b.stop()  # idempotent
    assert not b.running


async def test_shared_bridge_is_lazy_and_process_wide() -> None:
    async def ident() -> int:
        return threading.get_ident()

    first = await aio_bridge.run(ident())
    second = await aio_bridge.shared().run(ident())
    assert first == second
    assert aio_bridge.shared().running


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
async def test_idle_bridge_uses_no_cpu(bridge: AioBridge) -> None:
    async def nothing() -> None:
        return None

    await bridge.run(nothing())
    assert bridge.thread is not None and bridge.thread.native_id is not None
    stat = f"/proc/self/task/{bridge.thread.native_id}/stat"
    before = _cpu_ticks(stat)
    await trio.sleep(1.0)
    assert _cpu_ticks(stat) - before <= 1  # clock ticks (10 ms each): asleep in select


def _cpu_ticks(stat_path: str) -> int:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_run_outside_trio_is_not_supported_but_start_stop_are_sync() -> None:
    b = AioBridge()
    t0 = time.monotonic()
    b.start()
    b.start()
    b.stop()
    assert time.monotonic() - t0 < 5
