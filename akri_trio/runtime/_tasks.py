"""`TaskSet`: child tasks by key, each replaced or dropped as a whole.

The agent runs a discovery per Configuration, a Discover stream per handler endpoint and a device
plugin per Instance; each is started when its key appears, restarted when what it serves changes
and stopped when the key goes. Done by hand with a dict of cancel scopes, that is easy to get
subtly wrong: a replacement that starts before its predecessor has let go of its socket or its
registry entry, a stopped task that removes its successor's entry on the way out, a caller
cancelled half-way that leaves a key marked running with no task behind it. This is the one
place that gets it right (what kube-rs's FutureHashMap is to its controller): a replacement waits
until the old task has finished, a task forgets only its own entry, and a cancelled `start` or
`drop` leaves the set consistent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

import trio

K = TypeVar("K", bound=Hashable)


class _Child:
    __slots__ = ("done", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.done = trio.Event()


class TaskSet(Generic[K]):
    """At most one running task per key, in `nursery`. A task that returns leaves the set; one
    that raises fails the nursery, as any child would. Iterating gives the keys running now (a
    task being stopped is no longer one of them)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._live: dict[K, _Child] = {}
        # Every task not finished yet, live or cancelled, by key: a new task for a key waits
        # for all of them (a `drop` cancelled while waiting leaves its task here).
        self._unfinished: dict[K, set[_Child]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._live))

    def __len__(self) -> int:
        return len(self._live)

    async def start(self, key: K, fn: Callable[..., Awaitable[object]], *args: object) -> Any:
        """Replace `key`'s task (if any) with `fn(*args, task_status=...)`, as `nursery.start`:
        returns what it reports as started."""
        child = await self._replace(key)
        try:
            return await self._nursery.start(self._run, key, child, fn, args, True)
        except RuntimeError:
            # The nursery is closed (no task ran) or `fn` returned without reporting started
            # (its task has finished): either way nothing of `child` is left running.
            self._forget(key, child)
            raise

    async def start_soon(self, key: K, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Replace `key`'s task (if any) with `fn(*args)`, as `nursery.start_soon`."""
        child = await self._replace(key)
        try:
            self._nursery.start_soon(self._run, key, child, fn, args, False)
        except RuntimeError:  # the nursery is closed: no task will run
            self._forget(key, child)
            raise

    async def drop(self, *keys: K) -> None:
        """Cancel the tasks of `keys` (all at once) and return when every one has finished.
        Keys without a task are ignored."""
        waits: list[_Child] = []
        for key in keys:
            child = self._live.pop(key, None)
            if child is not None:
                child.scope.cancel()
            waits.extend(self._unfinished.get(key, ()))
        if not waits:
            await trio.lowlevel.checkpoint()
        for child in waits:
            await child.done.wait()

    async def _replace(self, key: K) -> _Child:
        # Loop: a concurrent `start` for the same key may slip in while we wait.
        while key in self._unfinished:
            await self.drop(key)
        child = _Child()
        self._live[key] = child
        self._unfinished[key] = {child}
        return child

    async def _run(
        self,
        key: K,
        child: _Child,
        fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        reports_started: bool,
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with child.scope:
                if reports_started:
                    await fn(*args, task_status=task_status)
                else:
                    await fn(*args)
        finally:
            self._forget(key, child)

    def _forget(self, key: K, child: _Child) -> None:
        """`child` has finished (or never ran): drop its entries, not a successor's."""
        if self._live.get(key) is child:
            del self._live[key]
        others = self._unfinished.get(key)
        if others is not None:
            others.discard(child)
            if not others:
                del self._unfinished[key]
        child.done.set()
