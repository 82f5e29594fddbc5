"""Waiting, from synchronous tests, for a real cluster to reach a state: poll with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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
