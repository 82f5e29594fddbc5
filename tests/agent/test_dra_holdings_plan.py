"""After a switch back from DRA mode, the claims still prepared on a node are recorded in
deviceUsage as that node's `D:<claim>:<node>` slots: which Instances they hold, and the records
kept exactly as many as the claims hold, within capacity, touching nobody else's entries."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.address import ObjectKey
from akri_trio.agent.dra.holdings_plan import record, unrecorded, wanted
from akri_trio.agent.plugins.slots import (
    SlotTaken,
    claim,
    held_slots,
    instance_devices,
    unclaimable,
)
from akri_trio.agent.reclaimer import held_devices
from akri_trio.agent.view import NodeView
from akri_trio.dra import node_pool, shared_pool
from akri_trio.dra.checkpoint import PreparedClaim, PreparedDevice
from akri_trio.model.naming import DraClaim, format_usage, parse_usage
from akri_trio.model.resources import Instance
from tests.dra.support import instance

NAME = "cam-abc123"


def with_usage(inst: Instance, usage: dict[str, str]) -> Instance:
    return attrs.evolve(inst, spec=attrs.evolve(inst.spec, device_usage=usage))


def prepared(*devices: tuple[str, str, bool]) -> PreparedClaim:
    return PreparedClaim(
        "ns",
        "claim",
        tuple(
            PreparedDevice(("r",), pool, device, (f"cdi-{i}",), "s1" if consumable else None)
            for i, (pool, device, consumable) in enumerate(devices)
        ),
        "spec.json",
    )


def test_a_dra_claim_value_round_trips() -> None:
    assert parse_usage("D:uid-1:node-a") == DraClaim("uid-1", "node-a")
    assert format_usage(DraClaim("uid-1", "node-a")) == "D:uid-1:node-a"
    assert parse_usage("DX:uid-1:node-a") == DraClaim("uid-1", "node-a", counted=True)
    assert format_usage(DraClaim("uid-1", "node-a", counted=True)) == "DX:uid-1:node-a"


def test_a_counted_slot_is_healthy_to_its_node_but_never_claimed_nor_preferred() -> None:
    usage = record({}, NAME, 2, "n1", {"u1": 1}, counted={"u1"})
    assert usage == {f"{NAME}-0": "DX:u1:n1"}
    assert [d.healthy for d in instance_devices(NAME, 2, usage, "n1")] == [True, True]
    assert [d.healthy for d in instance_devices(NAME, 2, usage, "n2")] == [False, True]
    assert unclaimable(NAME, usage, [f"{NAME}-0", f"{NAME}-1"]) == [f"{NAME}-0"]
    with pytest.raises(SlotTaken):
        claim(usage, [f"{NAME}-0"], "n1", instance=NAME, capacity=2)
    # A claim found counted later (or no longer) has its records rewritten, not added to.
    assert record(usage, NAME, 2, "n1", {"u1": 1}) == {f"{NAME}-0": "D:u1:n1"}


def test_wanted_maps_slot_and_consumable_devices_to_their_instances_and_slots() -> None:
    local = instance(NAME, nodes=("n1",))
    shared = instance("cam-def456", nodes=("n1", "n2"), shared=True)
    claims = {
        "u1": prepared((node_pool("n1", "ns"), f"{NAME}-1", False)),
        "u2": prepared((shared_pool("ns", "cam-def456"), "cam-def456", True)),
        "u3": prepared((node_pool("n1", "ns"), "cam-gone00-0", False)),  # its Instance is gone
    }
    assert wanted(claims, [local, shared], "n1") == {
        ObjectKey("ns", NAME): {"u1": 1},
        ObjectKey("ns", "cam-def456"): {"u2": 1},
    }
    (device,) = claims["u2"].devices
    claims["u2"] = attrs.evolve(claims["u2"], devices=(attrs.evolve(device, slots=2),))
    assert wanted(claims, [shared], "n1") == {ObjectKey("ns", "cam-def456"): {"u2": 2}}


def test_wanted_lists_an_instance_that_records_a_claim_no_longer_prepared() -> None:
    inst = with_usage(instance(NAME), {f"{NAME}-0": "D:old:n1", f"{NAME}-1": "D:x:n2"})
    assert wanted({}, [inst], "n1") == {ObjectKey("ns", NAME): {}}
    assert wanted({}, [inst], "n3") == {}


def test_a_recorded_slot_is_unhealthy_to_this_nodes_plugin_and_not_reclaimed() -> None:
    usage = record({}, NAME, 2, "n1", {"u1": 1})
    assert usage == {f"{NAME}-0": "D:u1:n1"}
    devices = instance_devices(NAME, 2, usage, "n1")
    assert [d.healthy for d in devices] == [False, True]
    view = NodeView("n1")
    view.put_instance(
        {
            "metadata": {"name": NAME, "namespace": "ns", "resourceVersion": "1"},
            "spec": {
                "configurationName": "cam",
                "cdiName": "akri.sh/cam=abc123",
                "capacity": 2,
                "nodes": ["n1"],
                "deviceUsage": usage,
            },
        }
    )
    assert held_devices(view) == {}


def test_recording_stops_at_capacity_and_says_how_many_are_missing() -> None:
    usage = {f"{NAME}-0": "n2"}
    new = record(usage, NAME, 2, "n1", {"u1": 2})
    assert new == {f"{NAME}-0": "n2", f"{NAME}-1": "D:u1:n1"}
    assert unrecorded(new, NAME, "n1", {"u1": 2}) == 1


usages = st.dictionaries(
    st.integers(0, 5).map(lambda i: f"{NAME}-{i}"),
    st.sampled_from(
        ["n1", "n2", "C:cam-0:n1", "D:u1:n1", "DX:u2:n1", "D:u2:n1", "D:u1:n2", "other"]
    ),
    max_size=6,
)
wants = st.dictionaries(st.sampled_from(["u1", "u2", "u3"]), st.integers(0, 3), max_size=3)
counteds = st.sets(st.sampled_from(["u1", "u2", "u3"]))


@given(usage=usages, want=wants, capacity=st.integers(0, 6), counted=counteds)
def test_record_keeps_others_and_capacity_and_converges(
    usage: dict[str, str], want: dict[str, int], capacity: int, counted: set[str]
) -> None:
    new = record(usage, NAME, capacity, "n1", want, counted)
    ours = {k for k, v in new.items() if isinstance(parse_usage(v), DraClaim) and v.endswith(":n1")}
    # Nobody else's entry changes.
    assert {k: v for k, v in new.items() if k not in ours} == {
        k: v for k, v in usage.items() if not (v.startswith(("D:", "DX:")) and v.endswith(":n1"))
    }
    # Each claim records at most what it holds, and all of it when there is room.
    for uid, n in want.items():
        prefix = "DX" if uid in counted else "D"
        assert sum(1 for k in ours if new[k] == f"{prefix}:{uid}:n1") <= n
    assert all(new[k].split(":")[1] in want for k in ours)
    before = len(held_slots(NAME, usage))
    assert len(held_slots(NAME, new)) <= max(capacity, before)
    if len(held_slots(NAME, new)) < capacity:
        assert unrecorded(new, NAME, "n1", want) == 0
    # Recording again changes nothing.
    assert record(new, NAME, capacity, "n1", want, counted) == new


@given(usage=usages, want=wants, counted=counteds)
def test_no_device_plugin_claim_takes_a_recorded_slot(
    usage: dict[str, str], want: dict[str, int], counted: set[str]
) -> None:
    new = record(usage, NAME, 6, "n1", want, counted)
    for slot, value in new.items():
        if value.startswith("D:"):
            for node in ("n1", "n2"):
                try:
                    claim(new, [slot], node, instance=NAME, capacity=6)
                except Exception:
                    continue
                raise AssertionError(f"{node} claimed {slot}, recorded as {value}")
