"""Retry delays: exponential, capped, jittered within bounds, never zero, never overflowing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.runtime import Backoff


def test_nominal_doubles_then_caps() -> None:
    b = Backoff(base=0.5, cap=4)
    assert [b.nominal(n) for n in range(6)] == [0.5, 1, 2, 4, 4, 4]


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    assert Backoff(base=1, cap=30).nominal(10_000) == 30


@given(
    attempt=st.integers(0, 200),
    r=st.floats(0, 1),
    jitter=st.floats(0, 1),
)
def test_delay_is_within_the_jitter_band(attempt: int, r: float, jitter: float) -> None:
    b = Backoff(base=0.25, cap=60, jitter=jitter)
    nominal = b.nominal(attempt)
    delay = b.delay(attempt, lambda: r)
    assert (1 - jitter) * nominal - 1e-9 <= delay <= nominal
    if jitter < 1:
        assert delay > 0


def test_jitter_extremes() -> None:
    b = Backoff(base=2, cap=8, jitter=0.5)
    assert b.delay(1, lambda: 0.0) == 4
    assert b.delay(1, lambda: 1.0) == 2


@pytest.mark.parametrize(
    "kwargs",
    [{"base": 0}, {"base": 2, "cap": 1}, {"factor": 0.5}, {"jitter": -0.1}, {"jitter": 1.5}],
)
def test_nonsense_is_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)
