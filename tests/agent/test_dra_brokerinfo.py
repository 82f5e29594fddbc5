"""brokerInfo in DRA mode against the real API server, with exactly the RBAC of k8s/agent.yaml
and k8s/dra.yaml: Prepare mounts a workload directory named for the claim into its CDI spec,
the copier keeps it live while the claim is prepared and copies what a broker writes there
into the claim's `status.devices[].data` beside another node's keys, leaves out (and reports)
files past the API server's 10 KiB as that server stores them, and takes this node's keys away
once the claim is unprepared. The claim's allocation is written through the status
subresource as the scheduler writes it; the node is made up, so no kubelet takes part."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from akri_trio import dra
from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import BrokerInfo, Limits, WorkloadDirs
from akri_trio.agent.dra.claim_status import ClaimStatus
from akri_trio.agent.dra.preparer import ClaimRef, Preparer
from akri_trio.agent.view import NodeView
from akri_trio.dra.device_status import DATA_MAX_BYTES
from akri_trio.kube import Client, NotFound
from akri_trio.model.convert import unstructure
from akri_trio.model.device import Device
from tests.dra.support import instance
from tests.support.akri_cluster import ensure_namespace
from tests.support.rbac import apply_rbac, manifest_client

K8S = Path(__file__).parents[2] / "k8s"
NS = "dra-brokerinfo-tests"
NODE = "dra-bi-node"
INSTANCE = "echo-bbbbbb"
KEY = ObjectKey(NS, INSTANCE)


@attrs.define
class Node:
    admin: Client
    preparer: Preparer
    copier: BrokerInfo
    root: Path

    async def claim(self) -> dict[str, Any]:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"c-{secrets.token_hex(3)}", "namespace": NS},
            "spec": dra.claim_spec("echo", NS),
        }
        made = await self.admin.create(dra.RESOURCE_CLAIMS, body)
        result = {
            "request": "device",
            "driver": dra.DRIVER,
            "pool": dra.node_pool(NODE, NS),
            "device": INSTANCE,
        }
        status = {"status": {"allocation": {"devices": {"results": [result]}}}}
        return await self.admin.merge_patch(
            dra.RESOURCE_CLAIMS,
            made["metadata"]["name"],
            status,
            namespace=NS,
            subresource="status",
        )

    async def data(self, claim: dict[str, Any]) -> dict[str, str]:
        got = await self.admin.get(dra.RESOURCE_CLAIMS, claim["metadata"]["name"], namespace=NS)
        (entry,) = got["status"].get("devices") or [{}]
        return dict((entry.get("data") or {}).get("brokerInfo") or {})


@pytest.fixture
async def node(api: Client, cluster: dict[str, str], short_tmp: Path) -> AsyncIterator[Node]:
    await ensure_namespace(api, NS)
    async with manifest_client(api, cluster, K8S / "agent.yaml", "akri", "akri-agent-sa") as sa:
        await apply_rbac(api, K8S / "dra.yaml")
        view = NodeView(NODE)
        inst = instance(INSTANCE, namespace=NS, configuration="echo", nodes=(NODE,))
        view.put_instance({**unstructure(inst), "metadata": {"name": INSTANCE, "namespace": NS}})
        view.set_devices(ObjectKey(NS, "echo"), {KEY: Device("b")})  # discovered here
        root = short_tmp / "bi"
        dirs = WorkloadDirs(root, generation=lambda _: 1)
        preparer = Preparer(
            sa,
            view,
            cdi_dir=short_tmp / "cdi",
            state_dir=short_tmp / "state",
            consumable=True,
            workloads=dirs,
        )
        preparer.load()
        status = ClaimStatus(sa, NODE, preparer)
        copier = BrokerInfo(
            sa,
            view,
            dirs,
            limits=Limits(max_file_bytes=4096, max_total_bytes=16384),
            current=lambda _: None,
            namespace=NS,
            held=preparer.held,
            reports=status.report,
        )
        try:
            yield Node(api, preparer, copier, root)
        finally:
            with trio.move_on_after(10, shield=True):
                for claim in (await api.list(dra.RESOURCE_CLAIMS, namespace=NS)).items:
                    with contextlib.suppress(NotFound):
                        await api.delete(
                            dra.RESOURCE_CLAIMS, claim["metadata"]["name"], namespace=NS
                        )


async def test_a_broker_s_files_reach_its_claim_status_beside_another_node_s(node: Node) -> None:
    claim = await node.claim()
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    other = {"driver": dra.DRIVER, "pool": dra.node_pool(NODE, NS), "device": INSTANCE}
    await node.admin.merge_patch(  # what another node's agent wrote (a shared claim)
        dra.RESOURCE_CLAIMS,
        name,
        {"status": {"devices": [{**other, "data": {"brokerInfo": {"n2/fw": "9"}}}]}},
        namespace=NS,
        subresource="status",
    )
    answer = (await node.preparer.prepare([ClaimRef(NS, uid, name)]))[uid]
    assert not isinstance(answer, str), answer

    # Prepare mounted the workload's directory through the CDI spec, named for the claim.
    spec = (node.preparer.cdi_dir / dra.spec_file_name(uid)).read_text()
    (workload,) = (node.root / NS / INSTANCE).iterdir()
    assert workload.name.startswith(f"{uid}.g1.")
    assert f'"hostPath": "{workload}"' in spec
    assert f'"containerPath": "/akri/broker-info/{INSTANCE}"' in spec
    assert f'"AKRI_BROKER_INFO=/akri/broker-info/{INSTANCE}"' in spec

    # What the broker writes: two files fit the claim's 10 KiB (as the API server stores
    # them: each '<' six bytes), the third does not; one more is over the per-file limit.
    (workload / "firmware").write_text("1.2.3")
    (workload / "log-a").write_text("<" * 800)
    (workload / "log-b").write_text("<" * 900)
    (workload / "log-c").write_text("<" * 900)
    (workload / "huge").write_text("x" * 5000)
    await node.copier.pass_once()
    data = await node.data(claim)
    assert data == {"n2/fw": "9", f"{NODE}/firmware": "1.2.3", f"{NODE}/log-a": "<" * 800}
    problems = node.copier.problems(ObjectKey(NS, "echo"))
    assert f"{INSTANCE}: 'huge': over 4096 bytes" in problems
    assert any(f"'log-b': over {DATA_MAX_BYTES} bytes of claim status data" in p for p in problems)

    # Changes go in; the same again writes nothing.
    (workload / "log-a").unlink()
    (workload / "log-b").unlink()
    await node.copier.pass_once()
    data = await node.data(claim)
    assert data == {"n2/fw": "9", f"{NODE}/firmware": "1.2.3", f"{NODE}/log-c": "<" * 900}
    before = (await node.admin.get(dra.RESOURCE_CLAIMS, name, namespace=NS))["metadata"]
    await node.copier.pass_once()
    after = (await node.admin.get(dra.RESOURCE_CLAIMS, name, namespace=NS))["metadata"]
    assert after["resourceVersion"] == before["resourceVersion"]

    # Unprepared: the workload ended, this node's keys leave the claim, the other node's stay.
    await node.preparer.unprepare([ClaimRef(NS, uid, name)])
    await node.copier.pass_once()
    assert await node.data(claim) == {"n2/fw": "9"}
    assert [p.name for p in (node.root / NS / INSTANCE).iterdir()] == [f"ended-{workload.name}"]
