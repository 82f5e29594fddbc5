"""The reflector cache: atomic relists, per-key notifications, sync waits, stable snapshots,
the transform on the way in, and indexes that always equal the ones recomputed from scratch."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from akri_trio.address import ObjectKey
from akri_trio.kube.store import (
    KeyChanges,
    Store,
    by_field,
    by_label,
    by_owner,
    drop_managed_fields,
)
from akri_trio.kube.watch import (
    Apply,
    Delete,
    Init,
    InitApply,
    InitDone,
    WatchEvent,
    WatchProtocolError,
)


def obj(name: str, rv: int = 1, namespace: str | None = "ns") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


def listed(*objs: dict[str, Any]) -> Store:
    store = Store()
    events: list[WatchEvent] = [Init(), *(InitApply(o) for o in objs), InitDone()]
    for event in events:
        store.apply(event)
    return store


def k(name: str, namespace: str = "ns") -> ObjectKey:
    return ObjectKey(namespace, name)


def drain(changes: KeyChanges) -> list[ObjectKey]:
    keys = list(changes._pending)
    changes._pending.clear()
    return keys


def test_relist_is_invisible_until_init_done() -> None:
    store = listed(obj("a"), obj("b"))
    store.apply(Init())
    store.apply(InitApply(obj("c")))
    assert set(store.snapshot()) == {k("a"), k("b")}  # readers still see the old world
    store.apply(InitDone())
    assert set(store.snapshot()) == {k("c")}  # a and b were deleted while we were away


def test_relist_notifies_exactly_the_keys_that_differ() -> None:
    store = listed(obj("same", 1), obj("changed", 1), obj("gone", 1))
    with store.subscribe() as changes:
        relist: list[WatchEvent] = [
            Init(),
            InitApply(obj("same", 1)),
            InitApply(obj("changed", 2)),
            InitApply(obj("new", 3)),
            InitDone(),
        ]
        for event in relist:
            store.apply(event)
        assert sorted(drain(changes)) == [k("changed"), k("gone"), k("new")]


def test_a_second_init_drops_the_partial_relist() -> None:
    store = Store()
    events: list[WatchEvent] = [
        Init(),
        InitApply(obj("stale")),
        Init(),
        InitApply(obj("fresh")),
        InitDone(),
    ]
    for event in events:
        store.apply(event)
    assert set(store.snapshot()) == {k("fresh")}


def test_init_apply_or_done_without_init_is_an_error() -> None:
    with pytest.raises(WatchProtocolError):
        Store().apply(InitApply(obj("a")))
    with pytest.raises(WatchProtocolError):
        Store().apply(InitDone())


def test_apply_and_delete() -> None:
    store = listed()
    with store.subscribe() as changes:
        store.apply(Apply(obj("a", 2)))
        assert store.get(k("a")) == obj("a", 2)
        store.apply(Delete(obj("a", 3)))
        assert store.get(k("a")) is None
        store.apply(Delete(obj("never-seen", 4)))  # harmless
        assert drain(changes) == [k("a"), k("never-seen")]
    assert len(store) == 0


def test_snapshot_is_a_point_in_time_copy() -> None:
    store = listed(obj("a"))
    snap = store.snapshot()
    store.apply(Apply(obj("b")))
    store.apply(Delete(obj("a")))
    assert set(snap) == {k("a")}


async def test_wait_synced_waits_for_the_first_init_done() -> None:
    store = Store()
    done = trio.Event()

    async def waiter() -> None:
        await store.wait_synced()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        store.apply(Init())
        store.apply(InitApply(obj("a")))
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set() and not store.synced
        store.apply(InitDone())
        await trio.testing.wait_all_tasks_blocked()
        assert done.is_set() and store.synced


async def test_wait_for_a_predicate_on_a_key() -> None:
    store = listed()
    result: list[Any] = []

    async def waiter() -> None:
        result.append(
            await store.wait_for(
                k("a"), lambda o: o is not None and o["metadata"]["resourceVersion"] == "3"
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        store.apply(Apply(obj("a", 2)))
        store.apply(Apply(obj("b", 3)))
        await trio.testing.wait_all_tasks_blocked()
        assert result == []
        store.apply(Apply(obj("a", 3)))
    assert result == [obj("a", 3)]


async def test_key_changes_coalesce_and_keep_first_seen_order() -> None:
    store = listed()
    got: list[ObjectKey] = []
    with store.subscribe() as changes:
        for rv in range(5):
            store.apply(Apply(obj("x", rv)))
            store.apply(Apply(obj("y", rv)))
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                async for key in changes:
                    got.append(key)

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert got == [k("x"), k("y")]  # ten events, two keys
            store.apply(Apply(obj("x", 9)))
            await trio.testing.wait_all_tasks_blocked()
            assert got == [k("x"), k("y"), k("x")]
            nursery.cancel_scope.cancel()
    store.apply(Apply(obj("z")))  # unsubscribed: nobody is told, nothing piles up
    assert drain(changes) == []


def test_a_subscriber_from_before_the_first_sync_hears_every_key() -> None:
    store = Store()
    events: list[WatchEvent] = [
        Init(),
        InitApply(obj("a")),
        InitApply(obj("b", namespace=None)),
        InitDone(),
    ]
    with store.subscribe() as changes:
        for event in events:
            store.apply(event)
        assert drain(changes) == [k("b", ""), k("a")]


# --- transform and indexes ----------------------------------------------------------------------

MANAGED = [{"manager": "kubectl", "fieldsV1": {"f:data": {}}}]


def pod(
    name: str,
    *,
    app: str | None = None,
    owners: tuple[tuple[str, str], ...] = (),
    config: str | None = None,
    namespace: str = "ns",
    rv: int = 1,
) -> dict[str, Any]:
    """An object with what the indexes below look at: a label, owners (kind, uid), a field."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": str(rv)}
    if app is not None:
        meta["labels"] = {"app": app}
    if owners:
        meta["ownerReferences"] = [{"kind": kind, "uid": uid} for kind, uid in owners]
    meta["managedFields"] = MANAGED
    return {"metadata": meta, "spec": {} if config is None else {"configurationName": config}}


def config_of(o: dict[str, Any]) -> ObjectKey | None:
    name = o["spec"].get("configurationName")
    return None if name is None else ObjectKey(o["metadata"]["namespace"], name)


INDEXES = {
    "app": by_label("app"),
    "owner": by_owner(),
    "instance-owner": by_owner("Instance"),
    "config": by_field(config_of),
}


def indexed_store() -> Store:
    return Store(transform=drop_managed_fields, indexes=INDEXES)


def test_drop_managed_fields_keeps_everything_else() -> None:
    o = pod("a", app="x")
    out = drop_managed_fields(o)
    assert "managedFields" not in out["metadata"]
    assert {**out["metadata"], "managedFields": MANAGED} == o["metadata"]
    assert out["spec"] is o["spec"]
    assert o["metadata"]["managedFields"] == MANAGED  # the input is not mutated
    plain = {"metadata": {"name": "b"}}
    assert drop_managed_fields(plain) is plain


def test_the_transform_applies_to_listed_and_watched_objects() -> None:
    store = indexed_store()
    events: list[WatchEvent] = [Init(), InitApply(pod("a")), InitDone(), Apply(pod("b"))]
    for event in events:
        store.apply(event)
    for key in (k("a"), k("b")):
        stored = store.get(key)
        assert stored is not None and "managedFields" not in stored["metadata"]


def test_indexes_answer_by_label_owner_and_field() -> None:
    store = indexed_store()
    store.apply(Init())
    store.apply(InitApply(pod("a", app="x", owners=(("Instance", "u1"),), config="c1")))
    store.apply(InitApply(pod("b", app="x", owners=(("Instance", "u1"), ("Job", "u2")))))
    store.apply(InitApply(pod("c", app="y", owners=(("Job", "u2"),), config="c1")))
    store.apply(InitDone())
    assert store.keys_for("app", "x") == {k("a"), k("b")}
    assert store.keys_for("owner", "u2") == {k("b"), k("c")}
    assert store.keys_for("instance-owner", "u2") == frozenset()
    assert store.keys_for("instance-owner", "u1") == {k("a"), k("b")}
    assert set(store.select("config", ObjectKey("ns", "c1"))) == {k("a"), k("c")}
    assert store.keys_for("app", "nobody") == frozenset()

    store.apply(Apply(pod("a", app="y", config="c2", rv=2)))  # relabelled, orphaned, moved
    assert store.keys_for("app", "x") == {k("b")}
    assert store.keys_for("app", "y") == {k("a"), k("c")}
    assert store.keys_for("instance-owner", "u1") == {k("b")}
    assert store.keys_for("config", ObjectKey("ns", "c2")) == {k("a")}
    store.apply(Delete(pod("b")))
    assert store.keys_for("owner", "u1") == frozenset()
    assert store.select("app", "x") == {}


async def test_next_change_gives_the_object_before_the_first_unread_change() -> None:
    store = indexed_store()
    store.apply(Init())
    store.apply(InitApply(pod("a", app="x")))
    store.apply(InitDone())
    before = store.get(k("a"))
    with store.subscribe() as changes:
        store.apply(Apply(pod("a", app="y", rv=2)))
        store.apply(Apply(pod("a", app="z", rv=3)))
        store.apply(Delete(pod("a", rv=4)))
        store.apply(Apply(pod("b", rv=5)))
        first = await changes.next_change()
        assert (first.key, first.old, first.new) == (k("a"), before, None)
        second = await changes.next_change()
        assert (second.key, second.old, second.new) == (k("b"), None, store.get(k("b")))


# A random history: watched changes, deletions, and relists (some abandoned half-way).
names = st.sampled_from(["a", "b", "c", "d"])
random_pods = st.builds(
    pod,
    names,
    app=st.sampled_from([None, "x", "y"]),
    owners=st.lists(
        st.tuples(st.sampled_from(["Instance", "Job"]), st.sampled_from(["u1", "u2", "u3"])),
        max_size=2,
    ).map(tuple),
    config=st.sampled_from([None, "c1", "c2"]),
    namespace=st.sampled_from(["ns", "other"]),
)
steps = st.one_of(
    st.builds(Apply, random_pods),
    st.builds(Delete, random_pods),
    st.lists(random_pods, max_size=5).map(lambda objs: ("relist", objs)),
    st.lists(random_pods, max_size=3).map(lambda objs: ("abandoned relist", objs)),
)


def recomputed(store: Store, name: str) -> dict[Any, set[ObjectKey]]:
    out: dict[Any, set[ObjectKey]] = {}
    for key, o in store.snapshot().items():
        for value in INDEXES[name](o):
            out.setdefault(value, set()).add(key)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, max_size=30))
def test_indexes_always_equal_the_ones_recomputed_from_scratch(
    history: list[Apply | Delete | tuple[str, list[dict[str, Any]]]],
) -> None:
    store = indexed_store()
    store.apply(Init())
    store.apply(InitDone())
    for step in history:
        if isinstance(step, tuple):
            kind, objs = step
            events: list[WatchEvent] = [Init(), *(InitApply(o) for o in objs)]
            if kind == "relist":
                events.append(InitDone())
            for event in events:
                store.apply(event)
        else:
            store.apply(step)
        for name in INDEXES:
            expected = recomputed(store, name)
            assert store._cache.indexes[name].keys == expected  # no stale values, no empty sets
            for value, keys in expected.items():
                assert store.keys_for(name, value) == keys
                assert store.select(name, value) == {key: store.get(key) for key in keys}


def test_an_update_keeps_the_key_in_its_place() -> None:
    store = listed(obj("a"), obj("b"))
    store.apply(Apply(obj("a", 2)))
    assert list(store.snapshot()) == [k("a"), k("b")]
