"""A batch of writes: a failed one never cancels the others; failures are raised together."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from akri_trio.runtime import run_all


async def test_a_failed_write_lets_the_others_finish_then_raises(autojump_clock: object) -> None:
    finished: list[str] = []

    async def fails() -> None:
        await trio.sleep(1)
        raise RuntimeError("504")

    async def slow(name: str) -> None:
        await trio.sleep(30)  # still in flight when the other one fails
        finished.append(name)

    with pytest.raises(RuntimeError, match="504"):
        await run_all([fails, lambda: slow("a"), lambda: slow("b")])
    assert sorted(finished) == ["a", "b"]
    assert trio.current_time() == pytest.approx(30)


async def test_several_failures_are_raised_together_once_all_are_done(
    autojump_clock: object,
) -> None:
    async def fails(after: float, what: str) -> None:
        await trio.sleep(after)
        raise ValueError(what)

    with pytest.RaisesGroup(
        pytest.RaisesExc(ValueError, match="first"), pytest.RaisesExc(ValueError, match="second")
    ) as caught:
        await run_all(
            [lambda: fails(2, "second"), lambda: fails(1, "first"), partial(trio.sleep, 3)]
        )
    assert str(caught.value).startswith("2 of 3 writes failed")
    assert trio.current_time() == pytest.approx(3)


async def test_a_limit_bounds_the_writes_in_flight(autojump_clock: object) -> None:
    in_flight, peak = 0, 0

    async def write() -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(1)
        in_flight -= 1

    await run_all([write] * 10, limit=3)
    assert peak == 3
    assert trio.current_time() == pytest.approx(4)  # ceil(10 / 3) rounds


async def test_cancelling_the_caller_cancels_every_write(autojump_clock: object) -> None:
    finished: list[int] = []

    async def write(n: int) -> None:
        await trio.sleep(10)
        finished.append(n)

    with trio.move_on_after(1):
        await run_all([lambda: write(1), lambda: write(2)])
    assert finished == []
    assert trio.current_time() == pytest.approx(1)


async def test_nothing_to_run_is_done_at_once() -> None:
    await run_all([])
