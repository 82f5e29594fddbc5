"""The one batch-write policy: every write of a batch runs to its end, then the failures are
raised together.

A reconcile writes several objects at once. When one of those writes fails, a plain nursery
would cancel the others in flight. But a write abandoned half-way is not undone: the API server
may still apply it (and counts the abandoned request as an error), so the plan is left applied in
part, in an order nobody chose, and the retry does the abandoned work again. Under load that
turns latency into extra work. So a batch lets every write finish and only then reports: the
reconcile fails (and is retried with backoff) knowing exactly which writes failed, and the ones
that succeeded are done once. Cancelling the caller still cancels every write at once (shutdown,
a lost lease): that is a decision to stop, not a failure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import trio


async def run_all(
    jobs: Iterable[Callable[[], Awaitable[object]]], *, limit: int | None = None
) -> None:
    """Run `jobs` concurrently (at most `limit` at a time), every one to its end. Then raise:
    a single failure as itself, several as one ExceptionGroup of all of them."""
    slots = None if limit is None else trio.Semaphore(limit)
    failures: list[Exception] = []

    async def one(job: Callable[[], Awaitable[object]]) -> None:
        try:
            if slots is None:
                await job()
            else:
                async with slots:
                    await job()
        except Exception as exc:
            failures.append(exc)

    count = 0
    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(one, job)
            count += 1
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise ExceptionGroup(f"{len(failures)} of {count} writes failed", failures)
