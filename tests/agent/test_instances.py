"""The Instance plan: what this node writes for what it discovered, and nothing more."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.agent.discovery_streams import DiscoveredDevice
from akri_trio.agent.instance_plan import (
    Apply,
    Guarded,
    Leave,
    Operation,
    desired_body,
    guarded_departure,
    in_node_order,
    plan,
)
from akri_trio.model.convert import structure
from akri_trio.model.device import Device
from akri_trio.model.resources import Configuration, Instance

NODE = "node-a"


def config(capacity: int = 2, props: dict[str, str] | None = None) -> Configuration:
    return structure(
        {
            "metadata": {"name": "cam", "namespace": "ns", "uid": "cfg-uid"},
            "spec": {
                "discoveryHandler": {"name": "debugEcho"},
                "capacity": capacity,
                "brokerProperties": props or {},
            },
        },
        Configuration,
    )


def found(device_id: str, shared: bool = True, **props: str) -> DiscoveredDevice:
    return DiscoveredDevice(Device(device_id, {"ID": device_id, **props}), shared, "embedded")


def as_cluster(body: dict[str, Any], **spec_changes: Any) -> Instance:
    """What the API server would hold after applying `body` (plus optional drift)."""
    data = {**body, "spec": {**body["spec"], **spec_changes}}
    return structure(data, Instance)


def test_new_device_is_applied_with_upstream_names_and_fields() -> None:
    (op,) = plan(NODE, config(props={"ID": "override"}), [found("my_shared_device")], {})
    assert isinstance(op, Apply)
    assert op.name == "cam-4294ea"  # upstream's hash vector for "my_shared_device"
    meta, spec = op.body["metadata"], op.body["spec"]
    assert meta["finalizers"] == [NODE]
    assert meta["ownerReferences"][0]["uid"] == "cfg-uid"
    assert meta["ownerReferences"][0]["controller"] is True
    assert spec == {
        "configurationName": "cam",
        "cdiName": "akri.sh/cam=4294ea",
        "capacity": 2,
        "brokerProperties": {"ID": "override"},  # the Configuration wins on a clash
        "shared": True,
        "nodes": [NODE],
    }


def test_local_devices_hash_the_node_name() -> None:
    (op,) = plan("my_node", config(), [found("my_local_device", shared=False)], {})
    assert op.name == "cam-e77db4"


def test_unchanged_discovery_writes_nothing() -> None:
    cfg, dev = config(), found("a")
    body = desired_body(cfg, dev, NODE)
    assert plan(NODE, cfg, [dev], {body["metadata"]["name"]: as_cluster(body)}) == []


def test_instance_shared_with_another_node_is_joined() -> None:
    cfg, dev = config(), found("a")
    body = desired_body(cfg, dev, "node-b")
    theirs = as_cluster(body)
    (op,) = plan(NODE, cfg, [dev], {theirs.metadata.name: theirs})
    assert isinstance(op, Apply) and op.body["spec"]["nodes"] == [NODE]


def test_capacity_and_property_changes_propagate() -> None:
    dev = found("a")
    body = desired_body(config(), dev, NODE)
    current = {body["metadata"]["name"]: as_cluster(body)}
    (op,) = plan(NODE, config(capacity=3), [dev], current)
    assert isinstance(op, Apply) and op.body["spec"]["capacity"] == 3
    (op,) = plan(NODE, config(props={"X": "1"}), [dev], current)
    assert isinstance(op, Apply) and op.body["spec"]["brokerProperties"]["X"] == "1"


def test_vanished_device_is_left_by_uid_with_an_empty_nodes_and_the_values_read() -> None:
    cfg = config()
    body = desired_body(cfg, found("a"), NODE)
    body["metadata"]["uid"] = "inst-uid"
    current = as_cluster(body, nodes=[NODE, "node-b"])
    (op,) = plan(NODE, cfg, [], {current.metadata.name: current})
    assert isinstance(op, Leave)
    # the required fields as read (so the last node's leave is valid), no finalizer, no node
    assert op.body["spec"] == {
        "configurationName": "cam",
        "cdiName": current.spec.cdi_name,
        "capacity": 2,
        "nodes": [],
    }
    meta = op.body["metadata"]
    assert "finalizers" not in meta
    # the uid: the API server refuses to create an object from an apply that names one
    assert (meta["name"], meta["namespace"], meta["uid"]) == (
        current.metadata.name,
        "ns",
        "inst-uid",
    )
    assert meta["ownerReferences"] == list(current.metadata.owner_references)
    # no resourceVersion: any number of nodes leave at once without a conflict
    assert "resourceVersion" not in meta


def test_a_leave_without_a_known_uid_states_nothing_that_could_create() -> None:
    cfg = config()
    current = as_cluster(desired_body(cfg, found("a"), NODE), nodes=[NODE, "node-b"])
    assert not current.metadata.uid
    (op,) = plan(NODE, cfg, [], {current.metadata.name: current})
    assert isinstance(op, Leave)
    assert op.body["spec"] == {"nodes": []}  # no required field either
    assert "uid" not in op.body["metadata"]


@given(
    st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=10),
    st.text(min_size=1, max_size=20),
)
def test_node_order_is_a_rotation_of_the_plan(names: list[str], node: str) -> None:
    ops: list[Operation] = [Apply(n, {}) for n in sorted(names)]
    ordered = in_node_order(ops, node)
    assert sorted(ordered, key=lambda op: op.name) == ops
    if ops:
        start = ops.index(ordered[0])
        assert ordered == ops[start:] + ops[:start]
    assert in_node_order(ops, node) == ordered  # the same node, the same order


def test_nodes_start_their_shared_writes_on_different_instances() -> None:
    ops = [Apply(f"cam-{i}", {}) for i in range(10)]
    firsts = Counter(in_node_order(ops, f"fleet-{n:03d}")[0].name for n in range(50))
    assert len(firsts) >= 8 and max(firsts.values()) <= 12  # not all fifty on one Instance


def test_guarded_leave_is_a_json_patch_testing_the_read_version() -> None:
    """Never an apply: the API server creates a missing object from an apply even when it
    carries a resourceVersion; a JSON patch of a missing object is a 404."""
    cfg = config()
    body = desired_body(cfg, found("a"), NODE)
    current = as_cluster(body, nodes=["node-b", NODE])
    op = guarded_departure(current, NODE)
    assert not op.delete
    rv = current.metadata.resource_version
    assert op.ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "remove", "path": "/metadata/finalizers/0"},
        {"op": "remove", "path": "/spec/nodes/1"},
    ]


def test_last_node_drops_its_finalizer_then_deletes() -> None:
    cfg = config()
    current = as_cluster(desired_body(cfg, found("a"), NODE))
    (op,) = plan(NODE, cfg, [], {current.metadata.name: current})
    assert isinstance(op, Guarded) and op.delete
    rv = current.metadata.resource_version
    assert op.ops == [  # the node entry stays: the Instance is deleted next
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]


def test_instances_of_other_nodes_are_not_touched() -> None:
    cfg = config()
    theirs = as_cluster(desired_body(cfg, found("a"), "node-b"))
    assert plan(NODE, cfg, [], {theirs.metadata.name: theirs}) == []


def test_instance_being_deleted_is_left_not_rejoined() -> None:
    cfg, dev = config(), found("a")
    body = desired_body(cfg, dev, NODE)
    body["metadata"]["deletionTimestamp"] = "2026-11-22T00:00:00Z"
    current = as_cluster(body)
    (op,) = plan(NODE, cfg, [dev], {current.metadata.name: current})
    assert isinstance(op, Leave)  # the garbage collector is deleting it: just drop out
    assert "finalizers" not in op.body["metadata"]
    body["metadata"]["finalizers"] = []
    gone_soon = as_cluster(body, nodes=[])
    assert plan(NODE, cfg, [dev], {gone_soon.metadata.name: gone_soon}) == []


ids = st.lists(st.sampled_from(["a", "b", "c", "d"]), unique=True)


@given(before=ids, after=ids)
def test_plan_converges_in_one_step(before: list[str], after: list[str]) -> None:
    """Apply the plan for `before`, then for `after`: a second plan for `after` is empty."""
    cfg = config()
    cluster: dict[str, Instance] = {}

    def run(device_ids: list[str]) -> None:
        for op in plan(NODE, cfg, [found(i) for i in device_ids], cluster):
            if isinstance(op, Apply):
                cluster[op.name] = as_cluster(op.body)
            else:
                assert isinstance(op, Guarded) and op.delete  # the only node: it deletes
                del cluster[op.name]

    run(before)
    run(after)
    assert plan(NODE, cfg, [found(i) for i in after], cluster) == []
    assert len(cluster) == len(after)
