"""Running a batch of requests together, to the end.

A reconcile writes several objects at once. When one of those writes fails, the usual nursery
would cancel the others in flight; but a write abandoned half-way is work the API server does
for nothing (it may still apply it, and counts the abandoned request as an error), and the
retry does it again. Under load that turns latency into extra work, so a batch runs every
request to its end and only then reports the first failure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio


async def run_all(jobs: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run `jobs` concurrently, every one to its end, then raise the first failure (if any)."""
    failures: list[Exception] = []

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        try:
            await job()
        except Exception as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(one, job)
    if failures:
        raise failures[0]
