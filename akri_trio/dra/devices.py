"""An Instance as DRA devices, and how to tell whether the cluster takes consumable capacity and
device taints.

Either way at most `capacity` Pods hold an Instance at once, counted by the scheduler:
- consumable capacity (`DRAConsumableCapacity`, on by default from 1.36): ONE device with
  `allowMultipleAllocations` and a capacity `akri.sh/slots` of `capacity`; a request consumes 1
  unless it asks for more;
- otherwise `capacity` slot devices `<instance>-<i>`, each allocated to one claim at a time.

Slots a device-plugin-mode claim holds (the Instance's deviceUsage) are not offered: after a
switch from device-plugin mode, its Pods keep their slots until they end (the agent's reclaimer
frees them then), so a slot is never held twice. A consumable device counts them off its
capacity (and is left out while they are all held); a held slot's device is left out.

Which one a cluster takes is decided at run time: an API server without the feature drops the
fields it does not know, so a server-side dry-run create of `probe_slice()` answers the question
(`takes_consumable_capacity` reads the answer). The same dry run tells whether it keeps device
taints (DRADeviceTaints: on by default from 1.36; `keeps_device_taints`), which the offline
grace sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from akri_trio.dra.attributes import Attributes, device_attributes, qualified
from akri_trio.dra.names import DRIVER, device_name
from akri_trio.dra.offline import OFFLINE_TAINT, OFFLINE_TAINT_KEY
from akri_trio.model import naming
from akri_trio.model.resources import JSON, Instance

SLOTS: Final = "slots"  # the capacity a consumable device counts its users in
API_VERSION: Final = "resource.k8s.io/v1"


@attrs.frozen
class DeviceRef:
    """Which Instance (and slot, in slot mode) a published device stands for."""

    namespace: str
    instance: str
    slot: int | None = None


@attrs.frozen
class InstanceDevices:
    """The devices of one Instance, with the attribute report shared by all of them."""

    devices: tuple[JSON, ...]
    refs: tuple[DeviceRef, ...]
    attributes: Attributes


def _slots_capacity(capacity: int) -> JSON:
    return {
        qualified(SLOTS): {
            "value": str(capacity),
            "requestPolicy": {"default": "1", "validRange": {"min": "1"}},
        }
    }


def held_slots(instance: Instance) -> set[int]:
    """The slots of `instance` a device-plugin-mode claim holds: `<instance>-<i>` keys of its
    deviceUsage with any value (a value we cannot read is held by someone, as in that mode)."""
    name = instance.metadata.name
    return {
        i
        for key, value in instance.spec.device_usage.items()
        if value and (i := naming.index_after(name, key)) is not None and i < instance.spec.capacity
    }


def instance_devices(instance: Instance, *, consumable: bool) -> InstanceDevices:
    """The DRA devices of `instance` (none for capacity 0), without the slots device-plugin
    mode holds (`held_slots`)."""
    meta, spec = instance.metadata, instance.spec
    attributes = device_attributes(
        spec.configuration_name,
        meta.namespace,
        meta.name,
        spec.broker_properties,
        capacities=1 if consumable else 0,
    )
    attrs_api = attributes.as_api()
    if spec.capacity <= 0:
        return InstanceDevices((), (), attributes)
    held = held_slots(instance)
    if consumable:
        if len(held) >= spec.capacity:  # a capacity of 0 is refused (its request's min is 1)
            return InstanceDevices((), (), attributes)
        device = {
            "name": device_name(meta.name),
            "attributes": attrs_api,
            "allowMultipleAllocations": True,
            "capacity": _slots_capacity(spec.capacity - len(held)),
        }
        return InstanceDevices((device,), (DeviceRef(meta.namespace, meta.name),), attributes)
    free = [i for i in range(spec.capacity) if i not in held]
    devices = tuple({"name": device_name(meta.name, i), "attributes": attrs_api} for i in free)
    refs = tuple(DeviceRef(meta.namespace, meta.name, i) for i in free)
    return InstanceDevices(devices, refs, attributes)


PROBE_NAME: Final = "akri.sh-consumable-capacity-probe"


def probe_slice() -> JSON:
    """A ResourceSlice to dry-run create: its device keeps `allowMultipleAllocations` and the
    capacity's `requestPolicy` only where the API server serves consumable capacity, and its
    offline taint only where it serves device taints."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": PROBE_NAME},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": "probe", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "probe",
                    "allowMultipleAllocations": True,
                    "capacity": _slots_capacity(2),
                    "taints": [dict(OFFLINE_TAINT)],
                }
            ],
        },
    }


def takes_consumable_capacity(answer: Mapping[str, Any]) -> bool:
    """Whether the dry-run answer to `probe_slice()` kept the consumable-capacity fields."""
    devices = (answer.get("spec") or {}).get("devices") or [{}]
    device = devices[0]
    capacity = (device.get("capacity") or {}).get(qualified(SLOTS)) or {}
    return device.get("allowMultipleAllocations") is True and "requestPolicy" in capacity


def keeps_device_taints(answer: Mapping[str, Any]) -> bool:
    """Whether the dry-run answer to `probe_slice()` kept the device's taint."""
    devices = (answer.get("spec") or {}).get("devices") or [{}]
    taints = devices[0].get("taints") or []
    return any(t.get("key") == OFFLINE_TAINT_KEY for t in taints)
