"""One controller shape: watch a primary resource and what relates to it, reconcile per key.

Every controller here (the agent's per-Configuration loop, the broker controller) is the same
loop: stores kept by watches, each change mapped to the key(s) of the primary object(s) it
concerns, one per-key `ReconcileQueue`, and a reconcile function that reads the stores and
drives the world toward them. `Controller` is that loop; only the stores, the mappers and the
reconcile differ (after kube-rs's `Controller::new(..).owns(..).watches(..)`).

A mapper is a pure function of a `Change` (key, object before, object now) to primary keys, so
an object that moved from one owner to another, or was deleted, re-reconciles the owner it had
as well as the one it has; it may also return nothing for changes that cannot matter (a filter).
`each`, `owners` and `labelled` build mappers from the usual relations:

    instances = Store(transform=drop_managed_fields, indexes={"config": by_field(config_of)})
    controller = (
        Controller(reconcile_instance, instances, workers=4)
        .watches(pods, owners("Instance"))
        .watches(services, labelled(LABEL_INSTANCE))
        .watches(configs, each(lambda cfg: instances.keys_for("config", ObjectKey.of(cfg))))
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reflect, client, INSTANCES, instances)
        nursery.start_soon(reflect, client, PODS, pods)  # ... one watch per store
        await nursery.start(controller.run)

Nothing is reconciled before every store has its first full list: a reconcile that looked at a
half-filled store of Pods would create brokers that already exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

from akri_trio.address import ObjectKey
from akri_trio.kube.client import JSON
from akri_trio.kube.queue import DRAIN_S, QUEUE_BACKOFF, Reconcile, ReconcileQueue
from akri_trio.kube.store import Change, Store
from akri_trio.runtime import Backoff

# A mapper of a typed store reads typed changes (`Change[Instance]`).
Mapper = Callable[[Change[Any]], Iterable[ObjectKey]]


def itself(change: Change[Any]) -> Iterable[ObjectKey]:
    """The primary resource's mapper: a change to an object reconciles that object."""
    return (change.key,)


def each(keys_of: Callable[[JSON], Iterable[ObjectKey]]) -> Mapper:
    """A mapper that applies `keys_of` to the object before and the object now."""

    def mapper(change: Change[Any]) -> Iterable[ObjectKey]:
        keys: dict[ObjectKey, None] = {}
        for obj in (change.old, change.new):
            if obj is not None:
                keys.update(dict.fromkeys(keys_of(obj)))
        return keys

    return mapper


def owners(kind: str, *, namespaced: bool = True) -> Mapper:
    """Maps an owned object to its owners of `kind`, through `metadata.ownerReferences`.
    Owners are in the object's namespace, or cluster-scoped when `namespaced` is False."""

    def keys_of(obj: JSON) -> Iterable[ObjectKey]:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "") if namespaced else ""
        refs = meta.get("ownerReferences") or ()
        return [ObjectKey(namespace, ref["name"]) for ref in refs if ref.get("kind") == kind]

    return each(keys_of)


def labelled(label: str, *, namespaced: bool = True) -> Mapper:
    """Maps an object to the primary object named by its label `label` (none without it),
    in the object's namespace, or cluster-scoped when `namespaced` is False."""

    def keys_of(obj: JSON) -> Iterable[ObjectKey]:
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(label)
        if not value:
            return ()
        return (ObjectKey(str(meta.get("namespace") or "") if namespaced else "", value),)

    return each(keys_of)


@attrs.frozen
class Watched:
    """A store whose changes reconcile the primary objects `mapper` names."""

    store: Store[Any]
    mapper: Mapper


class Controller:
    """`Controller(reconcile, primary)`, `.watches(store, mapper)` for each related resource,
    then `await nursery.start(controller.run)`; `controller.queue.enqueue(key)` also
    reconciles a key on other news (a timer, a discovery result). A part built before the
    controller (one the reconcile itself uses) sends such keys into a channel the controller
    `reconciles_on` instead."""

    def __init__(
        self,
        reconcile: Reconcile[ObjectKey],
        primary: Store[Any],
        *,
        workers: int = 4,
        backoff: Backoff = QUEUE_BACKOFF,
        drain: float = DRAIN_S,
        mapper: Mapper = itself,
    ) -> None:
        """`mapper`: the primary's own, for a reconcile keyed by something other than the
        primary object (e.g. a pool its objects belong to)."""
        self.queue = ReconcileQueue(reconcile, workers=workers, backoff=backoff, drain=drain)
        self.sources: list[Watched] = [Watched(primary, mapper)]
        self.triggers: list[trio.MemoryReceiveChannel[ObjectKey]] = []

    def watches(self, store: Store[Any], mapper: Mapper) -> Controller:
        """Reconcile `mapper(change)` on every change in `store`; returns the controller."""
        self.sources.append(Watched(store, mapper))
        return self

    def reconciles_on(self, keys: trio.MemoryReceiveChannel[ObjectKey]) -> Controller:
        """Reconcile every key received on `keys` (as kube-rs's `reconcile_on`): news that is
        not a watched change, from parts that cannot hold the controller because the reconcile
        holds them. Returns the controller."""
        self.triggers.append(keys)
        return self

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Wait for every store's first list, map what is there, then reconcile until
        cancelled. Reports started once every existing object has been mapped."""
        for source in self.sources:
            await source.store.wait_synced()
        async with trio.open_nursery() as nursery:
            for source in self.sources:
                await nursery.start(self._route, source)
            for keys in self.triggers:
                nursery.start_soon(self._receive, keys)
            await nursery.start(self.queue.run)
            task_status.started()

    async def _route(self, source: Watched, *, task_status: trio.TaskStatus[None]) -> None:
        # Subscribe before the snapshot: a change in between is mapped twice, never missed.
        with source.store.subscribe() as changes:
            for key, obj in source.store.snapshot().items():
                self._enqueue(source.mapper(Change(key, None, obj)))
            task_status.started()
            while True:
                self._enqueue(source.mapper(await changes.next_change()))

    async def _receive(self, keys: trio.MemoryReceiveChannel[ObjectKey]) -> None:
        async for key in keys:
            self.queue.enqueue(key)

    def _enqueue(self, keys: Iterable[ObjectKey]) -> None:
        for key in keys:
            self.queue.enqueue(key)
