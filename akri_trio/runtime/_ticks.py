"""`next_tick` / `sleep_to_tick`: periodic work wakes the process together, not each on its own.

An idle agent has several loops that look at something every second or few (the kubelet's
directory, debugEcho's file, the event-loop lag sampler, brokerInfo, the reclaimer). Each
`trio.sleep(period)` started at its own moment, so the process woke up once per loop per period,
each wake-up a trip through the kernel and trio's scheduler for a few microseconds of work.
Sleeping to the next multiple of the period on trio's clock instead puts every loop whose period
divides another's on the same instants: one wake-up per second runs them all.
"""

from __future__ import annotations

import math

import trio


def next_tick(period: float, now: float) -> float:
    """The first multiple of `period` after `now` (strictly: a loop never runs twice at once)."""
    tick = math.ceil(now / period) * period
    return tick if tick > now else tick + period


async def sleep_to_tick(period: float) -> float:
    """Sleep until the next multiple of `period` on trio's clock; returns that instant (the
    caller may measure how late it woke). The first sleep of a loop is shorter than `period`."""
    deadline = next_tick(period, trio.current_time())
    await trio.sleep_until(deadline)
    return deadline
