"""Cleanup after a lost node (akri_trio.controller.nodeloss)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.controller import (
    Delete,
    NodeState,
    node_ready,
    node_transition,
    plan_node_loss,
    served_nodes,
)
from akri_trio.controller.nodeloss import pointer
from akri_trio.model.convert import unstructure
from akri_trio.model.naming import ConfigClaim, NodeClaim, parse_usage
from tests.controller.objects import INSTANCE, configuration, instance

SLOT0, SLOT1, SLOT2 = f"{INSTANCE}-0", f"{INSTANCE}-1", f"{INSTANCE}-2"


class PatchFailed(Exception):
    pass


def _walk(doc: Any, path: str) -> tuple[Any, str | int]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    last = parts[-1]
    return doc, int(last) if isinstance(doc, list) else last


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `test` and `remove`, all or nothing (as the API server applies a patch)."""
    out = copy.deepcopy(doc)
    for op in ops:
        parent, key = _walk(out, op["path"])
        try:
            current = parent[key]
        except (KeyError, IndexError):
            raise PatchFailed(op) from None
        if op["op"] == "test" and current != op["value"]:
            raise PatchFailed(op)
        if op["op"] == "remove":
            del parent[key]
    return out


def test_node_ready_reads_the_ready_condition() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert node_ready(ready)
    assert not node_ready({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    assert not node_ready({})


@pytest.mark.parametrize(
    ("previous", "ready", "expected"),
    [
        (None, True, (NodeState.READY, False)),
        (None, False, (NodeState.KNOWN, False)),
        (NodeState.KNOWN, False, (NodeState.KNOWN, False)),
        (NodeState.READY, False, (NodeState.CLEANED, True)),
        (NodeState.CLEANED, False, (NodeState.CLEANED, False)),
        (NodeState.CLEANED, True, (NodeState.READY, False)),
        (NodeState.READY, None, (None, True)),
        (NodeState.KNOWN, None, (None, True)),
        (NodeState.CLEANED, None, (None, False)),
    ],
)
def test_node_transition_cleans_once_after_ready(
    previous: NodeState | None, ready: bool | None, expected: tuple[NodeState | None, bool]
) -> None:
    assert node_transition(previous, ready) == expected


@pytest.mark.parametrize(
    ("previous", "ready", "expected"),
    [
        # First sight of a NotReady node that an Instance or a status names: it had been Ready.
        (None, False, (NodeState.CLEANED, True)),
        # Only at first sight: a node seen NotReady since, and never Ready, stays merely known.
        (NodeState.KNOWN, False, (NodeState.KNOWN, False)),
        (NodeState.CLEANED, False, (NodeState.CLEANED, False)),
        (None, True, (NodeState.READY, False)),
        # Named but absent: deleted while no controller ran.
        (None, None, (None, True)),
    ],
)
def test_a_fresh_controller_cleans_a_serving_node_it_first_sees_lost(
    previous: NodeState | None, ready: bool | None, expected: tuple[NodeState | None, bool]
) -> None:
    assert node_transition(previous, ready, serving=True) == expected


def test_served_nodes_are_instance_nodes_and_status_entries_only() -> None:
    insts = [
        instance(nodes=("node-a", "node-b"), usage={SLOT0: "node-x", SLOT1: "C:cfg-0:node-y"}),
        instance(name="other", nodes=(), finalizers=("node-z", "other.io/finalizer")),
    ]
    status = {"nodes": [{"node": "node-c"}, {"node": ""}, {"x": 1}, "junk"]}
    assert served_nodes(insts, [configuration(status=status)]) == {"node-a", "node-b", "node-c"}
    assert served_nodes([], []) == set()


def test_pointer_escapes() -> None:
    assert pointer("spec", "deviceUsage", "a/b~c", 3) == "/spec/deviceUsage/a~1b~0c/3"


def test_plan_removes_the_node_everywhere_and_frees_only_its_slots() -> None:
    inst = instance(
        nodes=("node-a", "node-b"),
        usage={SLOT0: "node-a", SLOT1: "C:cfg-0:node-a", SLOT2: "node-b"},
        finalizers=("node-b", "node-a"),
    )
    plan = plan_node_loss("node-a", [inst], [])
    assert plan.delete == ()
    (release,) = plan.instances
    assert release.slots == {SLOT0: "node-a", SLOT1: "C:cfg-0:node-a"}
    patched = apply_json_patch(unstructure(inst), release.json_patch())
    assert patched["spec"]["nodes"] == ["node-b"]
    assert patched["spec"]["deviceUsage"] == {SLOT2: "node-b"}
    assert patched["metadata"]["finalizers"] == ["node-b"]


def test_plan_never_blanks_a_slot_it_removes_it() -> None:
    inst = instance(usage={SLOT0: "node-a"})
    (release,) = plan_node_loss("node-a", [inst], []).instances
    assert {op["op"] for op in release.json_patch()} == {"test", "remove"}


def test_last_node_lost_deletes_the_instance_with_uid_precondition() -> None:
    inst = instance(nodes=("node-a",), finalizers=("node-a",))
    plan = plan_node_loss("node-a", [inst], [])
    assert plan.delete == (Delete("ns", INSTANCE, f"{INSTANCE}-uid", "last node node-a lost"),)
    assert plan.delete[0].options()["preconditions"] == {"uid": f"{INSTANCE}-uid"}
    already = instance(nodes=("node-a",), deleting=True)
    assert plan_node_loss("node-a", [already], []).delete == ()


def test_untouched_instances_are_not_in_the_plan() -> None:
    assert plan_node_loss("node-a", [instance(nodes=("node-b",))], []).instances == ()


def test_patch_fails_instead_of_removing_a_changed_entry() -> None:
    inst = instance(nodes=("node-b", "node-a"))
    (release,) = plan_node_loss("node-a", [inst], []).instances
    moved = unstructure(instance(nodes=("node-a",)))  # another write shifted the list
    with pytest.raises(PatchFailed):
        apply_json_patch(moved, release.json_patch())


def test_configuration_status_entry_dropped() -> None:
    status = {"nodes": [{"node": "node-b", "x": 1}, {"node": "node-a", "x": 2}]}
    config = configuration(status=status)
    (release,) = plan_node_loss("node-a", [], [config]).statuses
    patched = apply_json_patch(unstructure(config), release.json_patch())
    assert patched["status"]["nodes"] == [{"node": "node-b", "x": 1}]
    assert plan_node_loss("node-c", [], [config]).statuses == ()


NODES = ["node-a", "node-b", "node-c"]
_value = st.one_of(
    st.just(""),
    st.sampled_from(NODES),
    st.builds(
        lambda v, n: f"C:{v}:{n}", st.sampled_from(["cfg-0", "cfg-1"]), st.sampled_from(NODES)
    ),
    st.just("opaque:thing"),
)


@given(
    st.lists(st.sampled_from(NODES), unique=True, max_size=3),
    st.dictionaries(st.integers(0, 6).map(lambda i: f"{INSTANCE}-{i}"), _value, max_size=7),
    st.lists(st.sampled_from([*NODES, "other.io/finalizer"]), unique=True),
    st.sampled_from(NODES),
)
def test_plan_removes_exactly_that_nodes_entries(
    nodes: list[str], usage: dict[str, str], finalizers: list[str], lost: str
) -> None:
    inst = instance(nodes=tuple(nodes), usage=usage, finalizers=tuple(finalizers))
    plan = plan_node_loss(lost, [inst], [])
    before = unstructure(inst)
    after = apply_json_patch(before, plan.instances[0].json_patch()) if plan.instances else before

    def held_by_lost(value: str) -> bool:
        usage_ = parse_usage(value)
        return isinstance(usage_, NodeClaim | ConfigClaim) and usage_.node == lost

    assert after["spec"].get("nodes", []) == [n for n in nodes if n != lost]
    assert after["metadata"].get("finalizers", []) == [f for f in finalizers if f != lost]
    assert after["spec"].get("deviceUsage", {}) == {
        k: v for k, v in usage.items() if not held_by_lost(v)
    }
    assert {k: v for k, v in after["spec"].items() if k not in ("nodes", "deviceUsage")} == {
        k: v for k, v in before["spec"].items() if k not in ("nodes", "deviceUsage")
    }
    assert bool(plan.delete) == (nodes == [lost])
