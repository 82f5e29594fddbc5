"""An Instance's capacity is bounded twice: by the Instance CRD's schema on the real API server
(as the Configuration's is), and by the agent, which serves at most `--max-capacity` slots of an
Instance whatever it says (an Instance written before the bound, or a CRD installed without it)
and logs the clamp once."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from akri_trio.address import ObjectKey
from akri_trio.agent.dra.pool_reconciler import NodePoolReconciler
from akri_trio.agent.plugins import slots
from akri_trio.agent.view import NodeView, instance_store
from akri_trio.dra import node_pool
from akri_trio.kube import Init, InitApply, InitDone
from akri_trio.kube.client import Client
from akri_trio.kube.errors import Invalid
from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.model.resources import INSTANCES
from tests.support.akri_cluster import ensure_namespace, install_crds
from tests.support.polling import until_api

NODE = "node-a"
NS = "instance-capacity"
HUGE = 3_000_000


def _instance(name: str, capacity: int) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "7"},
        "spec": {
            "configurationName": "cam",
            "cdiName": "akri.sh/cam=8120fe",
            "capacity": capacity,
            "nodes": [NODE],
        },
    }


def test_the_agent_serves_at_most_max_capacity_slots_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = NodeView(NODE, max_capacity=8)
    caplog.set_level(logging.WARNING, "akri_trio.agent.view")
    inst = view.put_instance(_instance("cam-8120fe", HUGE))
    assert inst.spec.capacity == 8
    held = view.instance(ObjectKey(NS, "cam-8120fe"))
    assert held is not None and held.spec.capacity == 8
    devices = slots.instance_devices("cam-8120fe", held.spec.capacity, {}, NODE)
    assert [d.id for d in devices] == [f"cam-8120fe-{i}" for i in range(8)]
    again = _instance("cam-8120fe", HUGE)
    again["metadata"]["resourceVersion"] = "8"
    view.put_instance(again)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"Instance {NS}/cam-8120fe: capacity {HUGE} is over this agent's maximum 8 "
        "(--max-capacity); serving 8 slots"
    ]


def test_an_instance_within_the_maximum_is_served_as_it_is() -> None:
    view = NodeView(NODE, max_capacity=8)
    assert view.put_instance(_instance("cam-8120fe", 8)).spec.capacity == 8
    assert NodeView(NODE).max_capacity == MAX_CAPACITY


@pytest.mark.k8s
async def test_the_instance_crd_refuses_a_capacity_over_the_maximum(api: Client) -> None:
    await install_crds(api)
    await ensure_namespace(api, NS)
    name = "huge-capacity"

    async def refused() -> bool:
        try:
            await api.create(INSTANCES, _instance(name, HUGE), namespace=NS)
        except Invalid as exc:
            assert "spec.capacity" in str(exc) and str(MAX_CAPACITY) in str(exc)
            return True
        await api.delete(INSTANCES, name, namespace=NS)
        return False

    # a CRD's new schema reaches the API server's handlers shortly after
    await until_api(refused, 30, f"capacity {HUGE} refused", poll=0.2)
    body = _instance(name, MAX_CAPACITY)
    del body["metadata"]["resourceVersion"]
    created = await api.create(INSTANCES, body, namespace=NS)
    try:
        assert created["spec"]["capacity"] == MAX_CAPACITY
    finally:
        await api.delete(INSTANCES, name, namespace=NS)


async def test_dra_publishes_at_most_max_capacity_slots() -> None:
    """The pool reconciler reads the node view's store, whose decoder clamps capacity."""
    store = instance_store(max_capacity=8)
    store.apply(Init())
    store.apply(InitApply(_instance("cam-8120fe", HUGE)))
    store.apply(InitDone())
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:  # never called
        pools = NodePoolReconciler(Client(http), store, NODE, namespace=None, consumable=False)
        (inst,) = store.values()
        wanted = pools.wanted(node_pool(NODE, inst.metadata.namespace))
    assert wanted is not None
    assert len(wanted.devices.devices) == 8
