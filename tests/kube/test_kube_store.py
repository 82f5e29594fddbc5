"""The reflector cache: atomic relists, per-key notifications, sync waits, stable snapshots."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from akri_trio.kube.store import KeyChanges, Store, object_key
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


def drain(changes: KeyChanges) -> list[str]:
    keys = list(changes._pending)
    changes._pending.clear()
    return keys


def test_object_key() -> None:
    assert object_key(obj("a")) == "ns/a"
    assert object_key(obj("node1", namespace=None)) == "node1"
    with pytest.raises(ValueError):
        object_key({"metadata": {}})


def test_relist_is_invisible_until_init_done() -> None:
    store = listed(obj("a"), obj("b"))
    store.apply(Init())
    store.apply(InitApply(obj("c")))
    assert set(store.snapshot()) == {"ns/a", "ns/b"}  # readers still see the old world
    store.apply(InitDone())
    assert set(store.snapshot()) == {"ns/c"}  # a and b were deleted while we were away


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
        assert sorted(drain(changes)) == ["ns/changed", "ns/gone", "ns/new"]


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
    assert set(store.snapshot()) == {"ns/fresh"}


def test_init_apply_or_done_without_init_is_an_error() -> None:
    with pytest.raises(WatchProtocolError):
        Store().apply(InitApply(obj("a")))
    with pytest.raises(WatchProtocolError):
        Store().apply(InitDone())


def test_apply_and_delete() -> None:
    store = listed()
    with store.subscribe() as changes:
        store.apply(Apply(obj("a", 2)))
        assert store.get("ns/a") == obj("a", 2)
        store.apply(Delete(obj("a", 3)))
        assert store.get("ns/a") is None
        store.apply(Delete(obj("never-seen", 4)))  # harmless
        assert drain(changes) == ["ns/a", "ns/never-seen"]
    assert len(store) == 0


def test_snapshot_is_a_point_in_time_copy() -> None:
    store = listed(obj("a"))
    snap = store.snapshot()
    store.apply(Apply(obj("b")))
    store.apply(Delete(obj("a")))
    assert set(snap) == {"ns/a"}


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
                "ns/a", lambda o: o is not None and o["metadata"]["resourceVersion"] == "3"
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
    got: list[str] = []
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
            assert got == ["ns/x", "ns/y"]  # ten events, two keys
            store.apply(Apply(obj("x", 9)))
            await trio.testing.wait_all_tasks_blocked()
            assert got == ["ns/x", "ns/y", "ns/x"]
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
        assert drain(changes) == ["b", "ns/a"]
