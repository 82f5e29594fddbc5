"""Cleanup after a lost node (akri_trio.controller.nodeloss)."""

from __future__ import annotations

import copy
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio import dra
from akri_trio.controller import (
    Delete,
    NodeState,
    Transition,
    freed_resources,
    node_ready,
    node_transition,
    plan_node_loss,
    ready_changed_at,
    served_nodes,
    shared_claim_holders,
    slot_holders,
)
from akri_trio.model.convert import unstructure
from akri_trio.model.jsonpatch import pointer
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
    assert node_transition(previous, ready) == Transition(*expected)


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
    assert node_transition(previous, ready, serving=True) == Transition(*expected)
    # NotReady for longer than the grace: the same.
    after_grace = node_transition(previous, ready, serving=True, not_ready_for=301, grace=300)
    assert after_grace == Transition(*expected)


@pytest.mark.parametrize(
    ("not_ready_for", "expected"),
    [
        # A kubelet restarting while the controller starts: not lost yet, looked at again when
        # the grace ends, and not remembered meanwhile (the next look is a first sight again).
        (0.0, Transition(None, recheck_after=300.0)),
        (60.0, Transition(None, recheck_after=240.0)),
        # A lastTransitionTime ahead of this clock: no later than a whole grace from now.
        (-30.0, Transition(None, recheck_after=300.0)),
        (300.0, Transition(NodeState.CLEANED, clean=True)),
        (3600.0, Transition(NodeState.CLEANED, clean=True)),
    ],
)
def test_a_fresh_controller_waits_out_the_grace_of_a_node_it_first_sees_not_ready(
    not_ready_for: float, expected: Transition
) -> None:
    got = node_transition(None, False, serving=True, not_ready_for=not_ready_for, grace=300.0)
    assert got == expected


@pytest.mark.parametrize("previous", [NodeState.READY, NodeState.KNOWN, NodeState.CLEANED])
def test_the_grace_is_only_for_a_first_sight(previous: NodeState) -> None:
    # Seen going from Ready to NotReady: cleaned at once, as upstream; a node seen NotReady
    # since it was first seen stays known, whatever its condition's age.
    live = node_transition(previous, False, serving=True, not_ready_for=0.0, grace=300.0)
    assert live == node_transition(previous, False)
    assert live.recheck_after is None


@given(
    not_ready_for=st.floats(min_value=-1e6, max_value=1e6),
    grace=st.floats(min_value=0, max_value=1e5),
)
def test_a_serving_node_is_cleaned_after_exactly_the_grace(
    not_ready_for: float, grace: float
) -> None:
    t = node_transition(None, False, serving=True, not_ready_for=not_ready_for, grace=grace)
    assert t.clean == (not_ready_for >= grace or grace == 0)
    if not t.clean:
        assert t.state is None and t.recheck_after is not None
        assert 0 < t.recheck_after <= grace
        if not_ready_for >= 0:
            assert t.recheck_after == pytest.approx(grace - not_ready_for)
    # A node serving nothing, or Ready, never waits.
    assert node_transition(None, False, not_ready_for=not_ready_for, grace=grace) == Transition(
        NodeState.KNOWN
    )
    ready = node_transition(None, True, serving=True, not_ready_for=not_ready_for, grace=grace)
    assert ready == Transition(NodeState.READY)


def test_ready_changed_at_reads_the_ready_conditions_last_transition() -> None:
    def node(*conditions: dict[str, str]) -> dict[str, object]:
        return {"status": {"conditions": list(conditions)}}

    pressure = {"type": "MemoryPressure", "lastTransitionTime": "2020-01-01T00:00:00Z"}
    ready = {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-23T18:00:00Z"}
    assert ready_changed_at(node(pressure, ready)) == 1795456800.0
    assert ready_changed_at(node(pressure)) is None
    assert ready_changed_at(node({"type": "Ready", "status": "False"})) is None
    assert ready_changed_at(node({"type": "Ready", "lastTransitionTime": "yesterday"})) is None
    assert ready_changed_at({}) is None


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


def test_plan_removes_only_the_lost_nodes_broker_info() -> None:
    inst = attrs.evolve(
        instance(nodes=("node-a", "node-b")),
        spec=attrs.evolve(
            instance().spec,
            nodes=("node-a", "node-b"),
            broker_info={"node-a/url": "http://a", "node-a/ok": "1", "node-b/url": "http://b"},
        ),
    )
    (release,) = plan_node_loss("node-a", [inst], []).instances
    assert release.broker_info == {"node-a/url": "http://a", "node-a/ok": "1"}
    patched = apply_json_patch(unstructure(inst), release.json_patch())
    assert patched["spec"]["brokerInfo"] == {"node-b/url": "http://b"}
    # Reports alone make a release too: a node that left `nodes` but whose reports stayed.
    only_reports = attrs.evolve(inst, spec=attrs.evolve(inst.spec, nodes=("node-b",)))
    (release,) = plan_node_loss("node-a", [only_reports], []).instances
    assert release.node_indexes == () and len(release.broker_info) == 2


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


# --- DRA mode: the lost node's Pods holding a shared device ------------------------------------

SHARED_POOL = dra.shared_pool("ns", INSTANCE)


def _pod(name: str, node: str, phase: str = "Running", namespace: str = "ns") -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "uid": f"{name}-uid"}
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def _claim(
    name: str,
    reserved: list[str],
    pool: str = SHARED_POOL,
    driver: str = dra.DRIVER,
    namespace: str = "ns",
) -> dict[str, Any]:
    result = {"request": "device", "driver": driver, "pool": pool, "device": "d"}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"{p}-uid"} for p in reserved],
        },
    }


def test_a_lost_nodes_pods_holding_a_shared_device_are_deleted_at_once() -> None:
    pods = [_pod("lost", "n2"), _pod("kept", "n1")]
    claims = [_claim("c-lost", ["lost"]), _claim("c-kept", ["kept"])]
    (d,) = shared_claim_holders("n2", pods, claims)
    assert (d.namespace, d.name, d.uid, d.grace_period_seconds) == ("ns", "lost", "lost-uid", 0)
    assert d.options()["gracePeriodSeconds"] == 0
    assert d.options()["preconditions"] == {"uid": "lost-uid"}


def test_a_claim_reserved_for_several_pods_deletes_only_the_lost_nodes() -> None:
    pods = [_pod("a", "n2"), _pod("b", "n1"), _pod("c", "n2")]
    deletes = shared_claim_holders("n2", pods, [_claim("shared", ["a", "b", "c"])])
    assert [d.name for d in deletes] == ["a", "c"]


@pytest.mark.parametrize(
    "claim",
    [
        _claim("other-driver", ["p"], driver="gpu.example.com"),
        _claim("node-pool", ["p"], pool=dra.node_pool("n2", "ns")),
        _claim("other-namespace", ["p"], namespace="elsewhere"),
        {"metadata": {"name": "unallocated", "namespace": "ns"}, "status": {}},
    ],
    ids=lambda c: c["metadata"]["name"],
)
def test_only_claims_of_our_shared_pools_count(claim: dict[str, Any]) -> None:
    """Another driver's device, a device of the lost node's own pool (no other node could use
    it), a claim of another namespace (reservations name Pods of the claim's namespace) and an
    unallocated claim free nothing another node could take."""
    assert shared_claim_holders("n2", [_pod("p", "n2")], [claim]) == []


def test_ended_pods_and_pods_elsewhere_are_left_alone() -> None:
    pods = [_pod("done", "n2", "Succeeded"), _pod("failed", "n2", "Failed"), _pod("p", "n1")]
    claims = [_claim("c", ["done", "failed", "p"])]
    assert shared_claim_holders("n2", pods, claims) == []


def test_a_shortened_shared_pool_name_is_still_shared() -> None:
    long_pool = dra.shared_pool("ns", "x" * 300)
    assert long_pool != f"shared/ns/{'x' * 300}" and dra.is_shared_pool(long_pool)
    assert not dra.is_shared_pool(dra.node_pool("shared", "ns"))


# --- device-plugin mode: the lost node's Pods holding the slots it frees -----------------------


def _dp_pod(name: str, node: str, limits: dict[str, str], phase: str = "Running") -> dict[str, Any]:
    pod = _pod(name, node, phase)
    pod["spec"]["containers"] = [{"name": "c", "resources": {"limits": limits}}]
    return pod


def test_the_freed_names_are_the_instances_and_the_configurations_of_the_freed_slots() -> None:
    usage = {f"{INSTANCE}-0": "n2", f"{INSTANCE}-1": "C:cfg-3:n2", f"{INSTANCE}-2": "C:bad:n2"}
    plan = plan_node_loss("n2", [instance(nodes=("n1", "n2"), usage=usage)], [])
    assert freed_resources(plan.instances) == {f"akri.sh/{INSTANCE}", "akri.sh/cfg"}


def test_a_lost_nodes_pods_asking_for_a_freed_resource_are_deleted_at_once() -> None:
    freed = {f"akri.sh/{INSTANCE}"}
    pods = [
        _dp_pod("holder", "n2", {f"akri.sh/{INSTANCE}": "1"}),
        _dp_pod("elsewhere", "n1", {f"akri.sh/{INSTANCE}": "1"}),
        _dp_pod("other-device", "n2", {"akri.sh/other": "1"}),
        _dp_pod("ended", "n2", {f"akri.sh/{INSTANCE}": "1"}, phase="Succeeded"),
    ]
    (d,) = slot_holders("n2", pods, freed)
    assert (d.name, d.uid, d.grace_period_seconds) == ("holder", "holder-uid", 0)
    assert d.options()["preconditions"] == {"uid": "holder-uid"}
