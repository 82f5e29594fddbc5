"""The controller runner: changes in the primary and related stores reach the right primary keys,
nothing is reconciled before every store is synced, and shutdown is bounded. Stores are fed by
hand and time is trio's MockClock (autojump)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from trio.testing import MockClock

from akri_trio.address import ObjectKey
from akri_trio.kube.controller import Controller, each, labelled, owners
from akri_trio.kube.queue import Requeue
from akri_trio.kube.store import Change, Store, by_field
from akri_trio.kube.watch import Apply, Delete, Init, InitApply, InitDone


def obj(
    name: str,
    *,
    owner: tuple[str, str] | None = None,
    label: str | None = None,
    config: str | None = None,
    rv: int = 1,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": str(rv)}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "uid": "u-" + owner[1]}]
    if label is not None:
        meta["labels"] = {"akri.sh/instance": label}
    return {"metadata": meta, "spec": {} if config is None else {"configurationName": config}}


def k(name: str) -> ObjectKey:
    return ObjectKey("ns", name)


def synced(*objs: dict[str, Any], **kwargs: Any) -> Store:
    store = Store(**kwargs)
    sync(store, *objs)
    return store


def sync(store: Store, *objs: dict[str, Any]) -> None:
    store.apply(Init())
    for o in objs:
        store.apply(InitApply(o))
    store.apply(InitDone())


class Reconciles:
    """Records the keys reconciled, each after `work` seconds."""

    def __init__(self, work: float = 0.0) -> None:
        self.work = work
        self.keys: list[ObjectKey] = []

    async def __call__(self, key: ObjectKey) -> Requeue | None:
        await trio.sleep(self.work)
        self.keys.append(key)
        return None

    def since(self, mark: int) -> set[ObjectKey]:
        return set(self.keys[mark:])


@asynccontextmanager
async def running(controller: Controller) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run)
        yield
        nursery.cancel_scope.cancel()


async def settle() -> None:
    await trio.sleep(1)


async def test_primary_objects_are_reconciled_at_start_and_on_change(
    autojump_clock: MockClock,
) -> None:
    primary = synced(obj("a"), obj("b"))
    rec = Reconciles()
    async with running(Controller(rec, primary)):
        await settle()
        assert sorted(rec.keys) == [k("a"), k("b")]
        mark = len(rec.keys)
        primary.apply(Apply(obj("a", rv=2)))
        primary.apply(Delete(obj("b")))
        await settle()
        assert rec.since(mark) == {k("a"), k("b")}  # a deletion is reconciled too


async def test_nothing_is_reconciled_before_every_store_is_synced(
    autojump_clock: MockClock,
) -> None:
    primary = synced(obj("i"))
    pods = Store()
    rec = Reconciles()
    controller = Controller(rec, primary).watches(pods, owners("Instance"))
    started = trio.Event()

    async def run() -> None:
        await controller.run(task_status=_Started(started))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.sleep(10)
        assert rec.keys == [] and not started.is_set()
        sync(pods, obj("p", owner=("Instance", "i")))
        await settle()
        assert started.is_set()
        assert rec.keys == [k("i")]  # mapped twice (primary and pod), reconciled once
        nursery.cancel_scope.cancel()


class _Started:
    """A task_status for calling `run` directly (to observe when it reports started)."""

    def __init__(self, event: trio.Event) -> None:
        self.event = event

    def started(self, value: None = None) -> None:
        self.event.set()


async def test_owned_objects_reconcile_the_owner_they_had_and_the_one_they_have(
    autojump_clock: MockClock,
) -> None:
    primary = synced(obj("i1"), obj("i2"), obj("i3"))
    pods = synced(obj("p", owner=("Instance", "i1")), obj("q", owner=("Job", "j")))
    rec = Reconciles()
    async with running(Controller(rec, primary).watches(pods, owners("Instance"))):
        await settle()
        mark = len(rec.keys)
        pods.apply(Apply(obj("p", owner=("Instance", "i2"), rv=2)))  # adopted by another
        await settle()
        assert rec.since(mark) == {k("i1"), k("i2")}
        mark = len(rec.keys)
        pods.apply(Delete(obj("p", owner=("Instance", "i2"), rv=3)))
        await settle()
        assert rec.keys[mark:] == [k("i2")]  # the deleted pod's owner, from the stored copy
        mark = len(rec.keys)
        pods.apply(Apply(obj("q", owner=("Job", "j"), rv=4)))  # owned by another kind
        await settle()
        assert rec.keys[mark:] == []


async def test_labelled_objects_reconcile_the_object_their_label_names(
    autojump_clock: MockClock,
) -> None:
    primary = synced(obj("i1"))
    services = synced()
    rec = Reconciles()
    controller = Controller(rec, primary).watches(services, labelled("akri.sh/instance"))
    async with running(controller):
        await settle()
        mark = len(rec.keys)
        services.apply(Apply(obj("svc", label="i1")))
        services.apply(Apply(obj("other")))  # no label: nobody's
        await settle()
        assert rec.keys[mark:] == [k("i1")]


async def test_a_related_change_fans_out_through_an_index_of_the_primary(
    autojump_clock: MockClock,
) -> None:
    def config_of(o: dict[str, Any]) -> ObjectKey | None:
        name = o["spec"].get("configurationName")
        return None if name is None else ObjectKey(o["metadata"]["namespace"], name)

    instances = synced(
        obj("i1", config="c"),
        obj("i2", config="c"),
        obj("i3", config="d"),
        indexes={"config": by_field(config_of)},
    )
    configs = synced(obj("c"), obj("d"))
    rec = Reconciles()
    controller = Controller(rec, instances).watches(
        configs, each(lambda cfg: instances.keys_for("config", ObjectKey.of(cfg)))
    )
    async with running(controller):
        await settle()
        mark = len(rec.keys)
        configs.apply(Apply(obj("c", rv=2)))
        await settle()
        assert rec.since(mark) == {k("i1"), k("i2")}


async def test_a_mapper_can_filter_changes_that_cannot_matter(
    autojump_clock: MockClock,
) -> None:
    def config_changed(change: Change) -> list[ObjectKey]:
        before = (change.old or {}).get("spec")
        after = (change.new or {}).get("spec")
        return [] if before == after else [change.key]

    primary = synced(obj("a", config="c"))
    rec = Reconciles()
    controller = Controller(rec, synced()).watches(primary, config_changed)
    async with running(controller):
        await settle()
        mark = len(rec.keys)
        primary.apply(Apply(obj("a", config="c", rv=2)))  # metadata only
        await settle()
        assert rec.keys[mark:] == []
        primary.apply(Apply(obj("a", config="d", rv=3)))
        await settle()
        assert rec.keys[mark:] == [k("a")]


async def test_keys_sent_on_a_channel_are_reconciled_even_before_the_run(
    autojump_clock: MockClock,
) -> None:
    # A part the reconcile itself uses (built before the controller) wakes it through a channel.
    primary = synced(obj("a"))
    rec = Reconciles()
    wake, woken = trio.open_memory_channel[ObjectKey](math.inf)
    controller = Controller(rec, primary).reconciles_on(woken)
    wake.send_nowait(k("gone"))  # sent before the controller runs: kept until it does
    async with running(controller):
        await settle()
        assert sorted(rec.keys) == [k("a"), k("gone")]
        mark = len(rec.keys)
        wake.send_nowait(k("a"))
        await settle()
        assert rec.keys[mark:] == [k("a")]


async def test_shutdown_drains_in_flight_reconciles_within_the_bound(
    autojump_clock: MockClock,
) -> None:
    primary = synced(obj("a"))
    rec = Reconciles(work=100)
    controller = Controller(rec, primary, drain=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(controller.run)
        await trio.sleep(1)
        assert controller.queue.running == {k("a")}
        nursery.cancel_scope.cancel()
        cancelled_at = trio.current_time()
    assert trio.current_time() - cancelled_at == 3
    assert rec.keys == []  # cut off at the bound
