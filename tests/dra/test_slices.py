"""Pool planning: every device once at the newest generation, at most 128 per slice, nothing
written when nothing changed, the generation bumped on every change."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.dra import (
    MAX_DEVICES_PER_SLICE,
    PoolPlan,
    generation_of,
    node_placement,
    plan_pool,
    pool_devices,
    shared_placement,
)
from akri_trio.dra.names import node_pool
from akri_trio.dra.offline import tainted
from tests.dra.support import instance

JSON = dict[str, Any]
POOL = node_pool("n1", "ns")


def _devices(names: list[str]) -> list[JSON]:
    return [{"name": n, "attributes": {"akri.sh/instance": {"string": n}}} for n in names]


def _apply(held: dict[str, JSON], plan: PoolPlan) -> dict[str, JSON]:
    """What the API holds after the writer carried out `plan` (as the API returns objects:
    with metadata of its own)."""
    out = dict(held)
    for body in plan.apply:
        stored = copy.deepcopy(body)
        stored["metadata"]["uid"] = "u-" + body["metadata"]["name"]
        stored["metadata"]["resourceVersion"] = "1"
        out[body["metadata"]["name"]] = stored
    for name in plan.delete:
        out.pop(name, None)
    return out


def test_first_publish_is_generation_1_in_one_slice() -> None:
    plan = plan_pool(POOL, _devices(["b", "a"]), node_placement("n1"), [])
    assert plan.generation == 1 and plan.delete == ()
    (body,) = plan.apply
    assert body["spec"]["nodeName"] == "n1"
    assert body["spec"]["pool"] == {"name": POOL, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in body["spec"]["devices"]] == ["a", "b"]
    assert body["spec"]["driver"] == "akri.sh"


def test_an_unchanged_pool_is_not_written_again() -> None:
    held = _apply({}, plan_pool(POOL, _devices(["a"]), node_placement("n1"), []))
    again = plan_pool(POOL, _devices(["a"]), node_placement("n1"), list(held.values()))
    assert again.unchanged and again.generation == 1


def test_empty_fields_the_api_server_omits_are_no_change() -> None:
    devices = [{"name": "a", "attributes": {}}]
    (body,) = plan_pool(POOL, devices, node_placement("n1"), []).apply
    stored = copy.deepcopy(body)
    del stored["spec"]["devices"][0]["attributes"]
    del stored["metadata"]["labels"]
    assert plan_pool(POOL, devices, node_placement("n1"), [stored]).unchanged


def test_a_change_bumps_the_generation_of_every_slice() -> None:
    held = _apply({}, plan_pool(POOL, _devices(["a"]), node_placement("n1"), []))
    plan = plan_pool(POOL, _devices(["a", "b"]), node_placement("n1"), list(held.values()))
    assert plan.generation == 2
    assert all(generation_of(s) == 2 for s in plan.apply)


def test_an_empty_pool_deletes_every_slice() -> None:
    held = _apply({}, plan_pool(POOL, _devices(["a"]), node_placement("n1"), []))
    plan = plan_pool(POOL, [], node_placement("n1"), list(held.values()))
    assert plan.apply == () and plan.delete == tuple(held)


def test_a_pool_published_again_never_repeats_a_generation() -> None:
    held = _apply({}, plan_pool(POOL, _devices(["a"]), node_placement("n1"), []))
    held = _apply(held, plan_pool(POOL, [], node_placement("n1"), list(held.values())))
    assert held == {}
    plan = plan_pool(POOL, _devices(["a"]), node_placement("n1"), [], written=1)
    assert plan.generation == 2


def test_more_than_128_devices_split_into_slices_counted_in_each() -> None:
    names = [f"d{i:03d}" for i in range(300)]
    plan = plan_pool(POOL, _devices(names), node_placement("n1"), [])
    assert [len(s["spec"]["devices"]) for s in plan.apply] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in plan.apply} == {3}
    assert len({s["metadata"]["name"] for s in plan.apply}) == 3


def test_a_pool_with_a_tainted_device_holds_at_most_64_per_slice() -> None:
    """The API refuses a slice of more than 64 devices when any of them has a taint."""
    devices = [*_devices([f"d{i:03d}" for i in range(99)]), tainted(_devices(["x"])[0])]
    plan = plan_pool(POOL, devices, node_placement("n1"), [])
    assert [len(s["spec"]["devices"]) for s in plan.apply] == [64, 36]


def test_the_time_the_api_server_adds_to_a_taint_is_no_change() -> None:
    devices = [tainted(_devices(["a"])[0])]
    (body,) = plan_pool(POOL, devices, node_placement("n1"), []).apply
    stored = copy.deepcopy(body)
    stored["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-11-26T06:04:00Z"
    assert plan_pool(POOL, devices, node_placement("n1"), [stored]).unchanged
    assert not plan_pool(POOL, _devices(["a"]), node_placement("n1"), [stored]).unchanged


def test_shared_placement_is_one_term_of_exactly_the_nodes() -> None:
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]}
    assert shared_placement(["n2", "n1", "n2"]) == {
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
    }


def test_a_node_joining_a_shared_pool_changes_its_slice() -> None:
    devices = _devices(["cam"])
    held = _apply({}, plan_pool("shared/ns/cam", devices, shared_placement(["n1"]), []))
    plan = plan_pool("shared/ns/cam", devices, shared_placement(["n1", "n2"]), list(held.values()))
    assert plan.generation == 2 and len(plan.apply) == 1


def test_pool_devices_maps_every_device_back_to_its_instance() -> None:
    insts = [instance("cam-aaaaaa", capacity=2), instance("cam-bbbbbb", capacity=1)]
    pool = pool_devices(insts, consumable=False)
    assert [d["name"] for d in pool.devices] == ["cam-aaaaaa-0", "cam-aaaaaa-1", "cam-bbbbbb-0"]
    assert pool.refs["cam-aaaaaa-1"].instance == "cam-aaaaaa"
    assert pool.refs["cam-aaaaaa-1"].slot == 1


def test_pool_devices_reports_omitted_properties_per_instance() -> None:
    inst = instance(properties={"URL": "x" * 65, "OK": "y"})
    pool = pool_devices([inst], consumable=True)
    assert [o.name for o in pool.omitted["cam-abc123"]] == ["URL"]


HISTORY = st.lists(
    st.lists(st.integers(0, 400), max_size=300, unique=True).map(
        lambda xs: [f"d{x:03d}" for x in xs]
    ),
    min_size=1,
    max_size=6,
)


@given(HISTORY, st.sampled_from(["n1", "n2"]))
def test_any_history_converges_to_exactly_the_wanted_pool(
    history: list[list[str]], node: str
) -> None:
    held: dict[str, JSON] = {}
    last_generation = 0
    for names in history:
        existing = list(held.values())
        plan = plan_pool(
            POOL, _devices(names), node_placement(node), existing, written=last_generation
        )
        held = _apply(held, plan)
        if plan.apply:
            assert plan.generation == last_generation + 1
            last_generation = plan.generation
        slices = list(held.values())
        assert all(len(s["spec"]["devices"]) <= MAX_DEVICES_PER_SLICE for s in slices)
        assert all(generation_of(s) == last_generation for s in slices)
        assert all(s["spec"]["pool"]["resourceSliceCount"] == len(slices) for s in slices)
        published = [d["name"] for s in slices for d in s["spec"]["devices"]]
        assert sorted(published) == sorted(names)
        again = plan_pool(POOL, _devices(names), node_placement(node), slices)
        assert again.unchanged
