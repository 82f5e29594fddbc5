"""The reconcile queue: per-key order and exclusion, cross-key parallelism, backoff, requeue,
cancellation and the bounded drain on shutdown. Time is trio's MockClock (autojump), so minutes
of backoff take no wall time."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest
import trio
from trio.testing import MockClock

from akri_trio.kube.queue import ReconcileQueue, Requeue
from akri_trio.runtime import Backoff


class Recorder:
    """A reconcile that logs (start time, key), tracks concurrency, and sleeps `work` seconds."""

    def __init__(self, work: float = 1.0) -> None:
        self.work = work
        self.started: list[tuple[float, str]] = []
        self.active: Counter[str] = Counter()
        self.max_active_per_key: Counter[str] = Counter()
        self.max_active = 0

    async def __call__(self, key: str) -> Requeue | None:
        self.started.append((trio.current_time(), key))
        self.active[key] += 1
        self.max_active_per_key[key] = max(self.max_active_per_key[key], self.active[key])
        self.max_active = max(self.max_active, sum(self.active.values()))
        try:
            await trio.sleep(self.work)
        finally:
            self.active[key] -= 1
        return None

    def keys(self) -> list[str]:
        return [k for _, k in self.started]


async def running(queue: ReconcileQueue[str], body: Callable[[], Awaitable[None]]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        await body()
        nursery.cancel_scope.cancel()


async def test_keys_run_in_enqueue_order_with_one_worker(autojump_clock: MockClock) -> None:
    t0 = trio.current_time()
    rec = Recorder()
    queue = ReconcileQueue(rec, workers=1)
    for key in ["c", "a", "b", "a"]:  # the second "a" is already pending: coalesced
        queue.enqueue(key)

    async def body() -> None:
        await trio.sleep(10)

    await running(queue, body)
    assert rec.keys() == ["c", "a", "b"]
    assert [t - t0 for t, _ in rec.started] == [0, 1, 2]


async def test_one_key_never_reconciles_twice_at_once_and_reruns_after(
    autojump_clock: MockClock,
) -> None:
    t0 = trio.current_time()
    rec = Recorder(work=5)
    queue = ReconcileQueue(rec, workers=4)

    async def body() -> None:
        queue.enqueue("a")
        await trio.sleep(1)
        assert queue.running == {"a"}
        for _ in range(3):  # events while "a" reconciles: one more run, after this one
            queue.enqueue("a")
            await trio.sleep(1)
        await trio.sleep(20)

    await running(queue, body)
    assert rec.max_active_per_key["a"] == 1
    assert [(t - t0, k) for t, k in rec.started] == [(0, "a"), (5, "a")]


async def test_different_keys_run_in_parallel_up_to_the_worker_bound(
    autojump_clock: MockClock,
) -> None:
    t0 = trio.current_time()
    rec = Recorder(work=10)
    queue = ReconcileQueue(rec, workers=3)
    for key in "abcde":
        queue.enqueue(key)

    async def body() -> None:
        await trio.sleep(100)

    await running(queue, body)
    assert rec.max_active == 3
    assert [(t - t0, k) for t, k in rec.started] == [
        (0, "a"),
        (0, "b"),
        (0, "c"),
        (10, "d"),
        (10, "e"),
    ]


async def test_failures_back_off_exponentially_and_success_resets(
    autojump_clock: MockClock,
) -> None:
    t0 = trio.current_time()
    attempts: list[float] = []

    async def flaky(key: str) -> Requeue | None:
        attempts.append(trio.current_time() - t0)
        if len(attempts) <= 4:
            raise RuntimeError("boom")
        return None

    # rand() = 0 -> the full nominal delay: 1, 2, 4, 8 (cap 8)
    queue = ReconcileQueue(flaky, backoff=Backoff(base=1, cap=8, jitter=0.5), rand=lambda: 0.0)
    queue.enqueue("k")

    async def body() -> None:
        await trio.sleep(14.5)
        assert queue.failures("k") == 4
        await trio.sleep(100)

    await running(queue, body)
    assert attempts == [0, 1, 3, 7, 15]
    assert queue.failures("k") == 0


async def test_backoff_is_capped_and_jittered(autojump_clock: MockClock) -> None:
    attempts: list[float] = []

    async def failing(key: str) -> Requeue | None:
        attempts.append(trio.current_time())
        raise RuntimeError("always")

    # rand() = 1 -> the jittered minimum: half the nominal delay, and never above the cap.
    queue = ReconcileQueue(failing, backoff=Backoff(base=1, cap=4, jitter=0.5), rand=lambda: 1.0)
    queue.enqueue("k")

    async def body() -> None:
        await trio.sleep(30)

    await running(queue, body)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[:5] == [0.5, 1, 2, 2, 2]


async def test_an_event_cuts_a_backoff_short(autojump_clock: MockClock) -> None:
    t0 = trio.current_time()
    attempts: list[float] = []

    async def fail_once(key: str) -> Requeue | None:
        attempts.append(trio.current_time() - t0)
        if len(attempts) == 1:
            raise RuntimeError("boom")
        return None

    queue = ReconcileQueue(fail_once, backoff=Backoff(base=60, cap=60), rand=lambda: 0.0)
    queue.enqueue("k")

    async def body() -> None:
        await trio.sleep(5)
        queue.enqueue("k")  # news: do not wait out the 60 s backoff
        await trio.sleep(200)

    await running(queue, body)
    assert attempts == [0, 5]


async def test_requeue_after(autojump_clock: MockClock) -> None:
    t0 = trio.current_time()
    runs: list[float] = []

    async def periodic(key: str) -> Requeue | None:
        runs.append(trio.current_time() - t0)
        return Requeue(after=30) if len(runs) < 3 else None

    queue = ReconcileQueue(periodic)
    queue.enqueue("k")

    async def body() -> None:
        await trio.sleep(1000)

    await running(queue, body)
    assert runs == [0, 30, 60]


async def test_enqueue_after_keeps_the_earliest_deadline(autojump_clock: MockClock) -> None:
    t0 = trio.current_time()
    rec = Recorder(work=0)
    queue = ReconcileQueue(rec)

    async def body() -> None:
        queue.enqueue_after("k", 50)
        queue.enqueue_after("k", 20)
        queue.enqueue_after("k", 80)
        assert len(queue) == 1
        await trio.sleep(200)

    await running(queue, body)
    assert [(t - t0, k) for t, k in rec.started] == [(20, "k")]


async def test_cancel_stops_in_flight_reconciles_promptly(autojump_clock: MockClock) -> None:
    t0 = trio.current_time()
    cleaned = trio.Event()

    async def slow(key: str) -> Requeue | None:
        try:
            await trio.sleep_forever()
        finally:
            cleaned.set()
        return None

    queue = ReconcileQueue(slow, drain=0)
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(queue.run)
            queue.enqueue("k")
            await trio.sleep(1)
            assert queue.running == {"k"}
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert cleaned.is_set()
    assert trio.current_time() - t0 == 1


async def stop_after(queue: ReconcileQueue[str], keys: str, seconds: float) -> float:
    """Run `queue` with `keys` enqueued, cancel it after `seconds`; how long it took to end."""
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        for key in keys:
            queue.enqueue(key)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()
        cancelled_at = trio.current_time()
    return trio.current_time() - cancelled_at


async def test_shutdown_lets_in_flight_reconciles_finish_within_the_drain(
    autojump_clock: MockClock,
) -> None:
    rec = Recorder(work=3)
    finished: list[str] = []

    async def reconcile(key: str) -> Requeue | None:
        await rec(key)
        finished.append(key)
        return None

    queue = ReconcileQueue(reconcile, workers=1, drain=5)
    took = await stop_after(queue, "ab", 1)
    assert finished == ["a"]  # "a" ran to its end
    assert rec.keys() == ["a"]  # "b" was waiting: it never started
    assert took == 2


async def test_shutdown_cancels_what_outlives_the_drain(autojump_clock: MockClock) -> None:
    cancelled = trio.Event()

    async def hangs(key: str) -> Requeue | None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise
        return None

    queue = ReconcileQueue(hangs, drain=5)
    took = await stop_after(queue, "a", 1)
    assert cancelled.is_set()
    assert took == 5


async def test_a_failure_during_the_drain_is_not_retried(autojump_clock: MockClock) -> None:
    attempts: list[float] = []

    async def fails(key: str) -> Requeue | None:
        attempts.append(trio.current_time())
        await trio.sleep(2)
        raise RuntimeError("the API server is down")

    queue = ReconcileQueue(fails, backoff=Backoff(base=0.1, cap=0.1), drain=10)
    took = await stop_after(queue, "a", 1)
    assert len(attempts) == 1
    assert took == 1


def test_workers_must_be_positive_and_drain_non_negative() -> None:
    async def nop(key: str) -> None:
        return None

    with pytest.raises(ValueError):
        ReconcileQueue(nop, workers=0)
    with pytest.raises(ValueError):
        ReconcileQueue(nop, drain=-1)
