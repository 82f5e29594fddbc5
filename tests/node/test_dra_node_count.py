"""`limits: {akri.sh/<configuration>: 2}` in DRA mode on a real node: what the scheduler gives a
Pod written for device-plugin mode that asks for two devices of a Configuration.

Two Instances (d0, d1) of capacity 2. With consumable capacity (one device per Instance) the
Pod gets two different Instances, as in device-plugin mode, whose configuration-level plugin
gives one container's request distinct Instances: the allocator never takes one device twice
for one request. With slot devices (`<instance>-<i>`, where the cluster has no consumable
capacity) it takes the first two free devices in the pool, two slots of ONE Instance. The
agent runs in-process, told which way to publish (the test bed serves both)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import trio

from akri_trio import dra
from akri_trio.kube import Client, Resource
from akri_trio.model import naming
from tests.support.kubectl import Kubectl, busybox_pod
from tests.support.node_agent import (
    debug_echo_configuration,
    dra_agent_in_process,
    fresh_namespace,
)
from tests.support.polling import until_api

pytestmark = pytest.mark.node

NS = "akri-dra-count-e2e"
CONFIG = "dra-count"
PODS = Resource.core("pods", "Pod")


@pytest.mark.k8s_feature("DRAExtendedResource")
@pytest.mark.parametrize("consumable", [True, False], ids=["consumable", "slots"])
async def test_two_of_a_configuration(node_cluster: dict[str, str], consumable: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="ak", dir="/tmp") as d:  # short: socket paths
        kubectl = Kubectl(node_cluster)
        node = node_cluster["AKRI_TRIO_NODE_NAME"]
        instances = {
            naming.instance_name(CONFIG, naming.device_hash(desc, node)): desc
            for desc in ("d0", "d1")
        }
        await trio.to_thread.run_sync(fresh_namespace, kubectl, NS)
        kubectl.apply(dra.device_class(CONFIG, NS))  # the controller's, with akri.sh/dra-count
        kubectl.apply(debug_echo_configuration(CONFIG, NS, ("d0", "d1"), capacity=2))
        async with dra_agent_in_process(
            node_cluster,
            NS,
            CONFIG,
            Path(d),
            enable_debug_echo=True,
            debug_echo_availability=Path(d) / "availability",
            dra_consumable_capacity=consumable,
        ) as (api, _):
            held = await _two(api, kubectl, node, consumable)
    if consumable:
        assert sorted(held) == sorted(instances)  # two different Instances
    else:
        (one,) = set(held)  # two slots of one Instance
        assert one in instances


async def _two(api: Client, kubectl: Kubectl, node: str, consumable: bool) -> list[str]:
    """The Instance of each device the Pod's claim was allocated."""
    pool = dra.node_pool(node, NS)
    devices = 2 if consumable else 4

    async def published() -> bool:
        slices = (await api.list(dra.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")).items
        return devices == sum(
            len(s["spec"]["devices"]) for s in slices if dra.pool_name_of(s) == pool
        )

    await until_api(published, what=f"{devices} devices published")
    script = "env | grep ^DEBUG_ECHO_DESCRIPTION | sort; sleep 3600"
    await api.create(PODS, busybox_pod("two", NS, script, {f"akri.sh/{CONFIG}": 2}))

    async def running() -> bool:
        pod = await api.get(PODS, "two", namespace=NS)
        return bool(pod.get("status", {}).get("phase") == "Running")

    await until_api(running, seconds=120, what="the Pod asking for two Running")
    pod = await api.get(PODS, "two", namespace=NS)
    name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = await api.get(dra.RESOURCE_CLAIMS, name, namespace=NS)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and all(r["pool"] == pool for r in results), results
    assert len({r["device"] for r in results}) == 2  # never one device twice
    by_device = {
        d["name"]: d["attributes"]["akri.sh/instance"]["string"]
        for s in (await api.list(dra.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")).items
        if dra.pool_name_of(s) == pool
        for d in s["spec"]["devices"]
    }
    held = [by_device[r["device"]] for r in results]
    # The container got each allocated Instance's properties (KEY_<HASH> per Instance).
    logs = await trio.to_thread.run_sync(kubectl, "logs", "two", "-n", NS)
    hashed = [line for line in logs.splitlines() if line.startswith("DEBUG_ECHO_DESCRIPTION_")]
    assert len(hashed) == len(set(held)), logs
    return held
