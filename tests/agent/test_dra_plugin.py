"""The agent's kubelet DRA plugin against the real API server, called by a grpcio client (an
independent gRPC implementation, as the kubelet's Go one is): registration, preparing a claim
into a CDI spec and a checkpoint, idempotence, refusals, v1beta1, and unpreparing after a
restart. The claims' allocations are written through the status subresource, as the scheduler
writes them; the node is made up, so no kubelet takes part."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest
import trio

from akri_trio import dra
from akri_trio.address import ObjectKey
from akri_trio.agent.dra.plugin import plugin_socket, registration_socket, serve_kubelet_plugin
from akri_trio.agent.dra.preparer import ClaimRef, Preparer
from akri_trio.agent.view import NodeView
from akri_trio.dra.checkpoint import PreparedClaim
from akri_trio.kube import Client, NotFound
from akri_trio.model.convert import unstructure
from akri_trio.model.device import Device, DeviceSpec, Mount
from akri_trio.rpc.gen import dra_v1_pb2 as v1
from akri_trio.rpc.gen import (
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2_grpc,
)
from akri_trio.rpc.gen import dra_v1beta1_pb2 as v1beta1
from akri_trio.rpc.gen import pluginregistration_v1_pb2 as reg
from tests.dra.support import instance
from tests.support.akri_cluster import ensure_namespace

NS = "dra-plugin-tests"
OTHER_NS = "dra-plugin-tests-other"
NODE = "dra-plugin-node"
INSTANCE = "echo-aaaaaa"
DEVICE = Device(
    "a",
    mounts=(Mount("/data", "/srv/data", read_only=True),),
    device_specs=(DeviceSpec("/dev/echo0", "/dev/null"),),
)


@attrs.define
class Plugin:
    api: Client
    root: Path
    preparer: Preparer
    statuses: list[tuple[bool, str]]

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    async def call(self, socket: Path, stub: Callable[[Any], Any], method: str, msg: Any) -> Any:
        def run() -> Any:
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                return getattr(stub(channel), method)(msg, timeout=20)

        return await trio.to_thread.run_sync(run)

    async def claim(
        self, results: list[dict[str, str]], name: str = "", namespace: str = NS
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name or f"c-{secrets.token_hex(3)}", "namespace": namespace},
            "spec": dra.claim_spec("echo", NS),
        }
        made = await self.api.create(dra.RESOURCE_CLAIMS, body)
        status = {"status": {"allocation": {"devices": {"results": results}}}}
        return await self.api.merge_patch(
            dra.RESOURCE_CLAIMS,
            made["metadata"]["name"],
            status,
            namespace=namespace,
            subresource="status",
        )


def _ours(device: str = INSTANCE, pool: str = "") -> dict[str, str]:
    pool = pool or dra.node_pool(NODE, NS)
    return {"request": "device", "driver": dra.DRIVER, "pool": pool, "device": device}


def _claim_msg(module: Any, claim: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    return module.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])


@pytest.fixture
async def plugin(api: Client, short_tmp: Path) -> AsyncIterator[Plugin]:
    await ensure_namespace(api, NS)
    await ensure_namespace(api, OTHER_NS)
    view = NodeView(NODE)
    inst = instance(INSTANCE, namespace=NS, configuration="echo", nodes=(NODE,))
    view.put_instance(
        {**unstructure(inst), "metadata": {"name": INSTANCE, "namespace": NS, "uid": "u"}}
    )
    view.set_devices(ObjectKey(NS, "echo"), {ObjectKey(NS, INSTANCE): DEVICE})
    preparer = Preparer(
        api, view, cdi_dir=short_tmp / "cdi", state_dir=short_tmp / "state", consumable=True
    )
    preparer.load()
    statuses: list[tuple[bool, str]] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                serve_kubelet_plugin,
                short_tmp,
                preparer,
                lambda ok, err: statuses.append((ok, err)),
            )
            yield Plugin(api, short_tmp, preparer, statuses)
            nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(10, shield=True):
            for ns in (NS, OTHER_NS):
                for claim in (await api.list(dra.RESOURCE_CLAIMS, namespace=ns)).items:
                    with contextlib.suppress(NotFound):
                        await api.delete(
                            dra.RESOURCE_CLAIMS, claim["metadata"]["name"], namespace=ns
                        )


async def test_registration_names_the_driver_its_socket_and_versions(plugin: Plugin) -> None:
    stub = pluginregistration_v1_pb2_grpc.RegistrationStub
    sock = registration_socket(plugin.root)
    assert sock == plugin.root / "plugins_registry" / "akri.sh-reg.sock"
    info = await plugin.call(sock, stub, "GetInfo", reg.InfoRequest())
    assert (info.type, info.name) == ("DRAPlugin", "akri.sh")
    assert info.endpoint == str(plugin.root / "plugins" / "akri.sh" / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    status = reg.RegistrationStatus(plugin_registered=True)
    await plugin.call(sock, stub, "NotifyRegistrationStatus", status)
    assert plugin.statuses == [(True, "")]


async def test_prepare_writes_a_cdi_spec_and_answers_again_from_the_checkpoint(
    plugin: Plugin,
) -> None:
    foreign = {"request": "device", "driver": "gpu.example.com", "pool": "p", "device": "g0"}
    claim = await plugin.claim([foreign, _ours()])
    uid = claim["metadata"]["uid"]
    sock, stub = plugin_socket(plugin.root), dra_v1_pb2_grpc.DRAPluginStub
    request = v1.NodePrepareResourcesRequest(claims=[_claim_msg(v1, claim)])
    answer = (await plugin.call(sock, stub, "NodePrepareResources", request)).claims[uid]
    assert answer.error == ""
    (device,) = answer.devices
    assert (device.pool_name, device.device_name) == (dra.node_pool(NODE, NS), INSTANCE)
    assert list(device.request_names) == ["device"]
    assert list(device.cdi_device_ids) == [dra.cdi_device_id(uid, 1)]  # index 1: after foreign

    spec = json.loads((plugin.cdi / dra.spec_file_name(uid)).read_text())
    (cdi,) = spec["devices"]
    assert cdi["name"] == f"{uid}-1"
    assert cdi["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/echo0", "hostPath": "/dev/null", "permissions": "rwm"}
    ]
    assert [m["hostPath"] for m in cdi["containerEdits"]["mounts"]] == ["/srv/data"]
    assert uid in plugin.preparer.prepared

    # The claim is gone from the API server: a repeated prepare still answers the same.
    await plugin.api.delete(dra.RESOURCE_CLAIMS, claim["metadata"]["name"], namespace=NS)
    again = (await plugin.call(sock, stub, "NodePrepareResources", request)).claims[uid]
    assert again == answer

    unprepare = v1beta1.NodeUnprepareResourcesRequest(claims=[_claim_msg(v1beta1, claim)])
    beta = dra_v1beta1_pb2_grpc.DRAPluginStub
    for _ in range(2):  # unpreparing twice is fine
        done = await plugin.call(sock, beta, "NodeUnprepareResources", unprepare)
        assert done.claims[uid].error == ""
    assert not (plugin.cdi / dra.spec_file_name(uid)).exists()
    assert uid not in plugin.preparer.prepared


async def test_v1beta1_prepare_answers_like_v1(plugin: Plugin) -> None:
    claim = await plugin.claim([_ours()])
    uid = claim["metadata"]["uid"]
    request = v1beta1.NodePrepareResourcesRequest(claims=[_claim_msg(v1beta1, claim)])
    beta = dra_v1beta1_pb2_grpc.DRAPluginStub
    answer = await plugin.call(plugin_socket(plugin.root), beta, "NodePrepareResources", request)
    (device,) = answer.claims[uid].devices
    assert list(device.cdi_device_ids) == [dra.cdi_device_id(uid, 0)]
    await plugin.preparer.unprepare([ClaimRef(NS, uid, claim["metadata"]["name"])])


async def test_devices_this_node_cannot_serve_are_refused(plugin: Plugin) -> None:
    other_node = await plugin.claim([_ours(pool=dra.node_pool("elsewhere", NS))])
    gone = await plugin.claim([_ours(device="echo-ffffff")])
    missing = {"metadata": {"namespace": NS, "uid": "no-such-uid", "name": "no-such-claim"}}
    request = v1.NodePrepareResourcesRequest(
        claims=[_claim_msg(v1, c) for c in (other_node, gone, missing)]
    )
    sock, stub = plugin_socket(plugin.root), dra_v1_pb2_grpc.DRAPluginStub
    answers = (await plugin.call(sock, stub, "NodePrepareResources", request)).claims
    assert "pool not usable on this node" in answers[other_node["metadata"]["uid"]].error
    assert "no such device" in answers[gone["metadata"]["uid"]].error
    assert "not found" in answers["no-such-uid"].error.lower()
    assert not any(a.devices for a in answers.values())
    assert not list(plugin.cdi.iterdir())


async def test_a_claim_of_another_namespace_gets_no_device_of_this_one(plugin: Plugin) -> None:
    """DeviceClasses are cluster-scoped, so a claim elsewhere can be allocated NS's device."""
    claim = await plugin.claim([_ours()], namespace=OTHER_NS)
    request = v1.NodePrepareResourcesRequest(claims=[_claim_msg(v1, claim)])
    sock, stub = plugin_socket(plugin.root), dra_v1_pb2_grpc.DRAPluginStub
    answer = (await plugin.call(sock, stub, "NodePrepareResources", request)).claims[
        claim["metadata"]["uid"]
    ]
    assert f"device {dra.node_pool(NODE, NS)}/{INSTANCE}: belongs to namespace" in answer.error
    assert not answer.devices
    assert not list(plugin.cdi.iterdir())
    assert plugin.preparer.prepared == {}


async def test_a_restarted_plugin_unprepares_what_the_last_one_prepared(plugin: Plugin) -> None:
    claim = await plugin.claim([_ours()])
    ref = ClaimRef(NS, claim["metadata"]["uid"], claim["metadata"]["name"])
    (prepared,) = (await plugin.preparer.prepare([ref])).values()
    assert isinstance(prepared, PreparedClaim)
    restarted = Preparer(
        plugin.api,
        NodeView(NODE),  # knows no Instance yet: unprepare must not need one
        cdi_dir=plugin.cdi,
        state_dir=plugin.root / "state",
        consumable=True,
    )
    restarted.load()
    assert restarted.prepared == {ref.uid: prepared}
    assert (await restarted.prepare([ref]))[ref.uid] == prepared  # idempotent across runs
    await restarted.unprepare([ref])
    assert not (plugin.cdi / prepared.spec_file).exists()
    fresh = Preparer(
        plugin.api,
        NodeView(NODE),
        cdi_dir=plugin.cdi,
        state_dir=plugin.root / "state",
        consumable=True,
    )
    fresh.load()
    assert fresh.prepared == {}
