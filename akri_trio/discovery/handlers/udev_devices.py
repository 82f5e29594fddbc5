"""From matched udev devices to the `Device`s the agent publishes: ids, properties, DeviceSpecs.

Kept apart from the matcher because this is where upstream's udev pain points live, and each
is a decision about plain data, tested without /sys:

- #521: a matched device with no devnode of its own (a USB interface, a drm card's parent)
  used to be useless; it now uses the devnode of its nearest ancestor that has one;
- #490: one physical device spanning several devnodes (a camera's video0 + video1, a modem's
  ttyACM0 + its control node). With `groupRecursive`, every matched device below a matched
  ancestor joins that ancestor's Device, which carries ALL their devnodes;
- ids and properties exactly as upstream (id = devpath; `UDEV_DEVPATH`, `UDEV_DEVNODE` or,
  grouped, `UDEV_DEVNODE_<i>`), but deterministic: upstream numbers devnodes in HashSet order
  and treats `/devices/a1` as a child of `/devices/a` (a string prefix); here children are
  found by path components and devnodes are numbered in devpath order, so the same devices
  always give the same properties.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from akri_trio.discovery.handlers.udev_rules import DeviceSnapshot
from akri_trio.model.device import Device, DeviceSpec

DEVPATH_PROPERTY: Final = "UDEV_DEVPATH"
DEVNODE_PROPERTY: Final = "UDEV_DEVNODE"
PERMISSIONS: Final = ("r", "w", "m", "rw", "rm", "rwm", "wm")


@attrs.frozen(order=True)
class Match:
    """A matched device reduced to what a Device needs: its devpath and the devnode to expose
    (its own, else its nearest ancestor's; None if no device up the tree has one)."""

    devpath: str
    devnode: str | None


def resolve(device: DeviceSnapshot) -> Match:
    devnode = next((d.devnode for d in device.lineage() if d.devnode), None)
    return Match(device.devpath, devnode)


def is_below(devpath: str, ancestor: str) -> bool:
    """Is `devpath` strictly inside `ancestor` in the sysfs tree (by path components)?"""
    return devpath.startswith(ancestor.rstrip("/") + "/")


def group(matches: Iterable[Match]) -> dict[str, list[Match]]:
    """Each match under its top-most matched ancestor (itself if none), keyed by that devpath.
    Members are in devpath order, so an ancestor comes before its descendants."""
    ordered = sorted(set(matches))
    groups: dict[str, list[Match]] = {}
    tops: list[str] = []
    for m in ordered:
        # Sorted order puts an ancestor before its descendants, but not always directly before
        # ("/a/b" < "/a/b-c" < "/a/b/d"): look through every top found so far.
        top = next((t for t in tops if is_below(m.devpath, t)), None)
        if top is None:
            tops.append(m.devpath)
            groups[m.devpath] = [m]
        else:
            groups[top].append(m)
    return groups


def build_devices(
    matched: Sequence[DeviceSnapshot], *, group_recursive: bool, permissions: str
) -> list[Device]:
    """The Devices for the union of every rule's matches, sorted by id."""
    matches = sorted({resolve(d) for d in matched})
    if not group_recursive:
        by_id: dict[str, Device] = {}
        for m in matches:
            properties = {DEVPATH_PROPERTY: m.devpath}
            specs: tuple[DeviceSpec, ...] = ()
            if m.devnode is not None:
                properties[DEVNODE_PROPERTY] = m.devnode
                specs = (DeviceSpec(m.devnode, m.devnode, permissions),)
            by_id[m.devpath] = Device(id=m.devpath, properties=properties, device_specs=specs)
        return [by_id[k] for k in sorted(by_id)]
    devices = []
    for top, members in sorted(group(matches).items()):
        devnodes = list(dict.fromkeys(m.devnode for m in members if m.devnode is not None))
        properties = {DEVPATH_PROPERTY: top}
        properties.update({f"{DEVNODE_PROPERTY}_{i}": node for i, node in enumerate(devnodes)})
        devices.append(
            Device(
                id=top,
                properties=properties,
                device_specs=tuple(DeviceSpec(n, n, permissions) for n in devnodes),
            )
        )
    return devices
