"""The reflector cache: the latest version of every watched object, kept by one watch.

Everything in the agent and controller reads the world from here rather than from the API
server: one watch per kind feeds a `Store`, and any number of readers take snapshots, wait for
the first full sync, or subscribe to "this key changed". Applying a watch event is synchronous
and pure in effect (no I/O); only `reflect` touches the network.

A relist (`Init`..`InitDone`) is built aside and swapped in at `InitDone`, so a reader never
sees a half-listed world, and objects deleted while the watch was away vanish at the swap (with
a change notification for their keys).

Objects are never mutated in place: each event replaces the stored dict, so a reference a reader
holds stays a consistent object. Readers must not mutate what they get.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import trio

from akri_trio.kube.client import DEFAULT_PAGE_SIZE, JSON, Client, Resource
from akri_trio.kube.watch import (
    Apply,
    Delete,
    Init,
    InitApply,
    InitDone,
    WatchEvent,
    WatchProtocolError,
    open_watch,
)


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects (kubectl's and client-go's key)."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError("object has no metadata.name")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)


class KeyChanges:
    """Keys that changed since the last read, coalesced: a key changing ten times while the
    reader is busy is delivered once, so a slow reader costs memory per key, not per event."""

    def __init__(self) -> None:
        self._pending: dict[str, None] = {}  # insertion-ordered set
        self._wakeup = trio.Event()

    def _push(self, key: str) -> None:
        self._pending[key] = None
        self._wakeup.set()

    def __aiter__(self) -> KeyChanges:
        return self

    async def __anext__(self) -> str:
        while not self._pending:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
        key = next(iter(self._pending))
        del self._pending[key]
        return key


class Store:
    """The cache. Feed it with `apply(event)` (or run `reflect`); read with `get`/`snapshot`."""

    def __init__(self) -> None:
        self._objects: dict[str, JSON] = {}
        self._buffer: dict[str, JSON] | None = None
        self._synced = trio.Event()
        self._changed = trio.Event()
        self._subscribers: list[KeyChanges] = []

    # --- writing -----------------------------------------------------------------------------

    def apply(self, event: WatchEvent) -> None:
        changed: list[str]
        match event:
            case Init():
                self._buffer = {}  # a second Init (relist restarted) drops the partial one
                return
            case InitApply(obj):
                if self._buffer is None:
                    raise WatchProtocolError("InitApply without Init")
                self._buffer[object_key(obj)] = obj
                return
            case InitDone():
                if self._buffer is None:
                    raise WatchProtocolError("InitDone without Init")
                old, new = self._objects, self._buffer
                self._objects, self._buffer = new, None
                changed = [k for k in old.keys() | new.keys() if old.get(k) != new.get(k)]
                self._synced.set()
            case Apply(obj):
                key = object_key(obj)
                self._objects[key] = obj
                changed = [key]
            case Delete(obj):
                key = object_key(obj)
                self._objects.pop(key, None)
                changed = [key]
        for key in sorted(changed):
            for sub in self._subscribers:
                sub._push(key)
        self._changed.set()
        self._changed = trio.Event()

    # --- reading -----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first full list is in (it never goes back: a relist swaps atomically)."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def get(self, key: str) -> JSON | None:
        return self._objects.get(key)

    def snapshot(self) -> dict[str, JSON]:
        """A point-in-time copy of key -> object; later events do not change it."""
        return dict(self._objects)

    def __len__(self) -> int:
        return len(self._objects)

    async def wait_for(
        self, key: str, predicate: Callable[[JSON | None], bool] = lambda obj: obj is not None
    ) -> JSON | None:
        """Wait until `predicate(store.get(key))` holds (default: the key exists); returns it.
        Put a deadline around it (`trio.fail_after`)."""
        while True:
            obj = self._objects.get(key)
            if predicate(obj):
                return obj
            await self._changed.wait()

    @contextmanager
    def subscribe(self) -> Iterator[KeyChanges]:
        """`with store.subscribe() as changes: async for key in changes: ...`"""
        sub = KeyChanges()
        self._subscribers.append(sub)
        try:
            yield sub
        finally:
            self._subscribers.remove(sub)


async def reflect(
    client: Client,
    res: Resource,
    store: Store,
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    timeout_seconds: int = 290,
) -> None:
    """Keep `store` in step with `res`, until cancelled. Readers: `await store.wait_synced()`."""
    async with open_watch(
        client,
        res,
        namespace=namespace,
        label_selector=label_selector,
        field_selector=field_selector,
        page_size=page_size,
        timeout_seconds=timeout_seconds,
    ) as events:
        async for event in events:
            store.apply(event)
