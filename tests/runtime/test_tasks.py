"""`TaskSet`: one task per key; a replacement starts only after its predecessor finished; a task
forgets only its own entry; cancelled callers leave the set consistent."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from akri_trio.runtime import TaskSet

Log = list[tuple[str, str]]


async def service(name: str, log: Log, cleanup: float = 0.0) -> None:
    """Runs until cancelled; takes `cleanup` seconds (shielded) to let go."""
    log.append(("start", name))
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(cleanup)
        log.append(("end", name))


async def with_old_task(nursery: trio.Nursery, log: Log, cleanup: float) -> TaskSet[str]:
    """A set whose key "a" runs `service("old")`, blocked, taking `cleanup` s to stop."""
    tasks = TaskSet[str](nursery)
    await tasks.start_soon("a", service, "old", log, cleanup)
    await trio.testing.wait_all_tasks_blocked()
    return tasks


async def test_start_soon_runs_one_task_per_key(autojump_clock: trio.abc.Clock) -> None:
    log: Log = []
    async with trio.open_nursery() as nursery:
        tasks = TaskSet[str](nursery)
        await tasks.start_soon("a", service, "a1", log)
        await tasks.start_soon("b", service, "b1", log)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(tasks) == ["a", "b"] and len(tasks) == 2 and "a" in tasks
        nursery.cancel_scope.cancel()
    assert sorted(log) == [("end", "a1"), ("end", "b1"), ("start", "a1"), ("start", "b1")]


async def test_replacing_waits_for_the_old_task_to_finish(autojump_clock: trio.abc.Clock) -> None:
    log: Log = []
    async with trio.open_nursery() as nursery:
        tasks = await with_old_task(nursery, log, 3.0)
        await tasks.start_soon("a", service, "new", log)
        assert trio.current_time() == pytest.approx(3.0)  # the old cleanup ran to its end
        await trio.testing.wait_all_tasks_blocked()
        assert log == [("start", "old"), ("end", "old"), ("start", "new")]
        assert list(tasks) == ["a"]
        nursery.cancel_scope.cancel()


async def test_drop_cancels_every_key_at_once_and_waits(autojump_clock: trio.abc.Clock) -> None:
    log: Log = []
    async with trio.open_nursery() as nursery:
        tasks = TaskSet[int](nursery)
        for key in range(3):
            await tasks.start_soon(key, service, str(key), log, 2.0)
        await trio.testing.wait_all_tasks_blocked()
        await tasks.drop(0, 1, 7)  # 7 has no task: ignored
        assert trio.current_time() == pytest.approx(2.0)  # in parallel, not 4 s
        assert sorted(e for e in log if e[0] == "end") == [("end", "0"), ("end", "1")]
        assert list(tasks) == [2]
        nursery.cancel_scope.cancel()


async def test_start_returns_what_the_task_reports() -> None:
    async def serve(port: int, *, task_status: trio.TaskStatus[int]) -> None:
        task_status.started(port + 1)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        tasks = TaskSet[str](nursery)
        assert await tasks.start("x", serve, 41) == 42
        assert "x" in tasks
        nursery.cancel_scope.cancel()


async def test_a_task_that_returns_leaves_the_set() -> None:
    async with trio.open_nursery() as nursery:
        tasks = TaskSet[str](nursery)
        await tasks.start_soon("once", trio.sleep, 0)
        assert "once" in tasks
        await trio.testing.wait_all_tasks_blocked()
        assert "once" not in tasks


async def test_a_failing_task_fails_the_nursery() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    with pytest.RaisesGroup(ValueError):
        async with trio.open_nursery() as nursery:
            await TaskSet[str](nursery).start_soon("k", fails)


async def test_a_drop_cancelled_while_waiting_still_delays_the_next_start(
    autojump_clock: trio.abc.Clock,
) -> None:
    log: Log = []
    async with trio.open_nursery() as nursery:
        tasks = await with_old_task(nursery, log, 5.0)
        with trio.move_on_after(1):
            await tasks.drop("a")
        assert "a" not in tasks and log == [("start", "old")]
        await tasks.start_soon("a", service, "new", log)
        assert trio.current_time() == pytest.approx(5.0)
        await trio.testing.wait_all_tasks_blocked()
        assert log == [("start", "old"), ("end", "old"), ("start", "new")]
        nursery.cancel_scope.cancel()


async def test_a_start_cancelled_before_started_leaves_no_entry() -> None:
    async def never_ready(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        tasks = TaskSet[str](nursery)
        with trio.move_on_after(0.01):
            await tasks.start("k", never_ready)
        assert "k" not in tasks
        await tasks.start_soon("k", trio.sleep_forever)  # nothing left to wait for
        assert list(tasks) == ["k"]
        nursery.cancel_scope.cancel()


async def test_two_concurrent_replacements_leave_one_task(autojump_clock: trio.abc.Clock) -> None:
    log: Log = []
    async with trio.open_nursery() as nursery:
        tasks = await with_old_task(nursery, log, 1.0)
        async with trio.open_nursery() as callers:
            callers.start_soon(tasks.start_soon, "a", service, "x", log)
            callers.start_soon(tasks.start_soon, "a", service, "y", log)
        await trio.testing.wait_all_tasks_blocked()
        running = [name for kind, name in log if kind == "start"]
        ended = [name for kind, name in log if kind == "end"]
        assert len(running) - len(ended) == 1 and list(tasks) == ["a"]
        nursery.cancel_scope.cancel()


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.sampled_from(["start", "drop"]), st.integers(0, 3), st.floats(0, 2)),
        max_size=20,
    )
)
def test_never_two_tasks_of_one_key_at_once(ops: list[tuple[str, int, float]]) -> None:
    """Whatever sequence of starts and drops (each replacement's cleanup taking a while), no
    key ever has two tasks alive, and the set's keys are exactly the keys with a live task."""

    async def main() -> None:
        alive: dict[int, int] = {}

        async def child(key: int, cleanup: float) -> None:
            alive[key] = alive.get(key, 0) + 1
            assert alive[key] == 1
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(cleanup)
                alive[key] -= 1

        async with trio.open_nursery() as nursery:
            tasks = TaskSet[int](nursery)
            for op, key, cleanup in ops:
                if op == "start":
                    await tasks.start_soon(key, child, key, cleanup)
                else:
                    await tasks.drop(key)
                await trio.testing.wait_all_tasks_blocked()
                assert set(tasks) == {k for k, n in alive.items() if n}
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_starting_in_a_closed_nursery_leaves_no_entry() -> None:
    async with trio.open_nursery() as nursery:
        tasks = TaskSet[str](nursery)
    with pytest.raises(RuntimeError):
        await tasks.start_soon("k", trio.sleep_forever)
    with pytest.raises(RuntimeError):
        await tasks.start("k", trio.sleep_forever)
    assert "k" not in tasks
    await tasks.drop("k")  # nothing to wait for


async def test_a_task_that_never_reports_started_leaves_no_entry() -> None:
    async def quits(*, task_status: trio.TaskStatus[None]) -> None:
        return

    async with trio.open_nursery() as nursery:
        tasks = TaskSet[str](nursery)
        with pytest.raises(RuntimeError):
            await tasks.start("k", quits)
        assert "k" not in tasks
        await tasks.start_soon("k", trio.sleep_forever)
        assert list(tasks) == ["k"]
        nursery.cancel_scope.cancel()
