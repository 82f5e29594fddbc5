"""DRA mode with slot devices on a real node: where the cluster lacks consumable capacity an
Instance of capacity 2 is published as two devices, and the real scheduler lets exactly two
claims hold it. The test bed serves consumable capacity, so the agent (in-process here) is told
to publish slots (`AgentSettings.dra_consumable_capacity=False`); the kubelet and containerd
prepare the claims through it as in tests/node/test_dra_node.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

from akri_trio import dra
from akri_trio.kube import Client, NotFound, Resource
from akri_trio.model import naming
from tests.support.kubectl import Kubectl, claim_pod
from tests.support.node_agent import (
    debug_echo_configuration,
    dra_agent_in_process,
    dra_class_and_template,
    fresh_namespace,
)
from tests.support.polling import until_api

pytestmark = pytest.mark.node

NS = "akri-dra-slots-e2e"
CONFIG = "dra-slots"
TEMPLATE = "dra-slots-d0"
PODS = Resource.core("pods", "Pod")
EVENTS = Resource.core("events", "Event")


def _pod(name: str) -> dict[str, Any]:
    return claim_pod(name, NS, "env | grep ^DEBUG_ECHO | sort; sleep 3600", TEMPLATE)


async def test_two_slot_devices_hold_two_claims_and_a_third_waits(
    node_cluster: dict[str, str],
) -> None:
    with tempfile.TemporaryDirectory(prefix="ak", dir="/tmp") as d:  # short: socket paths
        await _run(node_cluster, Path(d))


async def _run(node_cluster: dict[str, str], short_tmp: Path) -> None:
    kubectl = Kubectl(node_cluster)
    node = node_cluster["AKRI_TRIO_NODE_NAME"]
    inst = naming.instance_name(CONFIG, naming.device_hash("d0", node))
    other = naming.instance_name(CONFIG, naming.device_hash("d1", node))
    await trio.to_thread.run_sync(fresh_namespace, kubectl, NS)
    dra_class_and_template(kubectl, NS, CONFIG, TEMPLATE, inst)
    kubectl.apply(debug_echo_configuration(CONFIG, NS, ("d0", "d1"), capacity=2))
    async with dra_agent_in_process(
        node_cluster,
        NS,
        CONFIG,
        short_tmp,
        enable_debug_echo=True,
        debug_echo_availability=short_tmp / "availability",
        dra_consumable_capacity=False,
    ) as (api, _):
        await _story(api, kubectl, inst, other, node)


async def _story(api: Client, kubectl: Kubectl, inst: str, other: str, node: str) -> None:
    pool = dra.node_pool(node, NS)
    wanted = {dra.device_name(i, s) for i in (inst, other) for s in (0, 1)}

    async def published() -> bool:
        slices = (await api.list(dra.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")).items
        names = {
            d["name"] for s in slices if dra.pool_name_of(s) == pool for d in s["spec"]["devices"]
        }
        return names == wanted

    await until_api(published, what=f"slot devices {sorted(wanted)}")

    for name in ("a", "b"):
        await api.create(PODS, _pod(name))

    async def phase(name: str) -> str:
        return str((await api.get(PODS, name, namespace=NS)).get("status", {}).get("phase"))

    async def running(*names: str) -> bool:
        return all([await phase(n) == "Running" for n in names])

    await until_api(lambda: running("a", "b"), seconds=90, what="a and b Running")
    logs = await trio.to_thread.run_sync(kubectl, "logs", "a", "-n", NS)
    assert "DEBUG_ECHO_DESCRIPTION=d0" in logs.splitlines()
    held = set()
    for name in ("a", "b"):
        pod = await api.get(PODS, name, namespace=NS)
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = await api.get(dra.RESOURCE_CLAIMS, status["resourceClaimName"], namespace=NS)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        held.add(result["device"])
    assert held == {dra.device_name(inst, 0), dra.device_name(inst, 1)}

    await api.create(PODS, _pod("c"))  # after a and b hold both slots: c must wait

    async def unschedulable() -> bool:
        events = await api.list(EVENTS, namespace=NS, field_selector="involvedObject.name=c")
        return any(e.get("reason") == "FailedScheduling" for e in events.items)

    await until_api(unschedulable, seconds=60, what="c refused by the scheduler")
    assert await phase("c") == "Pending"
    await api.delete(PODS, "a", namespace=NS, grace_period_seconds=0)

    async def gone() -> bool:
        try:
            await api.get(PODS, "a", namespace=NS)
        except NotFound:
            return True
        return False

    await until_api(gone, seconds=60, what="a deleted")
    await until_api(lambda: running("c"), seconds=90, what="c Running on the freed slot")
