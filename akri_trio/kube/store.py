"""The reflector cache: the latest version of every watched object, kept by one watch.

Everything in the agent and controller reads the world from here rather than from the API
server: one watch per kind feeds a `Store`, and any number of readers take snapshots, look
objects up by key or by index, wait for the first full sync, or subscribe to "this key changed".
Applying a watch event is synchronous and pure in effect (no I/O); only `reflect` touches the
network.

On the way in each object goes through the store's `transform` (e.g. `drop_managed_fields`:
nobody reads `metadata.managedFields`, and it mirrors every field of the object), so the cache
holds only what its readers need. Named indexes (`by_label`, `by_owner`, `by_field`, or any
function of an object to the values it is filed under) answer "the objects with this label /
owner / field value" with a dict lookup; they are kept in step on every event and rebuilt with
the objects at a relist.

A relist (`Init`..`InitApply`..`InitDone`) is built aside and swapped in at `InitDone`, so a
reader never sees a half-listed world, and objects deleted while the watch was away vanish at the
swap (with a change notification for their keys).

Objects are never mutated in place: each event replaces the stored dict, so a reference a reader
holds stays a consistent object. Readers must not mutate what they get.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import attrs
import trio

from akri_trio.address import ObjectKey
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
from akri_trio.runtime import Changed

Transform = Callable[[JSON], JSON]
# The values an object is filed under in one index (none, one, or several).
IndexFunction = Callable[[JSON], Iterable[Hashable]]


def drop_managed_fields(obj: JSON) -> JSON:
    """`obj` without `metadata.managedFields` (the same dict when it has none)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def by_label(label: str) -> IndexFunction:
    """Files an object under the value of its label `label` (objects without it: nowhere)."""

    def values(obj: JSON) -> Iterable[Hashable]:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return (labels[label],) if label in labels else ()

    return values


def by_owner(kind: str | None = None) -> IndexFunction:
    """Files an object under the uid of each of its owners (of `kind`, when given)."""

    def values(obj: JSON) -> Iterable[Hashable]:
        refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
        return {ref["uid"] for ref in refs if ref.get("uid") and kind in (None, ref.get("kind"))}

    return values


def by_field(get: Callable[[JSON], Hashable | None]) -> IndexFunction:
    """Files an object under `get(obj)`, unless that is None: e.g. the key of the
    Configuration an Instance belongs to."""

    def values(obj: JSON) -> Iterable[Hashable]:
        value = get(obj)
        return () if value is None else (value,)

    return values


@attrs.frozen
class Change:
    """`key` changed: `old` is the object before the first change not yet read (None: it did
    not exist), `new` the object now (None: it is gone)."""

    key: ObjectKey
    old: JSON | None
    new: JSON | None


class KeyChanges:
    """Keys that changed since the last read, coalesced: a key changing ten times while the
    reader is busy is delivered once, so a slow reader costs memory per key, not per event.
    `async for key in changes` gives keys; `await changes.next_change()` also the object as the
    reader last saw it (what a deleted object was owned by, which label it had)."""

    def __init__(self, current: Callable[[ObjectKey], JSON | None]) -> None:
        self._current = current
        self._pending: dict[ObjectKey, JSON | None] = {}  # insertion-ordered: key -> old
        self._pushed = Changed()

    def _push(self, key: ObjectKey, old: JSON | None) -> None:
        self._pending.setdefault(key, old)
        self._pushed.bump()

    def __aiter__(self) -> KeyChanges:
        return self

    async def __anext__(self) -> ObjectKey:
        return (await self.next_change()).key

    async def next_change(self) -> Change:
        while not self._pending:
            await self._pushed.wait_past(self._pushed.version)
        key = next(iter(self._pending))
        old = self._pending.pop(key)
        return Change(key, old, self._current(key))


class _Index:
    """value -> keys of the objects filed under it, for one index function."""

    def __init__(self, values: IndexFunction) -> None:
        self.values = values
        self.keys: dict[Hashable, set[ObjectKey]] = {}

    def add(self, key: ObjectKey, obj: JSON) -> None:
        for value in self.values(obj):
            self.keys.setdefault(value, set()).add(key)

    def remove(self, key: ObjectKey, obj: JSON) -> None:
        for value in self.values(obj):
            keys = self.keys.get(value)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.keys[value]

    def rebuild(self, objects: Mapping[ObjectKey, JSON]) -> None:
        self.keys = {}
        for key, obj in objects.items():
            self.add(key, obj)


class Store:
    """The cache. Feed it with `apply(event)` (or run `reflect`); read with `get`/`snapshot`,
    or through an index: `Store(indexes={"config": by_field(f)})`, `store.select("config", k)`.
    """

    def __init__(
        self,
        *,
        transform: Transform | None = None,
        indexes: Mapping[str, IndexFunction] | None = None,
    ) -> None:
        self._transform = transform
        self._objects: dict[ObjectKey, JSON] = {}
        self._buffer: dict[ObjectKey, JSON] | None = None
        self._indexes = {name: _Index(values) for name, values in (indexes or {}).items()}
        self._synced = trio.Event()
        self._changed = Changed()
        self._subscribers: list[KeyChanges] = []

    # --- writing -----------------------------------------------------------------------------

    def _incoming(self, obj: JSON) -> JSON:
        return obj if self._transform is None else self._transform(obj)

    def _replace(self, key: ObjectKey, new: JSON | None) -> JSON | None:
        """Store `new` under `key` (None: remove it), keeping the indexes in step."""
        old = self._objects.get(key)
        if old is not None:
            for index in self._indexes.values():
                index.remove(key, old)
        if new is None:
            self._objects.pop(key, None)
        else:
            self._objects[key] = new  # an update keeps the key's place in iteration order
            for index in self._indexes.values():
                index.add(key, new)
        return old

    def apply(self, event: WatchEvent) -> None:
        changed: dict[ObjectKey, JSON | None]  # key -> the object before
        match event:
            case Init():
                self._buffer = {}  # a second Init (relist restarted) drops the partial one
                return
            case InitApply(obj):
                if self._buffer is None:
                    raise WatchProtocolError("InitApply without Init")
                self._buffer[ObjectKey.of(obj)] = self._incoming(obj)
                return
            case InitDone():
                if self._buffer is None:
                    raise WatchProtocolError("InitDone without Init")
                old, new = self._objects, self._buffer
                self._objects, self._buffer = new, None
                for index in self._indexes.values():
                    index.rebuild(new)
                changed = {
                    k: old.get(k) for k in old.keys() | new.keys() if old.get(k) != new.get(k)
                }
                self._synced.set()
            case Apply(obj):
                key = ObjectKey.of(obj)
                changed = {key: self._replace(key, self._incoming(obj))}
            case Delete(obj):
                key = ObjectKey.of(obj)
                changed = {key: self._replace(key, None)}
        for key in sorted(changed):
            for sub in self._subscribers:
                sub._push(key, changed[key])
        self._changed.bump()

    # --- reading -----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first full list is in (it never goes back: a relist swaps atomically)."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def get(self, key: ObjectKey) -> JSON | None:
        return self._objects.get(key)

    def snapshot(self) -> dict[ObjectKey, JSON]:
        """A point-in-time copy of key -> object; later events do not change it."""
        return dict(self._objects)

    def __len__(self) -> int:
        return len(self._objects)

    def keys_for(self, index: str, value: Hashable) -> frozenset[ObjectKey]:
        """The keys of the objects index `index` files under `value`."""
        return frozenset(self._indexes[index].keys.get(value, ()))

    def select(self, index: str, value: Hashable) -> dict[ObjectKey, JSON]:
        """The objects index `index` files under `value`, by key (a point-in-time copy)."""
        return {key: self._objects[key] for key in self._indexes[index].keys.get(value, ())}

    async def wait_for(
        self,
        key: ObjectKey,
        predicate: Callable[[JSON | None], bool] = lambda obj: obj is not None,
    ) -> JSON | None:
        """Wait until `predicate(store.get(key))` holds (default: the key exists); returns it.
        Put a deadline around it (`trio.fail_after`)."""
        while True:
            seen = self._changed.version
            obj = self._objects.get(key)
            if predicate(obj):
                return obj
            await self._changed.wait_past(seen)

    @contextmanager
    def subscribe(self) -> Iterator[KeyChanges]:
        """`with store.subscribe() as changes: async for key in changes: ...`"""
        sub = KeyChanges(self.get)
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
