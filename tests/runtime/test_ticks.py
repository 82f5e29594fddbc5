"""Periodic loops sleep to the multiples of their period, so loops wake together."""

from __future__ import annotations

import trio
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.runtime import next_tick, sleep_to_tick


@given(st.floats(min_value=0.001, max_value=100), st.floats(min_value=0, max_value=1e6))
def test_next_tick_is_the_first_multiple_of_the_period_after_now(period: float, now: float) -> None:
    tick = next_tick(period, now)
    assert tick > now
    assert tick - now <= period * (1 + 1e-9) + 1e-6
    assert abs(tick / period - round(tick / period)) < 1e-6


async def test_loops_with_dividing_periods_wake_at_the_same_instants(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woke: dict[float, list[float]] = {1.0: [], 2.0: []}

    async def loop(period: float, times: int) -> None:
        for _ in range(times):
            woke[period].append(await sleep_to_tick(period))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop, 1.0, 9)
        await trio.sleep(0.3)  # the second loop starts at another moment
        nursery.start_soon(loop, 2.0, 4)
    assert set(woke[2.0]) <= set(woke[1.0])
    assert all(t == round(t) for t in woke[1.0] + woke[2.0])
