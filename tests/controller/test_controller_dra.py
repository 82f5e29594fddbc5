"""The controller in DRA mode against the real control plane (resource.k8s.io/v1, the
scheduler allocating claims, kube-controller-manager making claims from templates), and in
device-plugin mode deleting the DeviceClasses and shared pools DRA mode left.

The test writes Instances as agents would. DeviceClasses and ResourceSlices are cluster-scoped:
each test's objects carry its own namespace in their names and labels, and are deleted at the
end whatever happens (the namespace's deletion does not reach them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any

import trio

from akri_trio import dra
from akri_trio.controller.run import ControllerSettings, RunningController
from akri_trio.dra import (
    DEVICE_CLASSES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from akri_trio.kube import JSON, Client, NotFound
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.controller.support import (
    NODES,
    PODS,
    broker_config,
    brokers,
    make_instance,
    namespace,
    pod_spec,
    running_controller,
    unique,
)
from tests.support.polling import until_api
from tests.support.releases import lacks, skip


@asynccontextmanager
async def dra_namespace(api: Client, prefix: str) -> AsyncIterator[str]:
    """A fresh namespace; our DeviceClasses and shared slices of it are removed afterwards."""
    async with namespace(api, prefix) as ns:
        try:
            yield ns
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                selector = f"{dra.LABEL_NAMESPACE}={ns}"
                for res in (DEVICE_CLASSES, RESOURCE_SLICES):
                    for obj in (await api.list(res, label_selector=selector)).items:
                        with suppress(NotFound):
                            await api.delete(res, obj["metadata"]["name"])


def controller(api: Client, ns: str) -> AbstractAsyncContextManager[RunningController]:
    settings = ControllerSettings(
        namespace=ns, leader_elect=False, metrics_port=None, allocation="dra"
    )
    return running_controller(api, settings)


@asynccontextmanager
async def extra_node(api: Client) -> AsyncIterator[str]:
    """A Node object of our own (no kubelet; tainted so nothing is scheduled onto it)."""
    name = unique("dra-test-node")
    taint = {"key": "akri-trio-test/no-kubelet", "effect": "NoSchedule"}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    await api.create(NODES, {**body, "spec": {"taints": [taint]}})
    try:
        yield name
    finally:
        with trio.CancelScope(shield=True), suppress(NotFound):
            await api.delete(NODES, name)


async def _classes(api: Client, ns: str) -> set[str]:
    items = (await api.list(DEVICE_CLASSES, label_selector=f"{dra.LABEL_NAMESPACE}={ns}")).items
    return {c["metadata"]["name"] for c in items}


async def _pool(api: Client, pool: str) -> list[JSON]:
    items = (await api.list(RESOURCE_SLICES, label_selector=f"{dra.LABEL_POOL_KIND}=shared")).items
    return [s for s in items if dra.pool_name_of(s) == pool]


def _selected(slice_: JSON) -> list[str]:
    (term,) = slice_["spec"]["nodeSelector"]["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == dra.HOSTNAME_LABEL and expression["operator"] == "In"
    return list(expression["values"])


def _as_kept(spec: JSON, cluster: dict[str, str]) -> JSON:
    """A DeviceClass spec as the cluster's API server keeps it: one without DRAExtendedResource
    (1.34, 1.35) drops `extendedResourceName`, and the controller takes the class as it is."""
    if lacks(cluster, "DRAExtendedResource") is None:
        return spec
    return {k: v for k, v in spec.items() if k != "extendedResourceName"}


async def test_a_configurations_device_class_comes_and_goes_with_it(
    api: Client, cluster: dict[str, str]
) -> None:
    async with dra_namespace(api, "dra-class") as ns:
        orphan = dra.device_class("gone", ns)  # its Configuration was deleted while we were down
        await api.create(DEVICE_CLASSES, orphan)
        await api.create(CONFIGURATIONS, broker_config("cfg", ns, services=False))
        wanted = dra.device_class_name("cfg", ns)
        async with controller(api, ns):

            async def only_ours() -> bool:
                return await _classes(api, ns) == {wanted}

            await until_api(only_ours, what=f"DeviceClass {wanted} alone")
            stored = await api.get(DEVICE_CLASSES, wanted)
            expected = _as_kept(dra.device_class("cfg", ns)["spec"], cluster)
            assert stored["spec"] == expected

            # Someone edits it: the controller puts its selector back.
            await api.merge_patch(
                DEVICE_CLASSES, wanted, {"spec": {"selectors": [{"cel": {"expression": "true"}}]}}
            )

            async def restored() -> bool:
                got = await api.get(DEVICE_CLASSES, wanted)
                return bool(got["spec"] == expected)

            await until_api(restored, what="the selector restored")

            await api.delete(CONFIGURATIONS, "cfg", namespace=ns)

            async def none() -> bool:
                return not await _classes(api, ns)

            await until_api(none, what="DeviceClass deleted with its Configuration")


async def test_a_device_plugin_mode_controller_deletes_what_dra_mode_left(api: Client) -> None:
    async with dra_namespace(api, "dra-left") as ns, dra_namespace(api, "dra-other") as other:
        for body in (dra.device_class("cfg", ns), dra.device_class("cfg", other)):
            await api.create(DEVICE_CLASSES, body)
        pool = dra.shared_pool(ns, "cfg-abcdef")
        left = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": dra.slice_name(pool, 0),
                "labels": dra.pool_labels("shared", ns),
            },
            "spec": {
                "driver": dra.DRIVER,
                "allNodes": True,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }
        await api.create(RESOURCE_SLICES, left)
        settings = ControllerSettings(namespace=ns, leader_elect=False, metrics_port=None)
        async with running_controller(api, settings):
            # Deleted before the caches synced, and only this namespace's.
            assert await _classes(api, ns) == set()
            assert await _classes(api, other) == {dra.device_class_name("cfg", other)}
            selector = f"{dra.LABEL_NAMESPACE}={ns}"
            assert not (await api.list(RESOURCE_SLICES, label_selector=selector)).items


async def test_a_shared_instance_is_one_pool_on_exactly_its_nodes(
    api: Client, node_cluster: dict[str, str]
) -> None:
    node = node_cluster["AKRI_TRIO_NODE_NAME"]
    no_taints = lacks(node_cluster, "DRADeviceTaints")  # 1.34, 1.35: the offline taint is dropped
    async with dra_namespace(api, "dra-pool") as ns, extra_node(api) as other:
        config = await api.create(CONFIGURATIONS, broker_config("cfg", ns, services=False))
        # A pool whose Instance went while the controller was down.
        ghost = dra.plan_pool(
            dra.shared_pool(ns, "cfg-ghost"),
            [{"name": "ghost"}],
            dra.shared_placement([node]),
            [],
            labels=dra.pool_labels("shared", ns),
        )
        for body in ghost.apply:
            await api.create(RESOURCE_SLICES, body)
        await make_instance(api, config, "cfg-local1", [node], shared=False)
        await make_instance(api, config, "cfg-shared", [node])
        pool = dra.shared_pool(ns, "cfg-shared")
        async with controller(api, ns) as running:

            async def on(nodes: list[str]) -> list[JSON]:
                slices = await _pool(api, pool)
                return slices if slices and _selected(slices[0]) == sorted(nodes) else []

            (first,) = await until_api(lambda: on([node]), what=f"pool {pool} on {node}")
            generation = dra.generation_of(first)
            devices = {d["name"] for d in first["spec"]["devices"]}
            consumable = devices == {dra.device_name("cfg-shared")}
            assert consumable or devices == {"cfg-shared-0", "cfg-shared-1"}
            for device in first["spec"]["devices"]:
                attrs = device["attributes"]
                assert attrs["akri.sh/instance"] == {"string": "cfg-shared"}
                assert attrs["akri.sh/configuration"] == {"string": "cfg"}

            async def ghost_gone() -> bool:
                return not await _pool(api, dra.shared_pool(ns, "cfg-ghost"))

            await until_api(ghost_gone, what="the orphaned pool deleted")
            # The non-shared Instance is its agent's to publish.
            assert not await _pool(api, dra.shared_pool(ns, "cfg-local1"))

            # A node joins: same slice, new generation, both nodes.
            await api.merge_patch(
                INSTANCES, "cfg-shared", {"spec": {"nodes": [node, other]}}, namespace=ns
            )
            (second,) = await until_api(lambda: on([node, other]), what=f"{other} in the selector")
            assert dra.generation_of(second) > generation

            # The device vanishes: its devices stay tainted for the offline grace (shortened
            # here), on the same nodes, then the pool goes.
            assert running.reconcilers is not None and running.reconcilers.dra is not None
            running.reconcilers.dra.pools.offline_grace = 3.0
            await api.delete(INSTANCES, "cfg-shared", namespace=ns)

            async def tainted() -> list[JSON]:
                slices = await _pool(api, pool)
                devices = [d for s in slices for d in s["spec"]["devices"]]
                offline = all(
                    [{k: t[k] for k in ("key", "effect")} for t in d.get("taints", [])]
                    == [dra.OFFLINE_TAINT]
                    for d in devices
                )
                return slices if devices and offline else []

            if no_taints is None:
                (held,) = await until_api(tainted, what="the vanished devices tainted")
                assert _selected(held) == sorted([node, other])

            async def gone() -> bool:
                return not await _pool(api, pool)

            await until_api(gone, what="the pool deleted when the grace ended")
    if no_taints is not None:
        skip(f"the offline taint was not checked: {no_taints}")


async def test_brokers_claim_their_instance_and_the_scheduler_allocates_it(
    api: Client, node_cluster: dict[str, str]
) -> None:
    node = node_cluster["AKRI_TRIO_NODE_NAME"]
    async with dra_namespace(api, "dra-broker") as ns:
        config = await api.create(
            CONFIGURATIONS, broker_config("cfg", ns, pod=pod_spec(), services=False)
        )
        await make_instance(api, config, "cfg-aaaaaa", [node])
        async with controller(api, ns):
            (pod,) = await until_api(lambda: brokers(api, ns), what="a broker Pod")
            spec = pod["spec"]
            assert spec["resourceClaims"] == [
                {"name": "akri", "resourceClaimTemplateName": "cfg-aaaaaa-claim"}
            ]
            (container,) = spec["containers"]
            assert container["resources"].get("claims") == [{"name": "akri"}]
            assert "akri.sh/cfg-aaaaaa" not in str(container["resources"])
            template = await api.get(RESOURCE_CLAIM_TEMPLATES, "cfg-aaaaaa-claim", namespace=ns)
            assert template["metadata"]["ownerReferences"][0]["kind"] == "Instance"

            async def allocated() -> JSON | None:
                claims = (await api.list(RESOURCE_CLAIMS, namespace=ns)).items
                for claim in claims:
                    owners = claim["metadata"].get("ownerReferences") or []
                    mine = any(o["uid"] == pod["metadata"]["uid"] for o in owners)
                    if mine and (claim.get("status") or {}).get("allocation"):
                        return claim
                return None

            # kube-controller-manager makes the claim from the template, the scheduler
            # allocates one of the Instance's devices from the controller's shared pool.
            claim = await until_api(allocated, seconds=60, what="the broker's claim allocated")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["driver"] == "akri.sh"
            assert result["pool"] == dra.shared_pool(ns, "cfg-aaaaaa")
            assert result["device"] in {"cfg-aaaaaa", "cfg-aaaaaa-0", "cfg-aaaaaa-1"}
            bound: Any = await api.get(PODS, pod["metadata"]["name"], namespace=ns)
            assert bound["spec"].get("nodeName") == node
