"""Waiting for a state that has no event to wait on: poll with a deadline.

Three shapes, one behaviour (the first truthy value of `check()`, or an AssertionError
"not within Ns: <what> (last: <value>)"):
- `until`: a synchronous check from a synchronous test (kubectl, a subprocess, a thread);
- `until_api`: an awaited check from a trio test (a test's API client has no watch);
- `until_state`: a synchronous check from a trio test (counters, the fd table, a directory).
The trio ones keep time on trio's clock, so they also run under an autojump clock. `when`
turns "this value, once it passes a test" into such a check.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


def _late(seconds: float, what: str, check: Any, last: Any) -> AssertionError:
    return AssertionError(f"not within {seconds}s: {what or check} (last: {last!r})")


def until(
    check: Callable[[], T | None], seconds: float = 60, what: str = "", poll: float = 0.5
) -> T:
    """`check()`'s first truthy value, polled every `poll` s; AssertionError after `seconds`."""
    deadline = time.monotonic() + seconds
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(poll)
    raise _late(seconds, what, check, last)


async def until_api(
    check: Callable[[], Awaitable[T | None]],
    seconds: float = 30,
    what: str = "",
    poll: float = 0.1,
) -> T:
    """`await check()`'s first truthy value, polled every `poll` s; AssertionError after
    `seconds` (a check still running then is cancelled)."""
    last: T | None = None
    with trio.move_on_after(seconds):
        while True:
            last = await check()
            if last:
                return last
            await trio.sleep(poll)
    raise _late(seconds, what, check, last)


async def when(get: Callable[[], Awaitable[T]], ok: Callable[[T], bool]) -> T | None:
    """`await get()` if it passes `ok`, else None: a check for `until_api` (for a truthy value
    only: a falsy one that passes would not end the wait)."""
    value = await get()
    return value if ok(value) else None


async def until_state(
    check: Callable[[], T | None], seconds: float = 10, what: str = "", poll: float = 0.02
) -> T:
    """`check()`'s first truthy value, polled every `poll` s of trio time; AssertionError after
    `seconds`."""

    async def now() -> T | None:
        return check()

    return await until_api(now, seconds, what or repr(check), poll)
