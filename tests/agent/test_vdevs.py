"""Configuration-level virtual devices (akri_trio.agent.plugins.vdevs), incl. seed 000's examples.

Seed ids "0", "1", ... are upstream's old placeholders; today they are `<config>-<n>`, so seed
"3" is `akri-onvif-3` here.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from akri_trio.agent.plugins.slots import (
    DeviceView,
    InstanceSlots,
    SlotError,
    claim,
    claimable_slots,
    held_slots,
    slot_index,
)
from akri_trio.agent.plugins.vdevs import (
    AllocationPlan,
    BadVdev,
    NotEnoughInstances,
    Placement,
    VdevError,
    allocate,
    config_devices,
    free_vdevs,
    preferred_allocation,
    vdev_holdings,
)
from akri_trio.model.naming import ConfigClaim, parse_usage

CFG = "akri-onvif"
CAM_A = "akri-onvif-8120fe"
CAM_B = "akri-onvif-a19705"
NODE = "node-a"


def v(n: int) -> str:
    return f"{CFG}-{n}"


def cl(n: int, node: str = NODE) -> str:
    return f"C:{v(n)}:{node}"


def cams(
    usage_a: dict[str, str] | None = None, usage_b: dict[str, str] | None = None
) -> dict[str, InstanceSlots]:
    return {
        CAM_A: InstanceSlots(2, usage_a or {}),
        CAM_B: InstanceSlots(2, usage_b or {}),
    }


def ids(view: list[DeviceView]) -> list[str]:
    assert all(d.healthy for d in view)
    return [d.id for d in view]


def placements(plan: AllocationPlan) -> list[list[tuple[str, str, str]]]:
    return [[(p.vdev, p.instance, p.slot) for p in c] for c in plan.containers]


# "3" (a19705-1) is the only slot in use, held by this node's configuration plugin
ONLY_3 = cams({}, {f"{CAM_B}-1": cl(3)})


# --- seed 000: the ListAndWatch view -------------------------------------------------------------


def test_seed_all_free_reports_one_vdev_per_camera() -> None:
    assert ids(config_devices(CFG, cams(), NODE)) == [v(0), v(1)]


def test_seed_held_vdev_4_plus_one_per_camera_with_room() -> None:
    state = cams({f"{CAM_A}-1": cl(4)})
    assert ids(config_devices(CFG, state, NODE)) == [v(0), v(1), v(4)]


def test_seed_all_four_held_reports_all_four() -> None:
    state = cams(
        {f"{CAM_A}-0": cl(0), f"{CAM_A}-1": cl(1)}, {f"{CAM_B}-0": cl(2), f"{CAM_B}-1": cl(3)}
    )
    assert ids(config_devices(CFG, state, NODE)) == [v(0), v(1), v(2), v(3)]


def test_seed_after_reclaim_only_3_in_use_reports_0_1_3() -> None:
    assert ids(config_devices(CFG, ONLY_3, NODE)) == [v(0), v(1), v(3)]


def test_view_free_ids_skip_ids_this_node_holds() -> None:
    state = cams({f"{CAM_A}-0": cl(0)})
    assert ids(config_devices(CFG, state, NODE)) == [v(0), v(1), v(2)]


def test_view_ignores_other_nodes_claims_except_as_used_slots() -> None:
    state = cams({f"{CAM_A}-0": cl(0, "node-b"), f"{CAM_A}-1": "node-c"}, {})
    # cam A is full (other nodes), cam B has room: one free vdev, id 0 is ours to use
    assert ids(config_devices(CFG, state, NODE)) == [v(0)]


def test_view_instance_level_claims_consume_room() -> None:
    state = cams({f"{CAM_A}-0": NODE, f"{CAM_A}-1": NODE}, {f"{CAM_B}-0": "node-b"})
    assert ids(config_devices(CFG, state, NODE)) == [v(0)]


def test_view_with_no_instances_is_empty() -> None:
    assert config_devices(CFG, {}, NODE) == []


def test_view_is_stable_when_an_instance_fills_up() -> None:
    before = ids(config_devices(CFG, cams(), NODE))
    after = ids(config_devices(CFG, cams({f"{CAM_A}-0": "x", f"{CAM_A}-1": "y"}), NODE))
    # only the highest free id goes away
    assert after == before[:-1]


def test_view_keeps_an_allocated_vdev_id() -> None:
    plan = allocate(cams(), [[v(1)]], NODE, CFG)
    state = {n: InstanceSlots(2, plan.usage.get(n, i.usage)) for n, i in cams().items()}
    assert v(1) in ids(config_devices(CFG, state, NODE))


# --- seed 000: allocate --------------------------------------------------------------------------


def test_seed_0_and_3_maps_0_to_roomiest_camera_and_3_to_its_slot() -> None:
    plan = allocate(ONLY_3, [[v(0), v(3)]], NODE, CFG)
    assert placements(plan) == [[(v(0), CAM_A, f"{CAM_A}-0"), (v(3), CAM_B, f"{CAM_B}-1")]]
    assert plan.containers[0][1].reused and not plan.containers[0][0].reused
    assert plan.usage == {CAM_A: {f"{CAM_A}-0": cl(0)}}


def test_seed_0_1_3_in_one_container_is_denied() -> None:
    with pytest.raises(NotEnoughInstances, match="container request 0: asks for 3"):
        allocate(ONLY_3, [[v(0), v(1), v(3)]], NODE, CFG)


def test_seed_0_1_then_3_in_another_container() -> None:
    plan = allocate(ONLY_3, [[v(0), v(1)], [v(3)]], NODE, CFG)
    assert placements(plan) == [
        [(v(0), CAM_A, f"{CAM_A}-0"), (v(1), CAM_B, f"{CAM_B}-0")],
        [(v(3), CAM_B, f"{CAM_B}-1")],
    ]
    assert plan.usage == {
        CAM_A: {f"{CAM_A}-0": cl(0)},
        CAM_B: {f"{CAM_B}-0": cl(1), f"{CAM_B}-1": cl(3)},
    }


def test_seed_all_held_0_and_1_on_same_camera_is_denied() -> None:
    state = cams(
        {f"{CAM_A}-0": cl(0), f"{CAM_A}-1": cl(1)}, {f"{CAM_B}-0": cl(2), f"{CAM_B}-1": cl(3)}
    )
    with pytest.raises(NotEnoughInstances, match="distinct instances"):
        allocate(state, [[v(0), v(1)]], NODE, CFG)


def test_seed_after_reclaim_0_and_1_succeed() -> None:
    plan = allocate(ONLY_3, [[v(0), v(1)]], NODE, CFG)
    assert placements(plan) == [[(v(0), CAM_A, f"{CAM_A}-0"), (v(1), CAM_B, f"{CAM_B}-0")]]


# --- allocate: more rules ------------------------------------------------------------------------


def test_held_vdev_is_placed_before_fresh_ones() -> None:
    # fresh 0 would pick B (more room) if handled first, leaving nothing distinct for held 5 on B
    state = {
        CAM_A: InstanceSlots(1, {}),
        CAM_B: InstanceSlots(3, {f"{CAM_B}-2": cl(5)}),
    }
    plan = allocate(state, [[v(0), v(5)]], NODE, CFG)
    assert placements(plan) == [[(v(0), CAM_A, f"{CAM_A}-0"), (v(5), CAM_B, f"{CAM_B}-2")]]


def test_ties_in_room_go_to_the_lowest_instance_name() -> None:
    plan = allocate(cams(), [[v(7)]], NODE, CFG)
    assert placements(plan) == [[(v(7), CAM_A, f"{CAM_A}-0")]]


def test_different_containers_may_share_an_instance() -> None:
    state = {CAM_A: InstanceSlots(2, {})}
    plan = allocate(state, [[v(0)], [v(1)]], NODE, CFG)
    assert plan.usage == {CAM_A: {f"{CAM_A}-0": cl(0), f"{CAM_A}-1": cl(1)}}


def test_containers_see_the_slots_earlier_containers_took() -> None:
    state = {CAM_A: InstanceSlots(1, {})}
    with pytest.raises(NotEnoughInstances, match="container request 1"):
        allocate(state, [[v(0)], [v(1)]], NODE, CFG)


def test_other_nodes_and_instance_level_claims_are_never_taken() -> None:
    state = cams({f"{CAM_A}-0": "node-b", f"{CAM_A}-1": cl(0, "node-b")}, {f"{CAM_B}-0": NODE})
    plan = allocate(state, [[v(0)]], NODE, CFG)
    # v(0) held by node-b is a different device: ours is fresh and goes to B's free slot
    assert placements(plan) == [[(v(0), CAM_B, f"{CAM_B}-1")]]
    with pytest.raises(NotEnoughInstances):
        allocate(state, [[v(0), v(1)]], NODE, CFG)


def test_reallocating_a_held_vdev_changes_nothing() -> None:
    plan = allocate(ONLY_3, [[v(3)]], NODE, CFG)
    assert plan.usage == {}
    assert plan.containers == ((Placement(v(3), CAM_B, f"{CAM_B}-1", reused=True),),)


def test_denied_allocation_does_not_mutate_inputs() -> None:
    state = cams({}, {f"{CAM_B}-1": cl(3)})
    snapshot = {n: dict(i.usage) for n, i in state.items()}
    with pytest.raises(NotEnoughInstances):
        allocate(state, [[v(0), v(1), v(3)]], NODE, CFG)
    allocate(state, [[v(0), v(1)]], NODE, CFG)
    assert {n: dict(i.usage) for n, i in state.items()} == snapshot


def test_held_vdev_on_orphan_slot_is_moved_to_a_real_slot() -> None:
    # capacity cut 3 -> 2 while v(4) held slot 2 of A
    state = {CAM_A: InstanceSlots(2, {f"{CAM_A}-2": cl(4)})}
    plan = allocate(state, [[v(4)]], NODE, CFG)
    assert placements(plan) == [[(v(4), CAM_A, f"{CAM_A}-0")]]
    assert plan.usage == {CAM_A: {f"{CAM_A}-0": cl(4)}}


def test_vdev_held_twice_keeps_one_slot_and_releases_the_other() -> None:
    state = cams({f"{CAM_A}-1": cl(2)}, {f"{CAM_B}-0": cl(2)})
    plan = allocate(state, [[v(2)]], NODE, CFG)
    assert placements(plan) == [[(v(2), CAM_A, f"{CAM_A}-1")]]
    assert plan.usage == {CAM_B: {}}


@pytest.mark.parametrize(
    "bad", ["akri-onvif", "other-0", "akri-onvif-x", "akri-onvif-01", "akri.sh/akri-onvif-0"]
)
def test_allocate_rejects_ids_that_are_not_vdevs_of_this_config(bad: str) -> None:
    with pytest.raises(BadVdev) as exc:
        allocate(cams(), [[bad]], NODE, CFG)
    assert exc.value.vdev == bad


def test_allocate_rejects_a_vdev_requested_twice_even_across_containers() -> None:
    with pytest.raises(BadVdev, match="twice"):
        allocate(cams(), [[v(0)], [v(0)]], NODE, CFG)
    with pytest.raises(BadVdev, match="twice"):
        allocate(cams(), [[v(0), v(0)]], NODE, CFG)


def test_error_hierarchy() -> None:
    assert issubclass(BadVdev, VdevError) and issubclass(BadVdev, ValueError)
    assert issubclass(NotEnoughInstances, VdevError)
    assert not issubclass(NotEnoughInstances, ValueError)


def test_allocate_respects_capacity_cut_budget() -> None:
    # capacity 2, orphan slot 2 held by node-b: only one of slots 0/1 may be taken
    state = {CAM_A: InstanceSlots(2, {f"{CAM_A}-2": "node-b"})}
    allocate(state, [[v(0)]], NODE, CFG)
    with pytest.raises(NotEnoughInstances):
        allocate(state, [[v(0)], [v(1)]], NODE, CFG)


# --- free ----------------------------------------------------------------------------------------


def test_free_vdevs_releases_only_this_nodes_claims_for_those_vdevs() -> None:
    state = cams(
        {f"{CAM_A}-0": cl(0), f"{CAM_A}-1": cl(0, "node-b")},
        {f"{CAM_B}-0": cl(1), f"{CAM_B}-1": NODE},
    )
    assert free_vdevs(state, [v(0)], NODE) == {CAM_A: {f"{CAM_A}-1": cl(0, "node-b")}}
    assert free_vdevs(state, [v(0), v(1)], NODE) == {
        CAM_A: {f"{CAM_A}-1": cl(0, "node-b")},
        CAM_B: {f"{CAM_B}-1": NODE},
    }


def test_free_vdevs_of_unheld_vdev_is_noop() -> None:
    assert free_vdevs(ONLY_3, [v(0), "junk"], NODE) == {}
    assert free_vdevs(ONLY_3, [v(3)], "node-b") == {}


def test_free_vdevs_releases_orphans_too() -> None:
    state = {CAM_A: InstanceSlots(1, {f"{CAM_A}-1": cl(0)})}
    assert free_vdevs(state, [v(0)], NODE) == {CAM_A: {}}


def test_vdev_holdings() -> None:
    state = cams({f"{CAM_A}-1": cl(2), f"{CAM_A}-0": cl(9, "node-b")}, {f"{CAM_B}-0": cl(2)})
    assert vdev_holdings(state, NODE) == {v(2): [(CAM_A, f"{CAM_A}-1"), (CAM_B, f"{CAM_B}-0")]}


# --- GetPreferredAllocation ----------------------------------------------------------------------

ALL_HELD = cams(
    {f"{CAM_A}-0": cl(0), f"{CAM_A}-1": cl(1)}, {f"{CAM_B}-0": cl(2), f"{CAM_B}-1": cl(3)}
)


def test_preferred_picks_distinct_instances_among_held() -> None:
    got = preferred_allocation(CFG, ALL_HELD, NODE, [v(1), v(0), v(3), v(2)], [], 2)
    assert len(got) == 2
    allocate(ALL_HELD, [got], NODE, CFG)  # does not raise


def test_preferred_is_independent_of_available_order() -> None:
    avail = [v(0), v(1), v(2), v(3)]
    answers = set()
    rng = random.Random(4)
    for _ in range(20):
        rng.shuffle(avail)
        answers.add(tuple(preferred_allocation(CFG, ALL_HELD, NODE, avail, [], 2)))
    assert len(answers) == 1


def test_preferred_honours_must_include() -> None:
    got = preferred_allocation(CFG, ALL_HELD, NODE, [v(0), v(1), v(2), v(3)], [v(1)], 2)
    assert got[0] == v(1)
    assert got[1] in (v(2), v(3))


def test_preferred_best_effort_when_impossible() -> None:
    got = preferred_allocation(CFG, ALL_HELD, NODE, [v(0), v(1), v(2), v(3)], [], 3)
    assert len(got) == 2
    allocate(ALL_HELD, [got], NODE, CFG)


def test_preferred_keeps_infeasible_must_include() -> None:
    got = preferred_allocation(CFG, ALL_HELD, NODE, [v(0), v(1), v(2)], [v(0), v(1)], 3)
    assert got == [v(0), v(1)]


def test_preferred_mixes_held_and_fresh_and_prefers_held() -> None:
    got = preferred_allocation(CFG, ONLY_3, NODE, [v(0), v(1), v(3)], [], 2)
    assert v(3) in got
    allocate(ONLY_3, [got], NODE, CFG)


def test_preferred_does_not_let_a_held_vdev_take_the_instance_fresh_must_include_needs() -> None:
    # A full (not ours), B has room and holds our v(3); must_include fresh v(0) needs B
    state = cams({f"{CAM_A}-0": "x", f"{CAM_A}-1": "y"}, {f"{CAM_B}-1": cl(3)})
    assert preferred_allocation(CFG, state, NODE, [v(0), v(3)], [v(0)], 2) == [v(0)]


# --- properties ----------------------------------------------------------------------------------

NODES = ["node-a", "node-b"]
NAMES = [CAM_A, CAM_B, "akri-onvif-c0ffee", "akri-onvif-d00d00"]

holder = st.one_of(
    st.just(""),
    st.sampled_from(NODES),
    st.builds(lambda n, node: f"C:{v(n)}:{node}", st.integers(0, 6), st.sampled_from(NODES)),
)


@st.composite
def instance_states(draw: st.DrawFn) -> dict[str, InstanceSlots]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
    out: dict[str, InstanceSlots] = {}
    for name in names:
        capacity = draw(st.integers(0, 3))
        # indices up to capacity + 1: orphans from a capacity cut happen
        usage = draw(st.dictionaries(st.integers(0, capacity + 1), holder, max_size=4))
        out[name] = InstanceSlots(capacity, {f"{name}-{i}": h for i, h in usage.items()})
    return out


def check_plan(
    state: dict[str, InstanceSlots], requests: list[list[str]], plan: AllocationPlan
) -> None:
    held_before = vdev_holdings(state, NODE)
    wanted = {x for r in requests for x in r}
    for request, placed in zip(requests, plan.containers, strict=True):
        assert [p.vdev for p in placed] == request
        # (e) distinct instances within one container request
        assert len({p.instance for p in placed}) == len(placed)
        for p in placed:
            final = plan.usage.get(p.instance, state[p.instance].usage)
            assert final[p.slot] == f"C:{p.vdev}:{NODE}"
            assert p.reused == ((p.instance, p.slot) in held_before.get(p.vdev, []))
    for name, new in plan.usage.items():
        old = state[name].usage
        for key in set(old) | set(new):
            before, after = old.get(key, ""), new.get(key, "")
            if before == after:
                continue
            # (e) never claims a slot held by someone else: a changed slot was free or held by
            # this node for a vdev of this very request (the kubelet is allocating that vdev, so
            # nothing runs on it: a stale duplicate/orphan holding), and becomes ours or free
            if before:
                claim_ = parse_usage(before)
                assert isinstance(claim_, ConfigClaim) and claim_.node == NODE
                assert claim_.vdev in wanted
            if after:
                claim_ = parse_usage(after)
                assert isinstance(claim_, ConfigClaim) and claim_.node == NODE
                assert claim_.vdev in wanted
        # never over capacity through new claims
        added = [k for k in new if new[k] and not old.get(k)]
        if added:
            assert len(held_slots(name, new)) <= state[name].capacity


def apply(
    state: dict[str, InstanceSlots], new_usage: dict[str, dict[str, str]]
) -> dict[str, InstanceSlots]:
    return {n: InstanceSlots(i.capacity, new_usage.get(n, i.usage)) for n, i in state.items()}


@settings(max_examples=1000)
@given(
    state=instance_states(),
    requests=st.lists(st.lists(st.integers(0, 8), unique=True, max_size=3), min_size=1, max_size=3),
)
def test_allocate_plans_are_sound_and_idempotent(
    state: dict[str, InstanceSlots], requests: list[list[int]]
) -> None:
    seen: set[int] = set()
    reqs = [[v(n) for n in r if not (n in seen or seen.add(n))] for r in requests]  # type: ignore[func-returns-value]
    try:
        plan = allocate(state, reqs, NODE, CFG)
    except NotEnoughInstances:
        return
    check_plan(state, reqs, plan)
    # re-running after the writes held (the retry after a lost response) changes nothing more
    after = apply(state, {k: dict(u) for k, u in plan.usage.items()})
    again = allocate(after, reqs, NODE, CFG)
    assert again.usage == {}
    assert placements(again) == placements(plan)
    # after a partial write (one Instance written, a 409 on the rest) a retry still succeeds
    for written in plan.usage:
        partial = apply(state, {written: dict(plan.usage[written])})
        retry = allocate(partial, reqs, NODE, CFG)
        check_plan(partial, reqs, retry)


@settings(max_examples=800)
@given(state=instance_states())
def test_view_offers_one_free_vdev_per_instance_with_room(state: dict[str, InstanceSlots]) -> None:
    view = config_devices(CFG, state, NODE)
    held = vdev_holdings(state, NODE)
    free_ids = [d.id for d in view if d.id not in held]
    with_room = [n for n, i in state.items() if claimable_slots(n, i.capacity, i.usage)]
    with_free_slot = [
        n for n, i in state.items() if any(not i.usage.get(f"{n}-{k}") for k in range(i.capacity))
    ]
    # (d) never more free vdevs than instances with a free slot
    assert len(free_ids) == len(with_room) <= len(with_free_slot)
    assert set(held) <= {d.id for d in view}
    assert len({d.id for d in view}) == len(view)
    assert view == config_devices(CFG, dict(reversed(list(state.items()))), NODE)
    # the kubelet may give any single free vdev to a container: that always succeeds
    for vdev in free_ids:
        allocate(state, [[vdev]], NODE, CFG)
    # and all free vdevs in one container too: they are exactly as many as instances with room
    if free_ids:
        check_plan(state, [free_ids], allocate(state, [free_ids], NODE, CFG))


@settings(max_examples=800)
@given(
    state=instance_states(),
    size=st.integers(1, 4),
    must_n=st.integers(0, 2),
    seed=st.integers(0, 1000),
)
def test_preferred_allocation_is_allocatable_and_optimal(
    state: dict[str, InstanceSlots], size: int, must_n: int, seed: int
) -> None:
    available = [d.id for d in config_devices(CFG, state, NODE)]
    assume(len(available) >= size)
    rng = random.Random(seed)
    must = rng.sample(available, min(must_n, size))
    shuffled = rng.sample(available, len(available))
    got = preferred_allocation(CFG, state, NODE, shuffled, must, size)
    assert got == preferred_allocation(CFG, state, NODE, available, must, size)
    assert got[: len(must)] == must
    assert len(got) == len(set(got)) <= size
    assert set(got) <= set(available)

    def feasible(chosen: list[str]) -> bool:
        try:
            allocate(state, [chosen], NODE, CFG)
        except NotEnoughInstances:
            return False
        return True

    # whatever the state: when must_include can be placed, so can the answer
    assert feasible(got) or not feasible(must)
    # optimal (full size whenever some full-size answer exists) for states allocate produces;
    # a vdev held on two slots (hand-edited deviceUsage), or slots held beyond an Instance's
    # capacity (its Configuration's capacity lowered under running claims), get a best effort
    duplicated = any(len(p) > 1 for p in vdev_holdings(state, NODE).values())
    others = [x for x in available if x not in must]
    exists = any(
        feasible(must + list(extra)) for extra in itertools.combinations(others, size - len(must))
    )
    if exists and not duplicated and not _over_capacity(state):
        assert len(got) == size


def _over_capacity(state: dict[str, InstanceSlots]) -> bool:
    """Some Instance has a slot held at an index its capacity does not reach."""
    for name, inst in state.items():
        for key, value in inst.usage.items():
            index = slot_index(name, key)
            if value and (index is None or index >= inst.capacity):
                return True
    return False


@settings(max_examples=800)
@given(
    capacities=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["cl", "il", "free", "freeil"]),
            st.sampled_from(NODES),
            st.lists(st.integers(0, 5), min_size=1, max_size=2),
        ),
        max_size=30,
    ),
)
def test_random_multi_node_histories(
    capacities: list[int], ops: list[tuple[str, str, list[int]]]
) -> None:
    """Several nodes, both plugin kinds, one set of shared Instances."""
    state = {NAMES[i]: InstanceSlots(c, {}) for i, c in enumerate(capacities)}
    for kind, node, ns in ops:
        before = {n: dict(i.usage) for n, i in state.items()}
        if kind == "cl":
            try:
                plan = allocate(state, [[v(n) for n in dict.fromkeys(ns)]], node, CFG)
            except VdevError:
                continue
            state = apply(state, {k: dict(u) for k, u in plan.usage.items()})
        elif kind == "free":
            state = apply(state, free_vdevs(state, [v(n) for n in ns], node))
        else:
            name = NAMES[ns[0] % len(capacities)]
            inst = state[name]
            slots = [f"{name}-{ns[-1]}"]
            if kind == "il":
                try:
                    new = claim(inst.usage, slots, node, instance=name, capacity=inst.capacity)
                except SlotError:
                    continue
            else:
                new = {k: x for k, x in inst.usage.items() if not (k in slots and x == node)}
            state = apply(state, {name: new})
        for name, inst in state.items():
            # (a) a slot never passes directly from one holder to another
            for key in set(before[name]) | set(inst.usage):
                old, new_ = before[name].get(key, ""), inst.usage.get(key, "")
                assert old == new_ or not old or not new_
            # (b) capacity holds (capacity is fixed in this history)
            assert len(held_slots(name, inst.usage)) <= inst.capacity
        for viewer in NODES:
            view = config_devices(CFG, state, viewer)
            held = vdev_holdings(state, viewer)
            # (d) free vdevs never exceed instances with a free slot
            assert len([d for d in view if d.id not in held]) <= sum(
                1 for n, i in state.items() if len(held_slots(n, i.usage)) < i.capacity
            )
