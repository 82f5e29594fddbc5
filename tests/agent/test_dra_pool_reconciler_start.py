"""The node-pool reconciler without a usable API server: it waits for its first list of the
node's slices as long as it takes (the watch retries; under the autojump clock, the silent
server a real TCP listener) instead of giving up; what it wants for a pool is that pool's
Instances on this node, in its namespace, read from the node view's typed store (an Instance
the model cannot read is not there)."""

from __future__ import annotations

from typing import Any

import httpx
import trio
import trio.testing

from akri_trio import dra
from akri_trio.agent.dra.pool_reconciler import SYNC_WARN_S, NodePoolReconciler
from akri_trio.agent.view import instance_store
from akri_trio.kube import Apply, Client, Init, InitApply, InitDone, Store
from akri_trio.model.convert import unstructure
from akri_trio.model.resources import Instance
from tests.dra.support import instance
from tests.support.silent_server import silent_api_server


async def test_a_slow_api_server_at_start_is_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with silent_api_server() as http, trio.open_nursery() as nursery:
        pools = NodePoolReconciler(
            Client(http), instance_store(), "n1", namespace=None, consumable=True
        )
        with trio.move_on_after(10 * SYNC_WARN_S) as waited:
            await nursery.start(pools.run)  # with a deadline it would have crashed
        assert waited.cancelled_caught  # still waiting for the first list, not started
        assert not pools.writer.written
        nursery.cancel_scope.cancel()


def _obj(version: str, description: str, **kw: Any) -> dict[str, Any]:
    obj: dict[str, Any] = unstructure(
        instance(kw.pop("name", "cam-abc123"), properties={"DESCRIPTION": description}, **kw)
    )
    obj["metadata"]["resourceVersion"] = version
    return obj


def _store(*objs: dict[str, Any]) -> Store[Instance]:
    store = instance_store()
    store.apply(Init())
    for obj in objs:
        store.apply(InitApply(obj))
    store.apply(InitDone())
    return store


async def test_an_instance_the_model_cannot_read_is_left_out_and_a_new_version_is_read() -> None:
    bad = {"metadata": {"name": "bad", "namespace": "ns", "resourceVersion": "1"}, "spec": 7}
    instances = _store(_obj("1", "a"), bad)
    pool = dra.node_pool("n1", "ns")
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:  # never called
        pools = NodePoolReconciler(Client(http), instances, "n1", namespace=None, consumable=True)
        wanted = pools.wanted(pool)
        assert wanted is not None
        assert [d["name"] for d in wanted.devices.devices] == ["cam-abc123"]
        instances.apply(Apply(_obj("2", "b")))
        changed = pools.wanted(pool)
        assert changed is not None
        (device,) = changed.devices.devices
        assert device["attributes"][dra.qualified("DESCRIPTION")] == {"string": "b"}


async def test_a_pool_wants_its_namespaces_local_instances_on_this_node() -> None:
    instances = _store(
        _obj("1", "a", name="cam-aaaaaa", namespace="a"),
        _obj("1", "b", name="cam-bbbbbb", namespace="b"),
        _obj("1", "c", name="cam-cccccc", namespace="a", nodes=("n2",)),
        _obj("1", "d", name="cam-dddddd", namespace="a", shared=True),
    )
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:  # never called
        pools = NodePoolReconciler(Client(http), instances, "n1", namespace=None, consumable=True)
        wanted = pools.wanted(dra.node_pool("n1", "a"))
        assert wanted is not None
        assert [d["name"] for d in wanted.devices.devices] == ["cam-aaaaaa"]
        assert wanted.placement == dra.node_placement("n1")
        assert wanted.labels == dra.pool_labels("node", "a")
        assert pools.wanted(dra.node_pool("n2", "a")) is None  # another node's
        scoped = NodePoolReconciler(Client(http), instances, "n1", namespace="b", consumable=True)
        assert scoped.wanted(dra.node_pool("n1", "a")) is None  # another namespace's
        assert scoped.wanted(dra.node_pool("n1", "b")) is not None
