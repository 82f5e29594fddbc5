"""A batch of requests: a failed one never cancels the others."""

from __future__ import annotations

import pytest
import trio

from akri_trio.kube.batch import run_all


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


async def test_the_first_failure_is_raised_once_all_are_done(autojump_clock: object) -> None:
    async def fails(after: float, what: str) -> None:
        await trio.sleep(after)
        raise ValueError(what)

    with pytest.raises(ValueError, match="first"):
        await run_all([lambda: fails(2, "second"), lambda: fails(1, "first")])


async def test_nothing_to_run_is_done_at_once() -> None:
    await run_all([])
