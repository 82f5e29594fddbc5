"""k8s/controller.yaml's RBAC is exactly enough: the controller runs with its ServiceAccount's
token and nothing more, wins the Lease in `akri`, and makes broker Pods and Services (and, in
DRA mode with k8s/dra.yaml's rights too, DeviceClasses, shared ResourceSlices and broker claim
templates, and deletes a lost node's Pods that hold a shared device)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import suppress
from pathlib import Path

import pytest
import trio

from akri_trio import dra
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.controller.reconcilers import PODS, Reconcilers
from akri_trio.controller.run import ControllerSettings, RunningController, run_controller
from akri_trio.controller.triggers import make_caches
from akri_trio.dra import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from akri_trio.kube import Client, NotFound
from akri_trio.model.resources import CONFIGURATIONS
from tests.controller.support import (
    broker_config,
    brokers,
    fake_nodes,
    make_instance,
    namespace,
    pod_spec,
    service_names,
    set_pod_phase,
)
from tests.support.polling import until_api
from tests.support.rbac import apply_rbac, manifest_client

MANIFEST = Path(__file__).parents[2] / "k8s" / "controller.yaml"
DRA_MANIFEST = Path(__file__).parents[2] / "k8s" / "dra.yaml"  # DRA mode's opt-in rights


@pytest.fixture
def admin(api: Client) -> Client:
    """The cluster admin's client (the shared `api`), beside the service accounts' ones."""
    return api


@pytest.fixture
async def controller_api(admin: Client, cluster: dict[str, str]) -> AsyncIterator[Client]:
    async with manifest_client(admin, cluster, MANIFEST, "akri", "akri-controller-sa") as client:
        yield client


async def test_controller_works_with_exactly_the_manifest_rbac(
    admin: Client, controller_api: Client
) -> None:
    async with namespace(admin, "ctl-rbac") as ns, fake_nodes(admin) as (node,):
        config = await admin.create(
            CONFIGURATIONS, broker_config("cfg", ns, pod=pod_spec(nowhere=True))
        )
        await make_instance(admin, config, "cfg-aaaaaa", [node])
        settings = ControllerSettings(namespace=ns, metrics_port=None, lease_namespace="akri")
        async with trio.open_nursery() as nursery:
            running: RunningController = await nursery.start(
                lambda **kw: run_controller(settings, api=controller_api, **kw)
            )
            pods = await until_api(lambda: brokers(admin, ns), what="a broker Pod")
            assert running.leading and running.synced
            await set_pod_phase(admin, pods[0], "Running")
            want = {"cfg-aaaaaa-svc", "cfg-svc"}

            async def services() -> bool:
                return await service_names(admin, ns) == want

            await until_api(services, what=f"Services {want}")
            await admin.delete(CONFIGURATIONS, "cfg", namespace=ns)

            async def no_brokers() -> bool:
                return not await brokers(admin, ns)

            await until_api(no_brokers, what="brokers gone")
            nursery.cancel_scope.cancel()


async def test_dra_mode_works_with_exactly_the_manifest_rbac(
    admin: Client, controller_api: Client, node_cluster: dict[str, str]
) -> None:
    """DeviceClass, shared pool, the consumable-capacity probe and broker claim templates, with
    k8s/dra.yaml's rights added."""
    await apply_rbac(admin, DRA_MANIFEST)
    async with namespace(admin, "ctl-rbac-dra") as ns:
        config = await admin.create(
            CONFIGURATIONS, broker_config("cfg", ns, pod=pod_spec(nowhere=True))
        )
        await make_instance(admin, config, "cfg-aaaaaa", [node_cluster["AKRI_TRIO_NODE_NAME"]])
        settings = ControllerSettings(
            namespace=ns, metrics_port=None, lease_namespace="akri", allocation="dra"
        )
        selector = f"{dra.LABEL_NAMESPACE}={ns}"
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(lambda **kw: run_controller(settings, api=controller_api, **kw))
                (pod,) = await until_api(lambda: brokers(admin, ns), what="a broker Pod")
                assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]

                async def published() -> bool:
                    classes = await admin.list(DEVICE_CLASSES, label_selector=selector)
                    slices = await admin.list(RESOURCE_SLICES, label_selector=selector)
                    return bool(classes.items) and bool(slices.items)

                await until_api(published, what="a DeviceClass and a shared pool")
                await admin.delete(CONFIGURATIONS, "cfg", namespace=ns)

                async def removed() -> bool:
                    return not await _dra_objects_left(admin, selector)

                await until_api(removed, what="class and pool deleted by the controller")
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _delete_dra_objects(admin, selector)


async def test_a_lost_nodes_shared_claim_holder_is_deleted_with_the_manifest_rbac(
    admin: Client, controller_api: Client
) -> None:
    """DRA mode's node-loss step, as the controller's ServiceAccount with k8s/dra.yaml: of two
    Pods bound to a lost node, the one a claim of a shared pool is reserved for is deleted at
    once, the other stays. (The claim's allocation is written by hand: no scheduler allocates
    to a node without a kubelet.)"""
    await apply_rbac(admin, DRA_MANIFEST)
    async with namespace(admin, "ctl-rbac-lost") as ns, fake_nodes(admin) as (node,):
        pods = {}
        for name in ("holder", "bystander"):
            spec = {**pod_spec(placeholder=False), "nodeName": node}
            if name == "holder":
                spec["resourceClaims"] = [{"name": "c", "resourceClaimName": "held"}]
            meta = {"name": name, "namespace": ns}
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
            pods[name] = await admin.create(PODS, body)
        claim = await admin.create(
            RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "held", "namespace": ns},
                "spec": dra.claim_spec("cfg", ns),
            },
        )
        result = {
            "request": "device",
            "driver": dra.DRIVER,
            "pool": dra.shared_pool(ns, "cfg-aaaaaa"),
            "device": "cfg-aaaaaa",
        }
        holder = pods["holder"]["metadata"]
        claim["status"] = {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": "holder", "uid": holder["uid"]}],
        }
        await admin.replace(RESOURCE_CLAIMS, claim, subresource="status")

        r = Reconcilers(controller_api, make_caches(), ControllerMetrics(), namespace=ns)
        await r._release_shared_claims(node)

        async def names() -> set[str]:
            return {p["metadata"]["name"] for p in (await admin.list(PODS, namespace=ns)).items}

        assert await names() == {"bystander"}


async def test_device_plugin_mode_deletes_what_dra_mode_left_with_the_manifest_rbac(
    admin: Client, controller_api: Client
) -> None:
    """After a switch back: a DeviceClass and a shared pool's ResourceSlice of the namespace,
    left by DRA mode, are deleted as the device-plugin-mode controller starts leading, with
    k8s/controller.yaml's `list` and `delete` on both (akri-controller-dra-leftovers-role)."""
    async with namespace(admin, "ctl-rbac-back") as ns:
        selector = f"{dra.LABEL_NAMESPACE}={ns}"
        pool = dra.shared_pool(ns, "cfg-aaaaaa")
        left = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": dra.slice_name(pool, 0), "labels": dra.pool_labels("shared", ns)},
            "spec": {
                "driver": dra.DRIVER,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [],
            },
        }
        await admin.create(DEVICE_CLASSES, dra.device_class("cfg", ns))
        await admin.create(RESOURCE_SLICES, left)
        settings = ControllerSettings(namespace=ns, metrics_port=None, lease_namespace="akri")
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(lambda **kw: run_controller(settings, api=controller_api, **kw))

                async def removed() -> bool:
                    return not await _dra_objects_left(admin, selector)

                await until_api(removed, what="the class and the pool DRA mode left deleted")
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _delete_dra_objects(admin, selector)


async def _dra_objects_left(admin: Client, selector: str) -> bool:
    """Whether any DeviceClass or ResourceSlice matching `selector` exists."""
    for res in (DEVICE_CLASSES, RESOURCE_SLICES):
        if (await admin.list(res, label_selector=selector)).items:
            return True
    return False


async def _delete_dra_objects(admin: Client, selector: str) -> None:
    for res in (DEVICE_CLASSES, RESOURCE_SLICES):
        for obj in (await admin.list(res, label_selector=selector)).items:
            with suppress(NotFound):
                await admin.delete(res, obj["metadata"]["name"])
