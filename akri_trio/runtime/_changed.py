"""`Changed`: the one "something changed, look again" wake-up.

A producer calls `bump()` (from sync code too: it never blocks); a consumer remembers the version
it last acted on and waits for a newer one. Because the waiter compares versions instead of
consuming a flag, a bump that lands while the consumer is busy is never lost, many consumers can
watch one counter without stealing each other's wake-ups, and nothing has to be re-armed.
"""

from __future__ import annotations

import trio


class Changed:
    """A version counter that tasks can wait on: `seen = await changed.wait_past(seen)`."""

    __slots__ = ("_lot", "_version")

    def __init__(self) -> None:
        self._version = 0
        self._lot = trio.lowlevel.ParkingLot()

    @property
    def version(self) -> int:
        """The number of bumps so far: remember it, act, then `wait_past` it."""
        return self._version

    def bump(self) -> None:
        """Something changed: wake every waiter."""
        self._version += 1
        self._lot.unpark_all()

    async def wait_past(self, seen: int) -> int:
        """Return the current version once it is not `seen` (at once if it already is not)."""
        if self._version != seen:
            await trio.lowlevel.checkpoint()
        while self._version == seen:
            await self._lot.park()
        return self._version
