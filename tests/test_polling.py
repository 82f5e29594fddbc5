"""The shared polling helpers: the first truthy value, or a failure naming what was awaited
and the last value seen. Time is trio's MockClock (autojump) for the trio ones."""

from __future__ import annotations

import itertools

import pytest
import trio
from trio.testing import MockClock

from tests.support.polling import until, until_api, until_state, when


def test_until_returns_the_first_truthy_value() -> None:
    values = iter([0, "", "ready"])
    assert until(lambda: next(values), seconds=5, poll=0) == "ready"


def test_until_fails_naming_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"not within 0.01s: the answer \(last: 0\)"):
        until(lambda: 0, seconds=0.01, what="the answer", poll=0)


async def test_until_api_awaits_the_check_until_truthy(autojump_clock: MockClock) -> None:
    count = itertools.count()

    async def third() -> int | None:
        n = next(count)
        return n if n == 3 else None

    assert await until_api(third, seconds=5) == 3
    assert trio.current_time() == pytest.approx(0.3)  # polled every 0.1 s


async def test_until_api_fails_after_seconds_of_trio_time(autojump_clock: MockClock) -> None:
    async def never() -> list[str]:
        return []

    with pytest.raises(AssertionError, match=r"not within 30s: a list \(last: \[\]\)"):
        await until_api(never, what="a list")
    assert trio.current_time() == pytest.approx(30)


async def test_until_state_polls_a_synchronous_check(autojump_clock: MockClock) -> None:
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_append_later, seen)
        assert await until_state(lambda: seen) == [1]
    assert trio.current_time() == pytest.approx(2, abs=0.02)
    with pytest.raises(AssertionError, match=r"not within 1s: nothing \(last: False\)"):
        await until_state(lambda: False, seconds=1, what="nothing")


async def _append_later(seen: list[int]) -> None:
    await trio.sleep(2)
    seen.append(1)


async def test_when_keeps_a_value_that_passes_and_drops_one_that_does_not() -> None:
    async def two() -> list[int]:
        return [1, 2]

    assert await when(two, lambda v: len(v) == 2) == [1, 2]
    assert await when(two, lambda v: len(v) == 3) is None
