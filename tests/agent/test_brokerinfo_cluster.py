"""brokerInfo against the real API server: two nodes' agents (their copy loops, each with its
own workload directories) on one shared Instance. Each writes only its own `<node>/` keys, a
removed file leaves the map, a skipped file is reported, and an ended workload's report stays
until the node's next workload starts; keys another writer puts under a node's name are
taken back."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import BrokerInfo, Limits, WorkloadDirs, node_entries
from akri_trio.agent.view import NodeView
from akri_trio.kube.client import PATCH_APPLY, Client
from akri_trio.kube.errors import ApiError
from akri_trio.model.resources import INSTANCES
from tests.support.akri_cluster import NAMESPACES, ensure_namespace, install_crds
from tests.support.polling import until_api

# One namespace per test (a deleted namespace takes a while to go).
NS = ""
CONFIG = ObjectKey("", "bi-cfg")
INST = ObjectKey("", "bi-cfg-abcdef")
LIMITS = Limits(max_files=4, max_file_bytes=16, max_total_bytes=64)


async def ensure_brokerinfo_schema(api: Client, namespace: str) -> None:
    """Install the CRDs and wait until the API server takes a brokerInfo apply (a dry run):
    the schema reaches server-side apply a moment after the CRD changes, and on the shared
    test cluster other sessions' tests re-apply CRDs of their own checkouts."""
    body = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": "bi-schema-probe", "namespace": namespace},
        "spec": {"configurationName": "x", "cdiName": "x", "capacity": 1, "brokerInfo": {}},
    }
    path = INSTANCES.path(namespace, "bi-schema-probe")
    params = {"fieldManager": "bi-probe", "dryRun": "All"}

    async def taken() -> bool:
        try:
            await api.request("PATCH", path, params=params, body=body, content_type=PATCH_APPLY)
        except ApiError:
            await install_crds(api)
            return False
        return True

    await until_api(taken, 30, "a brokerInfo apply taken", poll=0.2)


@pytest.fixture
async def ns(api: Client) -> AsyncIterator[str]:
    global NS, CONFIG, INST
    NS = f"bi-{secrets.token_hex(3)}"
    CONFIG, INST = ObjectKey(NS, CONFIG.name), ObjectKey(NS, INST.name)
    await ensure_namespace(api, NS)
    await ensure_brokerinfo_schema(api, NS)
    body = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": INST.name, "namespace": NS},
        "spec": {
            "configurationName": CONFIG.name,
            "cdiName": "akri.sh/bi-cfg=abcdef",
            "capacity": 2,
            "shared": True,
            "nodes": ["bi-a", "bi-b"],
            "deviceUsage": {f"{INST.name}-0": "bi-a", f"{INST.name}-1": "bi-b"},
        },
    }
    await api.create(INSTANCES, body, namespace=NS)
    yield NS
    await api.delete(NAMESPACES, NS)


class Node:
    def __init__(self, api: Client, name: str, root: Path) -> None:
        self.view = NodeView(name)
        self.info = BrokerInfo(
            api,
            self.view,
            WorkloadDirs(root, generation=lambda key: 1 if key == CONFIG else None),
            limits=LIMITS,
            current=lambda _: self.seen.get("spec", {}).get("brokerInfo"),
            namespace=NS,
        )
        self.seen: dict[str, Any] = {}

    async def sync(self, api: Client) -> None:
        """One copy pass on what the watch would have delivered by then."""
        await ensure_brokerinfo_schema(api, NS)
        self.seen = await api.get(INSTANCES, INST.name, namespace=NS)
        self.view.put_instance(self.seen)
        await self.info.pass_once()

    def workload(self, slot: int) -> Path:
        inst = self.view.instance(INST)
        assert inst is not None
        mount = self.info.dirs.mount(inst, [f"{INST.name}-{slot}"])
        assert mount is not None
        return Path(mount.host_path)


async def _reporting(api: Client, root: Path, name: str, text: str) -> tuple[Node, Path]:
    """Node bi-a's agent with a workload on slot 0 whose file `name` holds `text`, copied."""
    node = Node(api, "bi-a", root)
    await node.sync(api)
    work = node.workload(0)
    (work / name).write_text(text)
    await node.sync(api)
    return node, work


async def _broker_info(api: Client) -> dict[str, Any]:
    await ensure_brokerinfo_schema(api, NS)  # the field is stored; read it with our schema
    obj = await api.get(INSTANCES, INST.name, namespace=NS)
    return dict(obj["spec"].get("brokerInfo") or {})


async def test_nodes_write_their_own_keys_of_a_shared_instance(
    api: Client, ns: str, tmp_path: Path
) -> None:
    a, b = Node(api, "bi-a", tmp_path / "a"), Node(api, "bi-b", tmp_path / "b")
    await a.sync(api)
    await b.sync(api)
    wa, wb = a.workload(0), b.workload(1)
    (wa / "status").write_text("flashed")
    (wa / "firmware").write_text("1.2")
    (wb / "status").write_text("waiting")
    await a.sync(api)
    await b.sync(api)
    assert await _broker_info(api) == {
        "bi-a/firmware": "1.2",
        "bi-a/status": "flashed",
        "bi-b/status": "waiting",
    }
    obj = await api.get(INSTANCES, INST.name, namespace=NS)
    managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
    assert {"brokerinfo-bi-a", "brokerinfo-bi-b"} <= managers

    # A removed file leaves the map; the other node's entry is untouched.
    (wa / "status").unlink()
    await a.sync(api)
    assert await _broker_info(api) == {"bi-a/firmware": "1.2", "bi-b/status": "waiting"}

    # Too big and not UTF-8: skipped, reported under the Configuration, the rest still copied.
    (wb / "log").write_bytes(b"x" * 17)
    (wb / "raw").write_bytes(b"\xff")
    await b.sync(api)
    assert await _broker_info(api) == {"bi-a/firmware": "1.2", "bi-b/status": "waiting"}
    assert b.info.problems(CONFIG) == [
        f"{INST.name}: 'log': over 16 bytes",
        f"{INST.name}: 'raw': not UTF-8",
    ]
    assert a.info.problems(CONFIG) == []


async def test_an_ended_workload_leaves_its_report_until_the_next_one(
    api: Client, ns: str, tmp_path: Path
) -> None:
    a, _ = await _reporting(api, tmp_path, "firmware", "2.0")
    assert await _broker_info(api) == {"bi-a/firmware": "2.0"}

    # The slot is freed (the reclaimer's write): the directory goes, the report stays.
    slot = f"{INST.name}-0"
    ops = [{"op": "remove", "path": f"/spec/deviceUsage/{slot}"}]
    await api.json_patch(INSTANCES, INST.name, ops, field_manager="dp-bi-a", namespace=NS)
    await a.sync(api)
    (ended,) = (tmp_path / NS / INST.name).iterdir()
    assert ended.name.startswith(f"ended-{slot}.g1.")
    assert await _broker_info(api) == {"bi-a/firmware": "2.0"}

    # The node's next workload on the Instance starts with an empty report.
    patch = {"spec": {"deviceUsage": {slot: "bi-a"}}}
    await api.merge_patch(INSTANCES, INST.name, patch, namespace=NS)
    await a.sync(api)
    a.workload(0)
    await a.sync(api)
    assert await _broker_info(api) == {}


async def test_a_restarted_agent_removes_entries_whose_directories_are_gone(
    api: Client, ns: str, tmp_path: Path
) -> None:
    await _reporting(api, tmp_path / "old", "firmware", "1.0")
    assert await _broker_info(api) == {"bi-a/firmware": "1.0"}

    restarted = Node(api, "bi-a", tmp_path / "new")  # its directory root is empty
    restarted.info.known = lambda: [INST]
    await restarted.sync(api)
    assert await _broker_info(api) == {}


async def test_keys_another_writer_put_under_the_node_s_name_are_taken_back(
    api: Client, ns: str, tmp_path: Path
) -> None:
    a, work = await _reporting(api, tmp_path, "status", "ok")
    # Another field manager writes under bi-a/: over a key a file has, and one no file has.
    forged = {"bi-a/status": "forged", "bi-a/extra": "x", "bi-b/status": "theirs"}
    body = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": INST.name, "namespace": NS},
        "spec": {"brokerInfo": forged},
    }
    await api.apply(INSTANCES, body, field_manager="someone", force=True, namespace=NS)
    await a.sync(api)
    assert await _broker_info(api) == {"bi-a/status": "ok", "bi-b/status": "theirs"}
    # The node's part of the map is its files again, so its next passes write nothing.
    await a.sync(api)
    assert node_entries(a.seen["spec"]["brokerInfo"], "bi-a") == {"bi-a/status": "ok"}

    # With no file left, the last foreign key goes too (the map ends up empty).
    body["spec"] = {"brokerInfo": {"bi-a/extra": "y"}}
    await api.apply(INSTANCES, body, field_manager="someone", force=True, namespace=NS)
    (work / "status").unlink()
    await a.sync(api)
    assert await _broker_info(api) == {}
