"""The DRA node-pool reconciler against the real API server, with exactly the RBAC of k8s/agent.yaml
and k8s/dra.yaml (DRA mode's opt-in; without it the agent may not touch ResourceSlices):
it publishes the node's pool, writes nothing while nothing changes, bumps the generation on a
change, publishes again at once what someone else deletes (as the kubelet wipes a node's slices
when it starts), and deletes the pool when its last Instance goes. The node is made up, so no
kubelet takes part; the claim read is the one the kubelet plugin does. The whole agent in DRA
mode runs with these rights, and its /readyz waits for the kubelet's registration."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import trio

from akri_trio import dra
from akri_trio.agent.dra.plugin import registration_socket
from akri_trio.agent.dra.pool_reconciler import NodePoolReconciler
from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.agent.view import instance_store
from akri_trio.dra.edge import probe_consumable_capacity, probe_device_taints
from akri_trio.kube import Apply, Client, Delete, Init, InitApply, InitDone, ObjectKey
from akri_trio.model.convert import unstructure
from akri_trio.rpc.gen import pluginregistration_v1_pb2 as reg
from akri_trio.rpc.gen import pluginregistration_v1_pb2_grpc
from tests.dra.support import instance
from tests.support.akri_cluster import ensure_namespace, install_crds
from tests.support.polling import until_api
from tests.support.rbac import apply_rbac, manifest_client
from tests.support.releases import lacks, skip, skip_without

MANIFEST = Path(__file__).parents[2] / "k8s" / "agent.yaml"
DRA_MANIFEST = Path(__file__).parents[2] / "k8s" / "dra.yaml"
NS = "dra-publisher-tests"


@pytest.fixture
async def agent_api(api: Client, cluster: dict[str, str]) -> AsyncIterator[Client]:
    """A client that authenticates as the agent's ServiceAccount, in DRA mode (with Akri's
    CRDs installed: the whole agent watches them, also when this module runs first)."""
    await install_crds(api)
    async with manifest_client(api, cluster, MANIFEST, "akri", "akri-agent-sa") as client:
        await apply_rbac(api, DRA_MANIFEST)
        yield client


def _instance(name: str, node: str, description: str) -> dict[str, Any]:
    inst = instance(
        name,
        namespace=NS,
        configuration="echo",
        properties={"DEBUG_ECHO_DESCRIPTION": description},
        nodes=(node,),
    )
    obj: dict[str, Any] = unstructure(inst)
    obj["metadata"]["resourceVersion"] = "1"
    return obj


async def _slices(api: Client, node: str) -> list[dict[str, Any]]:
    answer = await api.list(dra.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
    return list(answer.items)


@pytest.mark.parametrize("consumable", [True, False], ids=["consumable", "slots"])
async def test_the_reconciler_keeps_the_node_pool_with_the_manifest_rbac(
    api: Client, agent_api: Client, cluster: dict[str, str], consumable: bool
) -> None:
    if consumable:  # the agent publishes consumable devices only where its probe finds them
        skip_without(cluster, "DRAConsumableCapacity")
    no_taints = lacks(cluster, "DRADeviceTaints")  # 1.34, 1.35: the offline taint is dropped
    await ensure_namespace(api, NS)
    node = f"dra-test-node-{secrets.token_hex(3)}"
    instances = instance_store()  # the node view's typed store
    instances.apply(Init())
    instances.apply(InitApply(_instance("echo-aaaaaa", node, "a")))
    instances.apply(InitDone())
    pools = NodePoolReconciler(
        agent_api, instances, node, namespace=NS, consumable=consumable, offline_grace=2.0
    )
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(pools.run)
            (first,) = await until_api(lambda: _slices(api, node), what="the pool published")
            assert first["spec"]["pool"]["name"] == dra.node_pool(node, NS)
            assert first["spec"]["pool"]["generation"] == 1
            names = {d["name"] for d in first["spec"]["devices"]}
            assert names == ({"echo-aaaaaa"} if consumable else {"echo-aaaaaa-0", "echo-aaaaaa-1"})

            # Reconciled again with nothing changed (once its cache shows the pool): nothing
            # written.
            version = first["metadata"]["resourceVersion"]
            with trio.fail_after(30):
                await pools.slices.wait_for(
                    ObjectKey("", first["metadata"]["name"]),
                    lambda o: o is not None and o["metadata"]["resourceVersion"] == version,
                )
            assert await pools.reconcile(ObjectKey("", dra.node_pool(node, NS))) is None
            (same,) = await _slices(api, node)
            assert same["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

            instances.apply(Apply(_instance("echo-bbbbbb", node, "b")))

            async def two_instances() -> list[dict[str, Any]]:
                slices = await _slices(api, node)
                devices = {d["name"] for s in slices for d in s["spec"]["devices"]}
                return slices if any("echo-bbbbbb" in d for d in devices) else []

            (second,) = await until_api(two_instances, what="the new Instance published")
            assert second["spec"]["pool"]["generation"] == 2

            # Someone (the kubelet, starting) deletes the node's slices: back at once, newer.
            await api.delete(dra.RESOURCE_SLICES, second["metadata"]["name"])

            async def republished() -> list[dict[str, Any]]:
                slices = await _slices(api, node)
                return [s for s in slices if s["metadata"]["uid"] != second["metadata"]["uid"]]

            (third,) = await until_api(republished, what="the pool published again")
            assert third["spec"]["pool"]["generation"] == 3

            instances.apply(Delete(_instance("echo-aaaaaa", node, "a")))
            instances.apply(Delete(_instance("echo-bbbbbb", node, "b")))

            async def tainted() -> bool:
                devices = [d for s in await _slices(api, node) for d in s["spec"]["devices"]]
                return bool(devices) and all(
                    [{k: t[k] for k in ("key", "effect")} for t in d.get("taints", [])]
                    == [dra.OFFLINE_TAINT]
                    for d in devices
                )

            if no_taints is None:
                await until_api(tainted, what="the vanished devices tainted in their grace")

            async def gone() -> bool:
                return not await _slices(api, node)

            await until_api(gone, what="the pool deleted when the grace ended")
        finally:
            nursery.cancel_scope.cancel()
            with trio.move_on_after(10, shield=True):
                for s in await _slices(api, node):
                    await api.delete(dra.RESOURCE_SLICES, s["metadata"]["name"])
    if no_taints is not None:
        skip(f"the offline taint was not checked: {no_taints}")


async def test_the_agent_may_probe_and_read_the_claims_it_prepares(
    api: Client, agent_api: Client
) -> None:
    """The consumable-capacity and device-taint probes (dry-run creates) and the claim read of
    a prepare."""
    assert await probe_consumable_capacity(agent_api) in (True, False)
    assert await probe_device_taints(agent_api) in (True, False)
    await ensure_namespace(api, NS)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"rbac-{secrets.token_hex(3)}", "namespace": NS},
        "spec": dra.claim_spec("echo", NS),
    }
    made = await api.create(dra.RESOURCE_CLAIMS, claim)
    try:
        read = await agent_api.get(dra.RESOURCE_CLAIMS, made["metadata"]["name"], namespace=NS)
        assert read["metadata"]["uid"] == made["metadata"]["uid"]
    finally:
        await api.delete(dra.RESOURCE_CLAIMS, made["metadata"]["name"], namespace=NS)


async def test_the_dra_agent_runs_with_the_manifests_and_is_ready_once_registered(
    api: Client, agent_api: Client, short_tmp: Path
) -> None:
    await ensure_namespace(api, NS)
    settings = AgentSettings(
        node=f"dra-test-node-{secrets.token_hex(3)}",
        namespace=NS,
        discovery_handlers_directory=short_tmp / "akri",
        metrics_port=0,
        metrics_host="127.0.0.1",
        allocation="dra",
        kubelet_root_dir=short_tmp,
        cdi_dir=short_tmp / "cdi",
    )

    def notify(registered: bool) -> None:
        target = f"unix://{registration_socket(short_tmp)}"
        with grpc.insecure_channel(target) as channel:
            make: Callable[[Any], Any] = pluginregistration_v1_pb2_grpc.RegistrationStub
            stub = make(channel)
            status = reg.RegistrationStatus(plugin_registered=registered)
            stub.NotifyRegistrationStatus(status, timeout=20)

    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(lambda **kw: run_agent(settings, api=agent_api, **kw))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{agent.metrics_port}") as http:

            async def synced() -> bool:
                answer = await http.get("/readyz")
                return "[+]instances-synced" in answer.text

            await until_api(synced, what="the agent's caches synced")
            before = await http.get("/readyz")
            assert before.status_code == 503
            assert "[-]dra-plugin-registered failed" in before.text
            await trio.to_thread.run_sync(notify, True)  # as the kubelet does
            after = await http.get("/readyz")
            assert after.status_code == 200, after.text
        nursery.cancel_scope.cancel()
