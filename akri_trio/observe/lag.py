"""How late the event loop runs: the agent's measure of its own responsiveness.

Everything the agent does shares one trio loop, so any step that runs long without yielding (a
flood of connections, a huge device list, a quadratic scan) delays every other task: the
kubelet's Allocate, the API server's watch, the probes. A task that sleeps a fixed period and
records how much later than asked it woke up measures exactly that delay, as the tasks
themselves feel it. Each sample goes to `akri_event_loop_lag_seconds` (a histogram), and
`/healthz` fails while the lag is over a threshold: the last sample, or how overdue the running
sleep already is (so a request answered right after a stall, before the sampler has run, sees
it), until a sample under the threshold arrives.

`current_lag` and `verdict` are pure; `LagMonitor.run` is the sampling task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import attrs
import trio

from akri_trio.runtime import next_tick

__all__ = ["LAG_THRESHOLD_S", "SAMPLE_PERIOD_S", "LagMonitor", "current_lag", "verdict"]

# A stall longer than this always spans a wake-up, so it is always sampled; a shorter one may
# fall between two. 2 s is far under the threshold (so /healthz and the histogram see every
# stall that matters) and keeps an idle agent asleep: one wake-up every 2 s, with the agent's
# other periodic looks on the same tick.
SAMPLE_PERIOD_S: Final = 2.0
# The agent's default: a loop this late misses the kubelet's and the API server's timeouts; the
# liveness probe then restarts it. Heavy but healthy work stays far below.
LAG_THRESHOLD_S: Final = 5.0


def current_lag(last: float, expected_wake: float | None, now: float) -> float:
    """The lag as of `now`: the last sample, or how far past `expected_wake` (when the running
    sleep should have ended; None: none is running) `now` already is, whichever is more."""
    overdue = 0.0 if expected_wake is None else now - expected_wake
    return max(last, overdue, 0.0)


def verdict(lag: float, threshold: float) -> tuple[bool, str]:
    """(healthy, why) for a lag against the threshold, as /healthz says it."""
    if lag > threshold:
        return False, f"event loop lag {lag:.3f}s is over {threshold:g}s"
    return True, f"ok (event loop lag {lag:.3f}s)"


@attrs.define
class LagMonitor:
    """Samples the loop's lag every `period` seconds into `record` (a histogram's `observe`)."""

    threshold: float
    record: Callable[[float], None] = lambda _lag: None
    period: float = SAMPLE_PERIOD_S
    last: float = 0.0
    peak: float = 0.0  # the largest sample so far (tests read it)
    expected_wake: float | None = None

    def lag(self) -> float:
        return current_lag(self.last, self.expected_wake, trio.current_time())

    def check(self) -> tuple[bool, str]:
        """The /healthz check."""
        return verdict(self.lag(), self.threshold)

    async def run(self) -> None:
        while True:
            self.expected_wake = next_tick(self.period, trio.current_time())
            await trio.sleep_until(self.expected_wake)
            self.last = max(0.0, trio.current_time() - self.expected_wake)
            self.peak = max(self.peak, self.last)
            self.record(self.last)
