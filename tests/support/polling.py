"""Waiting for a real cluster to reach a state: poll with a deadline."""

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


async def eventually(check: Callable[[], Awaitable[Any]], seconds: float = 60) -> Any:
    """The async twin of `until`, inside a trio test: `await check()`'s first truthy value,
    polled every 0.1 s; TooSlowError after `seconds`."""
    with trio.fail_after(seconds):
        while not (result := await check()):  # noqa: ASYNC110 (polls the API server)
            await trio.sleep(0.1)
    return result
