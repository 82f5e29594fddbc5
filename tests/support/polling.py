"""Waiting for a real cluster to reach a state: poll with a deadline (from synchronous tests,
or from trio tests through an API client)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio


def until(check: Callable[[], Any], seconds: float = 60, what: str = "") -> Any:
    """`check()`'s first truthy value, polled every 0.5 s; AssertionError after `seconds`."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds}s: {what or check} (last: {last!r})")


async def until_api(
    check: Callable[[], Awaitable[Any]], seconds: float = 30, what: str = ""
) -> Any:
    """`await check()`'s first truthy value, polled every 0.1 s (a test's API client has no
    watch); AssertionError after `seconds`."""
    last: Any = None
    with trio.move_on_after(seconds):
        while True:
            last = await check()
            if last:
                return last
            await trio.sleep(0.1)
    raise AssertionError(f"not within {seconds}s: {what or check} (last: {last!r})")
