"""Instance-level slot claims, frees and the ListAndWatch view (akri_trio.agent.plugins.slots)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akri_trio.agent.plugins.claims import RETRY_CAP_S, RETRY_SLOT_S, retry_pause, usage_patch
from akri_trio.agent.plugins.slots import (
    BadSlot,
    DeviceView,
    OverCapacity,
    SlotError,
    SlotTaken,
    claim,
    claimable_count,
    claimable_slots,
    free,
    held_slots,
    instance_devices,
    node_slots,
    preferred_slots,
)
from akri_trio.model.naming import FREE, NodeClaim, parse_usage, slot_id
from akri_trio.model.resources import Instance, InstanceSpec, ObjectMeta

INST = "akri-onvif-8120fe"
S0, S1, S2 = f"{INST}-0", f"{INST}-1", f"{INST}-2"


def claim2(usage: dict[str, str], slots: list[str], node: str, capacity: int = 2) -> dict[str, str]:
    return claim(usage, slots, node, instance=INST, capacity=capacity)


# --- claim ---------------------------------------------------------------------------------------


def test_claim_free_slot_records_node() -> None:
    assert claim2({}, [S0], "node-a") == {S0: "node-a"}


def test_claim_empty_string_counts_as_free() -> None:
    assert claim2({S0: ""}, [S0], "node-a") == {S0: "node-a"}


def test_claim_does_not_mutate_input() -> None:
    usage = {S1: "node-b"}
    claim2(usage, [S0], "node-a")
    assert usage == {S1: "node-b"}


def test_claim_keeps_other_entries() -> None:
    assert claim2({S1: "node-b", "junk": "x"}, [S0], "node-a") == {
        S0: "node-a",
        S1: "node-b",
        "junk": "x",
    }


def test_claim_already_held_by_this_node_is_idempotent() -> None:
    assert claim2({S0: "node-a"}, [S0], "node-a") == {S0: "node-a"}


def test_claim_several_slots_at_once() -> None:
    assert claim2({}, [S0, S1], "node-a") == {S0: "node-a", S1: "node-a"}


def test_claim_held_by_other_node_raises_slot_taken() -> None:
    with pytest.raises(SlotTaken) as exc:
        claim2({S0: "node-b"}, [S0], "node-a")
    assert (exc.value.slot, exc.value.holder) == (S0, "node-b")


def test_claim_held_by_config_claim_of_same_node_raises_slot_taken() -> None:
    with pytest.raises(SlotTaken) as exc:
        claim2({S0: "C:akri-onvif-0:node-a"}, [S0], "node-a")
    assert exc.value.holder == "C:akri-onvif-0:node-a"


def test_claim_held_by_opaque_value_raises_slot_taken() -> None:
    with pytest.raises(SlotTaken):
        claim2({S0: "C:garbage"}, [S0], "node-a")


def test_claim_is_all_or_nothing_when_one_slot_is_taken() -> None:
    usage = {S1: "node-b"}
    with pytest.raises(SlotTaken):
        claim2(usage, [S0, S1], "node-a")
    assert usage == {S1: "node-b"}


@pytest.mark.parametrize(
    "bad",
    [
        "akri-onvif-a19705-0",  # another instance
        INST,  # no index
        f"{INST}-x",
        f"{INST}--1",
        f"{INST}-01",  # leading zero: not the canonical spelling of slot 1
        f"akri.sh/{INST}-0",  # prefixed (upstream's reclaimer bug spelling)
        "",
    ],
)
def test_claim_rejects_ids_that_are_not_slots_of_this_instance(bad: str) -> None:
    with pytest.raises(BadSlot) as exc:
        claim2({}, [bad], "node-a")
    assert exc.value.slot == bad


def test_claim_rejects_index_at_or_beyond_capacity() -> None:
    with pytest.raises(BadSlot, match="beyond capacity 2"):
        claim2({}, [S2], "node-a")


def test_claim_rejects_a_slot_requested_twice() -> None:
    with pytest.raises(BadSlot, match="twice"):
        claim2({}, [S0, S0], "node-a")


def test_bad_slot_is_a_value_error_and_slot_error() -> None:
    assert issubclass(BadSlot, ValueError)
    assert issubclass(BadSlot, SlotError)
    assert issubclass(SlotTaken, SlotError)
    assert not issubclass(SlotTaken, ValueError)


def test_claim_rejects_empty_node_name() -> None:
    with pytest.raises(ValueError):
        claim2({}, [S0], "")


# --- free ----------------------------------------------------------------------------------------


def test_free_removes_own_claim() -> None:
    assert free({S0: "node-a", S1: "node-b"}, [S0], "node-a") == {S1: "node-b"}


def test_free_never_frees_another_nodes_claim() -> None:
    assert free({S0: "node-b"}, [S0], "node-a") == {S0: "node-b"}


def test_free_never_frees_a_config_claim() -> None:
    usage = {S0: "C:akri-onvif-0:node-a"}
    assert free(usage, [S0], "node-a") == usage


def test_free_of_free_or_unknown_slot_is_noop() -> None:
    assert free({}, [S0, "whatever"], "node-a") == {}
    assert free({S0: ""}, [S0], "node-a") == {S0: ""}


def test_free_does_not_mutate_input() -> None:
    usage = {S0: "node-a"}
    free(usage, [S0], "node-a")
    assert usage == {S0: "node-a"}


def test_free_releases_an_orphan_beyond_capacity() -> None:
    # capacity was cut from 3 to 2 while node-a held slot 2: freeing it must still work
    assert free({S2: "node-a"}, [S2], "node-a") == {}


# --- the ListAndWatch view -----------------------------------------------------------------------


def test_view_health_rules() -> None:
    inst = "cam-000001"
    usage = {
        f"{inst}-1": "node-a",
        f"{inst}-2": "node-b",
        f"{inst}-3": "C:cam-0:node-a",
        f"{inst}-4": "C:cam-0:node-b",
    }
    assert instance_devices(inst, 5, usage, "node-a") == [
        DeviceView(f"{inst}-0", True),  # free
        DeviceView(f"{inst}-1", True),  # held by this node, instance level
        DeviceView(f"{inst}-2", False),  # held by another node
        DeviceView(f"{inst}-3", False),  # configuration level, even this node's
        DeviceView(f"{inst}-4", False),  # configuration level, another node
    ]


def test_view_lists_exactly_capacity_slots() -> None:
    assert [d.id for d in instance_devices(INST, 3, {}, "n")] == [S0, S1, S2]
    assert instance_devices(INST, 0, {}, "n") == []


def test_view_after_capacity_raised_shows_new_free_slots() -> None:
    assert instance_devices(INST, 3, {S0: "node-b", S1: "node-b"}, "node-a") == [
        DeviceView(S0, False),
        DeviceView(S1, False),
        DeviceView(S2, True),
    ]


# --- capacity cut (upstream panics) --------------------------------------------------------------


def test_capacity_cut_orphan_is_not_shown() -> None:
    # capacity 3 -> 2 while node-a held slot 2
    view = instance_devices(INST, 2, {S2: "node-a"}, "node-a")
    assert [d.id for d in view] == [S0, S1]


def test_capacity_cut_orphan_shadows_a_free_slot() -> None:
    # capacity 3 -> 2, slot 2 still held by a running container: only one more user fits
    usage = {S2: "node-b"}
    assert instance_devices(INST, 2, usage, "node-a") == [
        DeviceView(S0, True),
        DeviceView(S1, False),
    ]
    assert claimable_slots(INST, 2, usage) == [S0]


def test_capacity_cut_claim_over_capacity_is_refused() -> None:
    usage = {S2: "node-b", S0: "node-c"}
    with pytest.raises(OverCapacity) as exc:
        claim2(usage, [S1], "node-a")
    assert (exc.value.capacity, exc.value.held) == (2, 3)


def test_capacity_cut_reclaim_of_own_slot_still_allowed() -> None:
    usage = {S2: "node-b", S0: "node-a", S1: "node-c"}
    assert claim2(usage, [S0], "node-a") == usage


def test_capacity_cut_orphan_cannot_be_claimed() -> None:
    with pytest.raises(BadSlot):
        claim2({S2: "node-a"}, [S2], "node-a")


def test_capacity_cut_orphan_still_counts_as_held() -> None:
    assert held_slots(INST, {S2: "node-a", "other-0": "x", S0: ""}) == {S2: NodeClaim("node-a")}


def test_capacity_cut_drains_then_recovers() -> None:
    usage = {S2: "node-b"}
    assert claimable_slots(INST, 2, usage) == [S0]
    usage = free(usage, [S2], "node-b")
    assert claimable_slots(INST, 2, usage) == [S0, S1]


def test_negative_capacity_means_no_slots() -> None:
    assert instance_devices(INST, -1, {}, "n") == []
    assert claimable_slots(INST, -1, {}) == []


# --- helpers -------------------------------------------------------------------------------------


def test_node_slots_lists_only_this_nodes_instance_claims_in_index_order() -> None:
    s10 = f"{INST}-10"
    usage = {s10: "node-a", S2: "node-a", S0: "node-b", S1: "C:akri-onvif-1:node-a"}
    assert node_slots(INST, usage, "node-a") == [S2, s10]


def _instance(usage: dict[str, str], version: str = "41") -> Instance:
    return Instance(
        metadata=ObjectMeta(name=INST, resource_version=version),
        spec=InstanceSpec(
            configuration_name="onvif", cdi_name="akri.sh/onvif=x", capacity=3, device_usage=usage
        ),
    )


def test_usage_patch_holds_only_on_the_version_decided_on_and_touches_only_changed_keys() -> None:
    old = {S0: "node-a", "a/b~c": "C:x-0:node-a", S1: "node-a"}
    new = {S1: "node-a", S2: "node-a"}
    inst = _instance({**old, "other": "node-b"})
    assert usage_patch(inst, old, new) == {
        "metadata": {"resourceVersion": "41"},
        "spec": {"deviceUsage": {"a/b~c": None, S0: None, S2: "node-a"}},
    }


def test_usage_patch_on_an_instance_with_no_map_names_only_the_new_keys() -> None:
    patch = usage_patch(_instance({}, version="7"), {}, {S0: "node-a"})
    assert patch == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"deviceUsage": {S0: "node-a"}},
    }


@given(st.integers(min_value=1, max_value=2000), st.integers(min_value=0, max_value=2000))
def test_retry_pause_grows_with_the_nodes_that_may_still_be_claiming(
    sharing: int, holding: int
) -> None:
    holding = min(holding, sharing)
    nodes = [f"n{i}" for i in range(sharing)]
    usage = {slot_id(INST, i): nodes[i] for i in range(holding)}
    inst = attrs.evolve(
        _instance(usage), spec=attrs.evolve(_instance(usage).spec, nodes=tuple(nodes))
    )
    others = max(1, sharing - holding - (0 if holding else 1))  # n0 asks; it holds one if any
    assert 0 <= retry_pause(inst, "n0") <= min(RETRY_CAP_S, RETRY_SLOT_S * others)


# --- properties: random multi-node histories on one shared usage map -----------------------------

NODES = ["node-a", "node-b", "node-c"]

op_strategy = st.one_of(
    st.tuples(
        st.just("claim"),
        st.sampled_from(NODES),
        st.lists(st.integers(0, 5), min_size=1, max_size=3),
    ),
    st.tuples(
        st.just("free"), st.sampled_from(NODES), st.lists(st.integers(0, 5), min_size=1, max_size=3)
    ),
    st.tuples(st.just("capacity"), st.sampled_from(NODES), st.lists(st.integers(0, 5), max_size=1)),
    st.tuples(st.just("config"), st.sampled_from(NODES), st.lists(st.integers(0, 5), max_size=1)),
)


@settings(max_examples=800)
@given(start_capacity=st.integers(0, 5), ops=st.lists(op_strategy, max_size=40))
def test_random_histories_keep_slots_exclusive_and_within_capacity(
    start_capacity: int, ops: list[tuple[str, str, list[int]]]
) -> None:
    capacity = start_capacity
    usage: dict[str, str] = {}
    for kind, node, indices in ops:
        slots = [f"{INST}-{i}" for i in indices]
        before_held = len(held_slots(INST, usage))
        if kind == "capacity":
            capacity = indices[0] if indices else capacity
            continue
        if kind == "config":
            # another plugin (configuration level) takes a claimable slot, as vdevs.allocate does
            free_ids = claimable_slots(INST, capacity, usage)
            if free_ids:
                usage = {**usage, free_ids[0]: f"C:akri-onvif-0:{node}"}
        elif kind == "claim":
            try:
                new = claim(usage, slots, node, instance=INST, capacity=capacity)
            except SlotError:
                continue
            for s in slots:
                # (a) a successful claim only ever took free slots or re-took its own
                assert usage.get(s, "") in ("", node)
                assert new[s] == node
            changed = {k for k in new if usage.get(k) != new[k]}
            assert changed <= set(slots)
            # (b) a claim that takes something new never leaves more held than capacity
            if changed:
                assert len(held_slots(INST, new)) <= capacity
            usage = new
        else:
            new = free(usage, slots, node)
            removed = set(usage) - set(new)
            assert all(usage[k] == node and k in slots for k in removed)
            assert all(new[k] == usage[k] for k in new)
            usage = new
        after_held = len(held_slots(INST, usage))
        # (b') the held count only exceeds capacity if it did before (a capacity cut), and
        # then it never grows
        assert after_held <= max(capacity, before_held)
        for viewer in NODES:
            view = instance_devices(INST, capacity, usage, viewer)
            healthy = [d.id for d in view if d.healthy]
            free_or_own = [d.id for d in view if usage.get(d.id, "") in ("", viewer)]
            # (c) never offer more healthy slots than are free-or-its-own
            assert set(healthy) <= set(free_or_own)
            # never advertise more free slots than the capacity budget allows
            own = [d.id for d in view if usage.get(d.id, "") == viewer]
            assert len(healthy) - len(own) <= max(0, capacity - after_held)


@settings(max_examples=500)
@given(
    capacity=st.integers(1, 5),
    held=st.dictionaries(st.integers(0, 4), st.sampled_from(NODES), max_size=5),
)
def test_every_healthy_free_slot_is_claimable(capacity: int, held: dict[int, str]) -> None:
    usage = {f"{INST}-{i}": n for i, n in held.items()}
    for viewer in NODES:
        for device in instance_devices(INST, capacity, usage, viewer):
            if device.healthy:
                # what the view offers, claim accepts: the kubelet is not lied to
                new = claim(usage, [device.id], viewer, instance=INST, capacity=capacity)
                assert new[device.id] == viewer


# --- the sparse implementations against the obvious ones ---------------------------------------


def _claimable_by_scan(capacity: int, usage: dict[str, str]) -> list[str]:
    """The definition, slot by slot over the capacity (what slots.py did before it walked the
    sparse map instead)."""
    budget = capacity - len(held_slots(INST, usage))
    free_ids = [
        slot_id(INST, i)
        for i in range(max(capacity, 0))
        if parse_usage(usage.get(slot_id(INST, i), "")) == FREE
    ]
    return free_ids[: max(budget, 0)]


def _devices_by_scan(capacity: int, usage: dict[str, str], node: str) -> list[DeviceView]:
    claimable = set(_claimable_by_scan(capacity, usage))
    out = []
    for i in range(max(capacity, 0)):
        sid = slot_id(INST, i)
        holder = parse_usage(usage.get(sid, ""))
        healthy = sid in claimable if holder == FREE else holder == NodeClaim(node)
        out.append(DeviceView(sid, healthy))
    return out


USAGE_KEYS = st.one_of(
    st.integers(0, 7).map(lambda i: slot_id(INST, i)),  # slots, orphans beyond capacity too
    # not slots of INST
    st.sampled_from([f"{INST}-01", f"{INST}-x", f"{INST}-²", "other-inst-0", INST, ""]),
)
USAGE_VALUES = st.sampled_from(["", *NODES, "C:cfg-0:node-a", "C:cfg-1:node-b", "C:bad"])


@settings(max_examples=1000)
@given(
    capacity=st.integers(-1, 6),
    usage=st.dictionaries(USAGE_KEYS, USAGE_VALUES, max_size=8),
    node=st.sampled_from(NODES),
)
def test_sparse_walk_equals_the_slot_by_slot_definition(
    capacity: int, usage: dict[str, str], node: str
) -> None:
    expected = _claimable_by_scan(capacity, usage)
    assert claimable_slots(INST, capacity, usage) == expected
    assert claimable_count(INST, capacity, usage) == len(expected)
    assert instance_devices(INST, capacity, usage, node) == _devices_by_scan(capacity, usage, node)


# ---- preferred slots: nodes choosing at the same moment do not collide ---------------------


@given(
    capacity=st.integers(min_value=1, max_value=64),
    data=st.data(),
)
def test_nodes_up_to_capacity_prefer_distinct_slots_from_the_same_free_set(
    capacity: int, data: st.DataObject
) -> None:
    n = data.draw(st.integers(min_value=1, max_value=capacity))
    nodes = data.draw(
        st.lists(st.text("abcdefgh-", min_size=1), min_size=n, max_size=n, unique=True)
    )
    free = [slot_id("inst", i) for i in range(capacity)]
    picks = [preferred_slots("inst", capacity, nodes, node, free, [], 1) for node in nodes]
    assert all(len(p) == 1 for p in picks)
    assert len({p[0] for p in picks}) == n


def test_preferred_slots_put_must_first_then_go_round_from_the_nodes_offset() -> None:
    free = [slot_id("inst", i) for i in range(4)]
    # node "b" is second of two: it starts at 4 // 2 = 2 and wraps round
    assert preferred_slots("inst", 4, ["a", "b"], "b", free, [], 4) == [
        "inst-2",
        "inst-3",
        "inst-0",
        "inst-1",
    ]
    assert preferred_slots("inst", 4, ["a", "b"], "b", free, ["inst-1"], 2) == ["inst-1", "inst-2"]
    # a node not (yet) listed starts at 0; only available slots are offered
    assert preferred_slots("inst", 4, ["a"], "z", ["inst-3", "inst-1"], [], 1) == ["inst-1"]
