"""Device health in Pod status (KEP-4680) in DRA mode on a real node: the real kubelet (1.37,
ResourceHealthStatus on by default) watches the agent plugin's health stream and shows the
device a running container holds in its `allocatedResourcesStatus`: Healthy, Unhealthy with
why while debugEcho says OFFLINE (the Pod keeps running, as in device-plugin mode), Healthy
again once it is back. The agent runs in-process; it registers its plugin afresh, so the
kubelet negotiates the health service without a restart."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

from akri_trio import dra
from akri_trio.dra.health import OFFLINE
from akri_trio.kube import Client, Resource
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

NS = "akri-dra-health-e2e"
CONFIG = "dra-health"
TEMPLATE = "dra-health-d0"
PODS = Resource.core("pods", "Pod")


@pytest.mark.k8s_feature("ResourceHealthStatus")
async def test_a_running_pod_shows_its_device_s_health(node_cluster: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="ak", dir="/tmp") as d:  # short: socket paths
        kubectl = Kubectl(node_cluster)
        node = node_cluster["AKRI_TRIO_NODE_NAME"]
        inst = naming.instance_name(CONFIG, naming.device_hash("d0", node))
        await trio.to_thread.run_sync(fresh_namespace, kubectl, NS)
        dra_class_and_template(kubectl, NS, CONFIG, TEMPLATE, inst)
        kubectl.apply(debug_echo_configuration(CONFIG, NS, ("d0",), capacity=1))
        availability = Path(d) / "availability"
        async with dra_agent_in_process(
            node_cluster,
            NS,
            CONFIG,
            Path(d),
            enable_debug_echo=True,
            debug_echo_availability=availability,
        ) as (api, _):
            await _story(api, availability)


async def _story(api: Client, availability: Path) -> None:
    await api.create(PODS, claim_pod("p", NS, "sleep 3600", TEMPLATE))

    async def health() -> list[dict[str, Any]]:
        pod = await api.get(PODS, "p", namespace=NS)
        if pod.get("status", {}).get("phase") != "Running":
            return []
        (container,) = pod["status"].get("containerStatuses") or [{}]
        statuses = container.get("allocatedResourcesStatus") or []
        return [r for s in statuses if s["name"] == "claim:claim" for r in s["resources"]]

    async def reads(state: str) -> list[dict[str, Any]]:
        found = await health()
        return found if [r.get("health") for r in found] == [state] else []

    (healthy,) = await until_api(lambda: reads("Healthy"), seconds=120, what="Healthy")
    pod = await api.get(PODS, "p", namespace=NS)
    (claim,) = pod["status"]["resourceClaimStatuses"]
    uid = (await api.get(dra.RESOURCE_CLAIMS, claim["resourceClaimName"], namespace=NS))[
        "metadata"
    ]["uid"]
    assert healthy["resourceID"] == dra.cdi_device_id(uid, 0)  # the kubelet names it so

    await trio.Path(availability).write_text("OFFLINE")
    (unhealthy,) = await until_api(lambda: reads("Unhealthy"), seconds=90, what="Unhealthy")
    assert unhealthy["resourceID"] == healthy["resourceID"]
    assert unhealthy.get("message") == OFFLINE
    assert (await api.get(PODS, "p", namespace=NS))["status"]["phase"] == "Running"

    await trio.Path(availability).write_text("")
    await until_api(lambda: reads("Healthy"), seconds=90, what="Healthy again")
