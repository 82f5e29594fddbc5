"""An Instance as one consumable-capacity device or as `capacity` slot devices; the probe that
tells which one a cluster takes, and whether it keeps device taints."""

from __future__ import annotations

import copy

import attrs
import pytest

from akri_trio.dra import (
    DeviceRef,
    instance_devices,
    keeps_device_taints,
    probe_slice,
    takes_consumable_capacity,
)
from akri_trio.dra.attributes import qualified
from akri_trio.dra.devices import SLOTS, held_slots
from tests.dra.support import instance


def test_consumable_capacity_gives_one_device_counting_slots() -> None:
    built = instance_devices(instance(capacity=2), consumable=True)
    (device,) = built.devices
    assert device["name"] == "cam-abc123"
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["akri.sh/slots"]["value"] == "2"
    assert device["capacity"]["akri.sh/slots"]["requestPolicy"]["default"] == "1"
    assert built.refs == (DeviceRef("ns", "cam-abc123"),)


def test_without_consumable_capacity_one_device_per_slot() -> None:
    built = instance_devices(instance(capacity=3), consumable=False)
    assert [d["name"] for d in built.devices] == ["cam-abc123-0", "cam-abc123-1", "cam-abc123-2"]
    assert all("allowMultipleAllocations" not in d and "capacity" not in d for d in built.devices)
    assert built.refs == tuple(DeviceRef("ns", "cam-abc123", i) for i in range(3))
    instances = {d["attributes"]["akri.sh/instance"]["string"] for d in built.devices}
    assert instances == {"cam-abc123"}


def test_capacity_zero_publishes_nothing() -> None:
    assert instance_devices(instance(capacity=0), consumable=True).devices == ()
    assert instance_devices(instance(capacity=0), consumable=False).devices == ()


def test_the_probe_answer_decides() -> None:
    kept = copy.deepcopy(probe_slice())
    assert takes_consumable_capacity(kept)
    dropped = copy.deepcopy(kept)
    del dropped["spec"]["devices"][0]["allowMultipleAllocations"]
    del dropped["spec"]["devices"][0]["capacity"]["akri.sh/slots"]["requestPolicy"]
    assert not takes_consumable_capacity(dropped)
    assert not takes_consumable_capacity({})


@pytest.mark.parametrize("consumable", [True, False], ids=["consumable", "slots"])
def test_slots_device_plugin_mode_holds_are_not_offered(consumable: bool) -> None:
    """After a switch from device-plugin mode its running Pods keep their deviceUsage slots:
    DRA offers only the rest, so no slot is held twice."""
    usage = {"cam-abc123-0": "", "cam-abc123-1": "n1", "cam-abc123-9": "n1", "other-0": "n1"}
    base = instance(capacity=3)
    inst = attrs.evolve(base, spec=attrs.evolve(base.spec, device_usage=usage))
    assert held_slots(inst) == {1}  # slot 9 is beyond the capacity, other-0 not its slot
    got = instance_devices(inst, consumable=consumable)
    if consumable:
        (device,) = got.devices
        assert device["capacity"][qualified(SLOTS)]["value"] == "2"
    else:
        assert [d["name"] for d in got.devices] == ["cam-abc123-0", "cam-abc123-2"]
        assert [r.slot for r in got.refs] == [0, 2]
    full = {f"cam-abc123-{i}": "n1" for i in range(3)}
    every = attrs.evolve(inst, spec=attrs.evolve(inst.spec, device_usage=full))
    assert instance_devices(every, consumable=consumable).devices == ()


def test_the_probe_answer_tells_whether_device_taints_are_kept() -> None:
    kept = copy.deepcopy(probe_slice())
    assert keeps_device_taints(kept)
    kept["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-11-26T09:00:00Z"
    assert keeps_device_taints(kept)
    dropped = copy.deepcopy(kept)
    del dropped["spec"]["devices"][0]["taints"]
    assert not keeps_device_taints(dropped)
    assert not keeps_device_taints({})
