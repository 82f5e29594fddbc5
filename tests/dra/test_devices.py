"""An Instance as one consumable-capacity device or as `capacity` slot devices; the probe that
tells which one a cluster takes, and whether it keeps device taints."""

from __future__ import annotations

import copy

from akri_trio.dra import (
    DeviceRef,
    instance_devices,
    keeps_device_taints,
    probe_slice,
    takes_consumable_capacity,
)
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


def test_the_probe_answer_tells_whether_device_taints_are_kept() -> None:
    kept = copy.deepcopy(probe_slice())
    assert keeps_device_taints(kept)
    kept["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-11-26T09:00:00Z"
    assert keeps_device_taints(kept)
    dropped = copy.deepcopy(kept)
    del dropped["spec"]["devices"][0]["taints"]
    assert not keeps_device_taints(dropped)
    assert not keeps_device_taints({})
