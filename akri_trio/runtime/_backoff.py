"""Capped exponential backoff with full jitter, as a pure value.

The watch driver (reconnects), the reconcile queue (failed reconciles), the agent's Discover
streams and kubelet registration, and a discovery handler registering with its agent all retry,
and all must spread retries out so a restarted server is not hit by every client in lockstep. The
policy is plain data plus a function of the attempt number, so it is tested without clocks and
the callers decide how to sleep.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delay before retry `attempt` (0-based): uniform in [(1-jitter)·d, d], d = min(cap, base·2^n).

    Jitter keeps at least `1 - jitter` of the nominal delay so a retry is never immediate.
    """

    base: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base and self.factor >= 1):
            raise ValueError(f"bad backoff {self!r}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    def nominal(self, attempt: int) -> float:
        # Cap the exponent too: factor**attempt overflows a float long before attempts run out.
        exponent = min(attempt, 64)
        return min(self.cap, self.base * self.factor**exponent)

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        nominal = self.nominal(attempt)
        return nominal * (1 - self.jitter * rand())
