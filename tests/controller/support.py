"""Helpers for the controller's tests on the real control plane: a namespace of one's own,
Configurations with brokers, Instances written as an agent would write them, waits on the API.

Everything happens in a fresh namespace per test, deleted afterwards: the cluster is shared,
and other tests purge akri objects or run agents of their own.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

import trio

from akri_trio.controller.reconcilers import JOBS, NODES, PODS, SERVICES
from akri_trio.controller.run import ControllerSettings, RunningController, run_controller
from akri_trio.kube import JSON, Client, NotFound, Resource
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.akri_cluster import NAMESPACES, ensure_namespace, install_crds
from tests.support.polling import until_api, until_state

T = TypeVar("T")
BUSYBOX = "docker.io/library/busybox:latest"
# No agent has a handler of this name: agents of other tests (they watch every namespace) make
# no Instances for these Configurations; the tests write them.
NO_HANDLER = "controllerTestsOnly"
SERVICE_ACCOUNTS = Resource.core("serviceaccounts", "ServiceAccount")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
NODE_LEASE_NAMESPACE = "kube-node-lease"
# On every fake Node: the scheduler places no other test's Pod on a node without a kubelet.
NO_KUBELET_TAINT = {"key": "akri-trio-test/no-kubelet", "effect": "NoSchedule"}
HEARTBEAT_S = 10.0
NOWHERE = {"akri-trio-test/nowhere": "true"}  # a nodeSelector no node matches: Pods stay Pending

__all__ = ["JOBS", "NODES", "PODS", "SERVICES"]


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@asynccontextmanager
async def namespace(api: Client, prefix: str) -> AsyncIterator[str]:
    """A fresh namespace (CRDs installed), deleted with everything in it afterwards."""
    await install_crds(api)
    name = unique(prefix)
    await ensure_namespace(api, name)

    async def service_account() -> bool:
        try:
            return bool(await api.get(SERVICE_ACCOUNTS, "default", namespace=name))
        except NotFound:
            return False

    # Pods are refused until the namespace's default ServiceAccount exists.
    await until_api(service_account, what=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            for inst in (await api.list(INSTANCES, namespace=name)).items:
                if inst["metadata"].get("finalizers"):
                    with suppress(NotFound):
                        await api.merge_patch(
                            INSTANCES,
                            inst["metadata"]["name"],
                            {"metadata": {"finalizers": None}},
                            namespace=name,
                        )
            with suppress(NotFound):
                await api.delete(NAMESPACES, name)


def _now(micro: bool = False, ago: float = 0.0) -> str:
    stamp = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


async def set_ready(api: Client, node: str, ready: bool, *, since: float = 0.0) -> None:
    """Write a Node's Ready condition (nodes/status), as its kubelet would; `since`: seconds
    ago that it changed (its lastTransitionTime)."""
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "Test",
        "message": "set by the controller's tests",
        "lastHeartbeatTime": _now(),
        "lastTransitionTime": _now(ago=since),
    }
    await api.merge_patch(
        NODES, node, {"status": {"conditions": [condition]}}, subresource="status"
    )


async def _heartbeat(api: Client, node: str) -> None:
    """Renew the node's Lease as a kubelet does, so the node lifecycle controller does not
    mark a fake node Unknown after its grace period (the controller would take it as lost)."""
    while True:
        renew = {
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": _now(True)}
        }
        try:
            await api.merge_patch(LEASES, node, renew, namespace=NODE_LEASE_NAMESPACE)
        except NotFound:
            body: JSON = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
            body["metadata"] = {"name": node, "namespace": NODE_LEASE_NAMESPACE}
            await api.create(LEASES, {**body, **renew}, namespace=NODE_LEASE_NAMESPACE)
        await trio.sleep(HEARTBEAT_S)


@asynccontextmanager
async def fake_nodes(
    api: Client, count: int = 1, *, heartbeat: bool = True
) -> AsyncIterator[list[str]]:
    """`count` Node objects of our own (no kubelet behind them): Ready, kept so by renewing
    their node Leases, tainted so nothing is scheduled onto them; deleted afterwards. The
    controller cleans up after nodes that Instances name but that do not exist, so every node
    a test's Instance names must be one of these (or the real one). Without `heartbeat` they
    stay Ready only for the node lifecycle controller's grace period (tens of seconds)."""
    names = [unique("ctl-test-node") for _ in range(count)]
    async with trio.open_nursery() as nursery:
        try:
            for name in names:
                body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
                await api.create(NODES, {**body, "spec": {"taints": [NO_KUBELET_TAINT]}})
                await set_ready(api, name, True)
                if heartbeat:
                    nursery.start_soon(_heartbeat, api, name)
            yield names
        finally:
            nursery.cancel_scope.cancel()
            # Bounded by the count: a bench deletes 50 (each two requests) on a loaded machine.
            with trio.CancelScope(shield=True), trio.move_on_after(10 + count):
                for name in names:
                    with suppress(NotFound):
                        await api.delete(NODES, name)
                    with suppress(NotFound):
                        await api.delete(LEASES, name, namespace=NODE_LEASE_NAMESPACE)


# What the scheduler checks of any Pod: room for Pods, CPU, memory.
ROOM = {"pods": "110", "cpu": "8", "memory": "32Gi"}


@asynccontextmanager
async def schedulable_nodes(api: Client, count: int = 1) -> AsyncIterator[list[str]]:
    """`fake_nodes` the scheduler places Pods on (they tolerate NO_KUBELET_TAINT): a hostname
    label (a shared pool's node selector matches it) and ROOM."""
    async with fake_nodes(api, count) as names:
        for name in names:
            labels = {"metadata": {"labels": {"kubernetes.io/hostname": name}}}
            await api.merge_patch(NODES, name, labels)
            room = {"status": {"capacity": ROOM, "allocatable": ROOM}}
            await api.merge_patch(NODES, name, room, subresource="status")
        yield names


def pod_spec(
    command: str = "sleep 3600", *, placeholder: bool = True, nowhere: bool = False
) -> JSON:
    container: JSON = {
        "name": "broker",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    if placeholder:
        container["resources"] = {"limits": {"{{PLACEHOLDER}}": "1"}}
    spec: JSON = {"containers": [container], "terminationGracePeriodSeconds": 1}
    if nowhere:
        spec["nodeSelector"] = dict(NOWHERE)
    return spec


SERVICE_SPEC: JSON = {"type": "ClusterIP", "ports": [{"name": "grpc", "port": 6052}]}


def broker_config(
    name: str,
    ns: str,
    *,
    handler: str = NO_HANDLER,
    descriptions: tuple[str, ...] = ("d0", "d1"),
    pod: JSON | None = None,
    job: JSON | None = None,
    services: bool = True,
    capacity: int = 2,
) -> JSON:
    import yaml

    spec: JSON = {
        "discoveryHandler": {
            "name": handler,
            "discoveryDetails": yaml.safe_dump({"descriptions": list(descriptions)}),
        },
        "capacity": capacity,
    }
    if pod is not None:
        spec["brokerSpec"] = {"brokerPodSpec": pod}
    if job is not None:
        spec["brokerSpec"] = {"brokerJobSpec": job}
    if services:
        spec["instanceServiceSpec"] = SERVICE_SPEC
        spec["configurationServiceSpec"] = SERVICE_SPEC
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


async def make_instance(
    api: Client,
    config: Mapping[str, Any],
    name: str,
    nodes: list[str],
    *,
    shared: bool = True,
    usage: Mapping[str, str] | None = None,
    finalizers: list[str] | None = None,
) -> JSON:
    """An Instance as an agent writes it, owned by its Configuration."""
    meta = config["metadata"]
    body: JSON = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": "akri.sh/v0",
                    "kind": "Configuration",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": list(finalizers or []),
        },
        "spec": {
            "configurationName": meta["name"],
            "cdiName": f"akri.sh/{meta['name']}={name}",
            "capacity": config["spec"].get("capacity", 1),
            "shared": shared,
            "nodes": nodes,
            "deviceUsage": dict(usage or {}),
            "brokerProperties": {},
        },
    }
    return await api.create(INSTANCES, body)


async def brokers(api: Client, ns: str, config: str | None = None) -> list[JSON]:
    """Broker Pods (not being deleted) in `ns`, of `config` when given."""
    selector = naming.LABEL_CONFIGURATION + (f"={config}" if config else "")
    pods = (await api.list(PODS, namespace=ns, label_selector=selector)).items
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def service_names(api: Client, ns: str) -> set[str]:
    items = (await api.list(SERVICES, namespace=ns, label_selector="controller=akri.sh")).items
    return {s["metadata"]["name"] for s in items if not s["metadata"].get("deletionTimestamp")}


async def set_pod_phase(api: Client, pod: Mapping[str, Any], phase: str) -> None:
    """Stand in for a kubelet on a Pod no node will run: write its phase (pods/status)."""
    meta = pod["metadata"]
    status: JSON = {"phase": phase}
    if phase == "Running":
        status["startTime"] = meta["creationTimestamp"]
    await api.merge_patch(
        PODS, meta["name"], {"status": status}, namespace=meta["namespace"], subresource="status"
    )


async def with_nodes(api: Client, ns: str, name: str, nodes: list[str]) -> JSON | None:
    """Instance `name` once its `nodes` are exactly `nodes` (for `until`)."""
    inst = await api.get(INSTANCES, name, namespace=ns)
    return inst if inst["spec"]["nodes"] == nodes else None


async def instance_gone(api: Client, ns: str, name: str) -> bool:
    try:
        await api.get(INSTANCES, name, namespace=ns)
    except NotFound:
        return True
    return False


async def served_configuration(api: Client, ns: str, nodes: list[str]) -> JSON:
    """Configuration `cfg` (no brokers, no Services) with a status entry for each of `nodes`,
    as their agents write them."""
    config = await api.create(CONFIGURATIONS, broker_config("cfg", ns, services=False))
    status = {"nodes": [{"node": node} for node in nodes]}
    await api.merge_patch(
        CONFIGURATIONS, "cfg", {"status": status}, namespace=ns, subresource="status"
    )
    return config


@asynccontextmanager
async def running_controller(
    api: Client, settings: ControllerSettings
) -> AsyncIterator[RunningController]:
    """`run_controller(settings)` in-process, yielded once its caches are synced."""
    async with trio.open_nursery() as nursery:
        running: RunningController = await nursery.start(
            lambda **kw: run_controller(settings, api=api, **kw)
        )
        await until_state(lambda: running.synced, 30, "the controller's caches synced")
        yield running
        nursery.cancel_scope.cancel()
