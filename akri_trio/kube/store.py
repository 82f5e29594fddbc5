"""The reflector cache: the latest version of every watched object, kept by one watch.

Everything in the agent and controller reads the world from here rather than from the API
server: one watch per kind feeds a `Store`, and any number of readers take snapshots, look
objects up by key or by index, wait for the first full sync, or subscribe to "this key changed".
Applying a watch event is synchronous and pure in effect (no I/O); only `reflect` touches the
network.

On the way in each object goes through the store's `transform` (e.g. `drop_managed_fields`:
nobody reads `metadata.managedFields`, and it mirrors every field of the object), so the cache
holds only what its readers need, and then through its `decode` (e.g. to the `Instance` model),
once per version, so every reader of the store reads the same typed object (`Store[Instance]`,
as kube-rs's reflector store is typed) instead of decoding the JSON again in a cache of its own.
Once per version includes this process's own writes: the API server's answer to a write,
decoded with `decode`, is kept until the watch brings that version, which then files the
decoded answer instead of decoding the same object again (an agent writes every Instance it
makes and every claim, so each of those versions used to be decoded twice).
An object the decoder refuses (the CRD's schema should prevent it, but without the webhook a
schema-valid object can still be one the model cannot read, e.g. a Configuration whose `spec` was
removed) is logged once per uid and resourceVersion and then, by the store's choice:
- by default left out: for the readers it does not exist until a version that decodes arrives
  (right for Instances: a reader acts on what decodes, and an Instance it cannot read is not
  one it serves);
- with `keep_last_good=True`, an update that does not decode leaves the last version that did in
  the cache, unchanged and with no change notification: a refused update must not look like a
  deletion to readers that act on one (the agent would stop discovery and delete Instances for a
  Configuration someone only broke). An object first seen undecodable, or an incarnation (uid)
  other than the one kept, has nothing to keep and is left out. A deletion still removes it.
Either way `store.refused()` lists what the watch holds that the decoder refused (its JSON), and
`store.holds(key)` tells "refused" from "gone". `store.raw` is the same cache read as the JSON
that was decoded (what the indexes file).

Named indexes (`by_label`, `by_owner`, `by_field`, or any function of an object's JSON to the
values it is filed under) answer "the objects with this label / owner / field value" with a dict
lookup; they are kept in step on every event and rebuilt with the objects at a relist.

A relist (`Init`..`InitApply`..`InitDone`) is built aside and swapped in at `InitDone`, so a
reader never sees a half-listed world, and objects deleted while the watch was away vanish at the
swap (with a change notification for their keys).

Objects are never mutated in place: each event replaces the stored object, so a reference a
reader holds stays a consistent object. Readers must not mutate what they get.

`Overlay` is "read your own writes" on top of a store: what this process last wrote per key (the
API server's answer), shown until the watch has delivered that version. resourceVersions are
opaque strings here and everywhere: compared for equality, never ordered.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, Generic, overload

import attrs
import trio
from typing_extensions import TypeVar

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
from akri_trio.model.convert import error_messages
from akri_trio.runtime import Changed

log = logging.getLogger(__name__)

T = TypeVar("T", default=JSON)
V = TypeVar("V")

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


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _version(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(uid, resourceVersion): one version of one incarnation; equal ones are the same object."""
    meta = _meta(obj)
    return str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")


# At most this many answers wait for the watch (`Store.decode`); past it they are forgotten
# wholesale (the watch's versions are then decoded, as without them).
ANSWER_MEMORY: Final = 4096


@attrs.frozen
class _Entry:
    """One cached object: its JSON (after the transform) and what the decoder made of it."""

    raw: JSON
    value: Any


def _raw(entry: _Entry) -> Any:
    return entry.raw


def _value(entry: _Entry) -> Any:
    return entry.value


@attrs.frozen
class Change(Generic[T]):
    """`key` changed: `old` is the object before the first change not yet read (None: it did
    not exist), `new` the object now (None: it is gone)."""

    key: ObjectKey
    old: T | None
    new: T | None


class KeyChanges(Generic[T]):
    """Keys that changed since the last read, coalesced: a key changing ten times while the
    reader is busy is delivered once, so a slow reader costs memory per key, not per event.
    `async for key in changes` gives keys; `await changes.next_change()` also the object as the
    reader last saw it (what a deleted object was owned by, which label it had)."""

    def __init__(
        self, current: Callable[[ObjectKey], _Entry | None], pick: Callable[[_Entry], T]
    ) -> None:
        self._current = current
        self._pick = pick
        self._pending: dict[ObjectKey, _Entry | None] = {}  # insertion-ordered: key -> old
        self._pushed = Changed()

    def _push(self, key: ObjectKey, old: _Entry | None) -> None:
        self._pending.setdefault(key, old)
        self._pushed.bump()

    def __aiter__(self) -> KeyChanges[T]:
        return self

    async def __anext__(self) -> ObjectKey:
        return (await self.next_change()).key

    async def next_change(self) -> Change[T]:
        while not self._pending:
            await self._pushed.wait_past(self._pushed.version)
        key = next(iter(self._pending))
        old, new = self._pending.pop(key), self._current(key)
        return Change(
            key, None if old is None else self._pick(old), None if new is None else self._pick(new)
        )


@attrs.frozen
class Delivery:
    """What the watch delivered for `key`: the object's uid and resourceVersion, whether it
    was a deletion, and whether it came with a relist (which may skip versions)."""

    key: ObjectKey
    uid: str
    version: str
    deleted: bool = False
    relist: bool = False

    @classmethod
    def of(
        cls, key: ObjectKey, raw: JSON, *, deleted: bool = False, relist: bool = False
    ) -> Delivery:
        meta = _meta(raw)
        return cls(
            key, str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""), deleted, relist
        )


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

    def rebuild(self, entries: Mapping[ObjectKey, _Entry]) -> None:
        self.keys = {}
        for key, entry in entries.items():
            self.add(key, entry.raw)


class _Cache:
    """The state one store and its views share."""

    def __init__(
        self,
        transform: Transform | None,
        decode: Callable[[JSON], Any] | None,
        indexes: Mapping[str, IndexFunction] | None,
        keep_last_good: bool,
    ) -> None:
        self.transform = transform
        self.decode = decode
        self.entries: dict[ObjectKey, _Entry] = {}
        self.buffer: dict[ObjectKey, _Entry] | None = None
        self.indexes = {name: _Index(values) for name, values in (indexes or {}).items()}
        self.synced = trio.Event()
        self.changed = Changed()
        self.subscribers: list[KeyChanges[Any]] = []
        self.observers: list[Callable[[Delivery], None]] = []
        self.keep_last_good = keep_last_good
        # key -> the latest version the watch delivered that the decoder refused (after the
        # transform); logged once per uid and resourceVersion. During a relist, `relisted`
        # collects the listed ones, swapped in at InitDone.
        self.refused: dict[ObjectKey, JSON] = {}
        self.relisted: dict[ObjectKey, JSON] = {}
        # key -> the last answer to a write (or read) that `decode` made, until the watch
        # brings its version (whose entry it then is), deletes the key or relists.
        self.answers: dict[ObjectKey, _Entry] = {}


class Store(Generic[T]):
    """The cache. Feed it with `apply(event)` (or run `reflect`); read with `get`/`snapshot`,
    or through an index: `Store(indexes={"config": by_field(f)})`, `store.select("config", k)`.
    `Store(decode=f)` holds what `f` makes of each object (`Store[Instance]`); without a
    decoder, the JSON itself. `keep_last_good=True`: an update the decoder refuses leaves the
    last version that decoded in place (see the module's docstring).
    """

    _cache: _Cache
    _pick: Callable[[_Entry], T]

    @overload
    def __init__(
        self: Store[JSON],
        *,
        transform: Transform | None = None,
        indexes: Mapping[str, IndexFunction] | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        *,
        decode: Callable[[JSON], T],
        transform: Transform | None = None,
        indexes: Mapping[str, IndexFunction] | None = None,
        keep_last_good: bool = False,
    ) -> None: ...

    def __init__(
        self,
        *,
        decode: Callable[[JSON], T] | None = None,
        transform: Transform | None = None,
        indexes: Mapping[str, IndexFunction] | None = None,
        keep_last_good: bool = False,
    ) -> None:
        self._cache = _Cache(transform, decode, indexes, keep_last_good)
        self._pick = _value

    @property
    def raw(self) -> Store[JSON]:
        """This store read as JSON (the objects as they were decoded from): the same cache,
        indexes, sync and change notifications."""
        view: Store[JSON] = Store.__new__(Store)
        view._cache, view._pick = self._cache, _raw
        return view

    # --- writing -----------------------------------------------------------------------------

    def decode(self, obj: JSON) -> T:
        """`obj` (as the API server sent it) transformed and decoded as this store does on the
        way in; raises what the decoder raises (for answers to our own writes). A version the
        store holds is not decoded again; any other is kept for the watch to file when it
        brings that version (see the module docstring)."""
        cache = self._cache
        key = ObjectKey.of(obj)
        version = _version(obj)
        held = cache.entries.get(key)
        if held is not None and version[1] and _version(held.raw) == version:
            return self._pick(held)
        entry = self._entry(obj)
        if version[1]:
            if len(cache.answers) >= ANSWER_MEMORY and key not in cache.answers:
                cache.answers.clear()
            cache.answers[key] = entry
        return self._pick(entry)

    def _entry(self, obj: JSON) -> _Entry:
        cache = self._cache
        raw = obj if cache.transform is None else cache.transform(obj)
        return _Entry(raw, raw if cache.decode is None else cache.decode(raw))

    def _incoming(
        self, key: ObjectKey, obj: JSON, held: _Entry | None, refused: dict[ObjectKey, JSON]
    ) -> _Entry | None:
        """The entry to hold for `obj` now that `held` is held under `key`: our own answer's
        when it is that version, else `obj` decoded, or when it does not decode (logged once
        per version, and recorded in `refused`) `held` if the store keeps the last good
        version of this incarnation, else None."""
        cache = self._cache
        answer = cache.answers.get(key)
        if answer is not None and _version(answer.raw) == _version(obj):
            del cache.answers[key]
            refused.pop(key, None)
            return answer
        raw = obj  # what is recorded if the transform itself fails
        try:
            raw = obj if cache.transform is None else cache.transform(obj)
            entry = _Entry(raw, raw if cache.decode is None else cache.decode(raw))
        except Exception as exc:  # the CRD schema should prevent this; never crash on it
            kept = None
            if cache.keep_last_good and held is not None and _same(held.raw, raw):
                kept = held
            last = cache.refused.get(key)
            if last is None or _version(last) != _version(raw):  # news: say it once
                if kept is None:
                    outcome = "left out of the cache"
                else:
                    outcome = (
                        "keeping the last version that decoded (resourceVersion "
                        f"{_meta(kept.raw).get('resourceVersion') or '?'})"
                    )
                log.error(
                    "%s %s (resourceVersion %s) is malformed; %s: %s",
                    obj.get("kind") or "object",
                    key,
                    _meta(raw).get("resourceVersion") or "?",
                    outcome,
                    "; ".join(error_messages(exc)),
                )
            refused[key] = raw
            return kept
        refused.pop(key, None)
        return entry

    def _replace(self, key: ObjectKey, new: _Entry | None) -> _Entry | None:
        """Store `new` under `key` (None: remove it), keeping the indexes in step."""
        cache = self._cache
        old = cache.entries.get(key)
        if old is not None:
            for index in cache.indexes.values():
                index.remove(key, old.raw)
        if new is None:
            cache.entries.pop(key, None)
        else:
            cache.entries[key] = new  # an update keeps the key's place in iteration order
            for index in cache.indexes.values():
                index.add(key, new.raw)
        return old

    def apply(self, event: WatchEvent) -> None:
        cache = self._cache
        changed: dict[ObjectKey, _Entry | None]  # key -> the entry before
        deliveries: list[Delivery]
        match event:
            case Init():
                cache.buffer = {}  # a second Init (relist restarted) drops the partial one
                cache.relisted = {}
                return
            case InitApply(obj):
                if cache.buffer is None:
                    raise WatchProtocolError("InitApply without Init")
                key = ObjectKey.of(obj)
                entry = self._incoming(key, obj, cache.entries.get(key), cache.relisted)
                if entry is not None:
                    cache.buffer[key] = entry
                return
            case InitDone():
                if cache.buffer is None:
                    raise WatchProtocolError("InitDone without Init")
                old, new = cache.entries, cache.buffer
                cache.entries, cache.buffer = new, None
                # what was refused and is not listed any more is gone
                cache.refused, cache.relisted = cache.relisted, {}
                cache.answers.clear()  # a relist may skip versions: they would never end
                for index in cache.indexes.values():
                    index.rebuild(new)
                changed = {
                    k: old.get(k)
                    for k in old.keys() | new.keys()
                    if _differ(old.get(k), new.get(k))
                }
                deliveries = [
                    Delivery.of(k, new[k].raw, relist=True)
                    if k in new
                    else Delivery.of(k, old[k].raw, deleted=True, relist=True)
                    for k in changed
                ]
                cache.synced.set()
            case Apply(obj):
                key = ObjectKey.of(obj)
                held = cache.entries.get(key)
                entry = self._incoming(key, obj, held, cache.refused)
                if entry is not None and entry is held:
                    changed = {}  # the last good version kept: no change
                else:
                    changed = {key: self._replace(key, entry)}
                deliveries = [Delivery.of(key, obj)]
            case Delete(obj):
                key = ObjectKey.of(obj)
                cache.refused.pop(key, None)
                cache.answers.pop(key, None)
                changed = {key: self._replace(key, None)}
                deliveries = [Delivery.of(key, obj, deleted=True)]
        for delivery in deliveries:
            for observe in cache.observers:
                observe(delivery)
        for key in sorted(changed):
            for sub in cache.subscribers:
                sub._push(key, changed[key])
        cache.changed.bump()

    # --- reading -----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first full list is in (it never goes back: a relist swaps atomically)."""
        return self._cache.synced.is_set()

    async def wait_synced(self) -> None:
        await self._cache.synced.wait()

    def get(self, key: ObjectKey) -> T | None:
        entry = self._cache.entries.get(key)
        return None if entry is None else self._pick(entry)

    def holds(self, key: ObjectKey) -> bool:
        """Whether the watch holds an object under `key`, whether or not it decoded: False
        only once it is gone (or was never there)."""
        return key in self._cache.entries or key in self._cache.refused

    def refused(self) -> dict[ObjectKey, JSON]:
        """The objects whose latest version the decoder refused, by key, as JSON (after the
        transform; a point-in-time copy). With `keep_last_good`, `get` answers the last
        version that decoded for those that had one."""
        return dict(self._cache.refused)

    def snapshot(self) -> dict[ObjectKey, T]:
        """A point-in-time copy of key -> object; later events do not change it."""
        return {key: self._pick(entry) for key, entry in self._cache.entries.items()}

    def values(self) -> list[T]:
        """A point-in-time list of the objects."""
        return [self._pick(entry) for entry in self._cache.entries.values()]

    def __len__(self) -> int:
        return len(self._cache.entries)

    def keys_for(self, index: str, value: Hashable) -> frozenset[ObjectKey]:
        """The keys of the objects index `index` files under `value`."""
        return frozenset(self._cache.indexes[index].keys.get(value, ()))

    def select(self, index: str, value: Hashable) -> dict[ObjectKey, T]:
        """The objects index `index` files under `value`, by key (a point-in-time copy)."""
        entries = self._cache.entries
        return {
            key: self._pick(entries[key]) for key in self._cache.indexes[index].keys.get(value, ())
        }

    async def wait_for(
        self,
        key: ObjectKey,
        predicate: Callable[[T | None], bool] = lambda obj: obj is not None,
    ) -> T | None:
        """Wait until `predicate(store.get(key))` holds (default: the key exists); returns it.
        Put a deadline around it (`trio.fail_after`)."""
        while True:
            seen = self._cache.changed.version
            obj = self.get(key)
            if predicate(obj):
                return obj
            await self._cache.changed.wait_past(seen)

    @contextmanager
    def subscribe(self) -> Iterator[KeyChanges[T]]:
        """`with store.subscribe() as changes: async for key in changes: ...`"""
        sub = KeyChanges(self._cache.entries.get, self._pick)
        self._cache.subscribers.append(sub)
        try:
            yield sub
        finally:
            self._cache.subscribers.remove(sub)

    def observe(self, observer: Callable[[Delivery], None]) -> None:
        """Call `observer` with every `Delivery`, synchronously, as the watch's events are
        applied (an `Overlay` follows the watch with it); it must not raise."""
        self._cache.observers.append(observer)


def _same(a: JSON, b: JSON) -> bool:
    """Whether `a` and `b` are versions of one incarnation (the same uid)."""
    return _meta(a).get("uid") == _meta(b).get("uid")


def _differ(a: _Entry | None, b: _Entry | None) -> bool:
    if a is None or b is None:
        return a is not b
    return a.raw != b.raw


# --- read your own writes ------------------------------------------------------------------------

# How many deliveries an Overlay remembers, to tell whether the watch delivered a write's
# version before the write's answer came back. A request that waited longer than this many
# deliveries for its answer is not kept (the watch is trusted instead).
OVERLAY_MEMORY: Final = 4096


@attrs.frozen
class Written(Generic[V]):
    """What a write of ours left under a key: the object's uid and resourceVersion as the API
    server answered (None when not known, e.g. from a NotFound), and `value`, what readers
    should see meanwhile (None: the object is gone)."""

    uid: str | None
    version: str | None
    value: V | None

    def passed_by(self, delivery: Delivery) -> bool:
        """Whether the watch, having delivered `delivery`, is at or past this write."""
        if delivery.relist:
            return True  # a relist may skip versions: from there on the watch is the word
        if self.version and delivery.version == self.version:
            return True
        return delivery.deleted and self.uid in (None, delivery.uid)


class Overlay(Generic[V]):
    """What this process last wrote per key, in front of a store until the watch shows it.

    The API server's answer to a write is news the watch brings later (under load, seconds
    later): `put` it here, and readers see it at once. An entry ends when the watch delivers
    the written version (the watch stream is ordered: from then on the store holds that version
    or a later one), deletes the written incarnation (its uid), or relists (which may skip
    versions). Versions are compared only for equality: a watch event with another version is
    an older one (so the entry stays), since a version the watch delivered before the answer
    came back is caught by `put` (`since`: the `position` taken before the request was sent).
    A version the store's decoder refused is delivered too (the watch did bring it), so behind
    a `keep_last_good` store an entry can end while the store still holds an older version:
    its reader then sees that one (the agent writes its status entry again, no harm done).
    """

    def __init__(self, store: Store[Any], *, memory: int = OVERLAY_MEMORY) -> None:
        self._entries: dict[ObjectKey, Written[V]] = {}
        # Entries the watch ended, not yet collected by `watched` (what readers saw last).
        self._ended: dict[ObjectKey, Written[V]] = {}
        self._memory = memory
        self._recent: deque[Delivery] = deque(maxlen=memory)
        self._position = 0
        store.observe(self._delivered)

    @property
    def position(self) -> int:
        """How many deliveries the watch has made: take it before sending a write."""
        return self._position

    def _delivered(self, delivery: Delivery) -> None:
        self._position += 1
        self._recent.append(delivery)
        entry = self._entries.get(delivery.key)
        if entry is not None and entry.passed_by(delivery):
            del self._entries[delivery.key]
            if len(self._ended) >= self._memory:
                self._ended.clear()
            self._ended[delivery.key] = entry

    def put(self, key: ObjectKey, written: Written[V], *, since: int | None = None) -> bool:
        """Show `written` for `key` until the watch passes it; False (and not kept) when it
        already has since position `since` (None: now), or when `since` is further back than
        the overlay remembers."""
        if since is not None:
            missed = self._position - since
            if missed > len(self._recent):
                return False
            if any(
                d.key == key and written.passed_by(d)
                for d in itertools.islice(reversed(self._recent), missed)
            ):
                return False
        self._ended.pop(key, None)
        self._entries[key] = written
        return True

    def get(self, key: ObjectKey) -> Written[V] | None:
        return self._entries.get(key)

    def pop(self, key: ObjectKey) -> None:
        self._entries.pop(key, None)
        self._ended.pop(key, None)

    def __contains__(self, key: ObjectKey) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[ObjectKey, Written[V]]]:
        return list(self._entries.items())

    def watched(self, key: ObjectKey) -> Written[V] | None:
        """For a reader of the store's changes, on a change of `key`: the entry readers saw
        before it (still in effect, or ended by the watch since the last call), if any."""
        ended = self._ended.pop(key, None)
        return self._entries.get(key, ended)


async def reflect(
    client: Client,
    res: Resource,
    store: Store[Any],
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
