"""`Changed`: a waiter wakes on any bump after the version it saw, and never misses one."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.runtime import Changed


async def test_wait_past_returns_at_once_when_a_bump_came_before_the_wait() -> None:
    changed = Changed()
    seen = changed.version
    changed.bump()  # while the consumer was busy
    with trio.testing.assert_checkpoints():
        assert await changed.wait_past(seen) == seen + 1


async def test_wait_past_blocks_until_the_next_bump(autojump_clock: trio.abc.Clock) -> None:
    changed = Changed()
    woke: list[float] = []

    async def waiter() -> None:
        woke.append(await changed.wait_past(changed.version))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(5)
        assert woke == []
        changed.bump()
    assert woke == [1]


async def test_every_waiter_wakes_on_one_bump(autojump_clock: trio.abc.Clock) -> None:
    changed = Changed()
    woke: list[int] = []

    async def waiter() -> None:
        woke.append(await changed.wait_past(0))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        changed.bump()
    assert woke == [1, 1, 1]


async def test_a_waiter_can_be_cancelled(autojump_clock: trio.abc.Clock) -> None:
    changed = Changed()
    with trio.move_on_after(10) as scope:
        await changed.wait_past(0)
    assert scope.cancelled_caught
    changed.bump()  # no parked waiter left behind to wake
    assert await changed.wait_past(0) == 1


@given(st.lists(st.booleans(), max_size=30))
def test_a_consumer_sees_the_last_bump_however_bumps_and_waits_interleave(
    steps: list[bool],
) -> None:
    """True: the producer bumps; False: the consumer catches up if anything is new. Whatever
    the order, after the producer stops the consumer has seen the final version."""

    async def main() -> None:
        changed = Changed()
        seen = 0
        for bump in steps:
            if bump:
                changed.bump()
            elif changed.version != seen:
                seen = await changed.wait_past(seen)
        if changed.version != seen:
            seen = await changed.wait_past(seen)
        assert seen == changed.version == steps.count(True)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_version_starts_at_zero() -> None:
    assert Changed().version == 0
    with pytest.raises(AttributeError):
        Changed().version = 3  # type: ignore[misc]
