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

Passthrough (upstream's `discoveryProperties` `devicePluginResourceName` and
`vfioPassthrough`, for KubeVirt and other VM runtimes that find host devices by environment
variable): with a resource name, every USB device node `/dev/bus/usb/<bus>/<dev>` adds
`USB_RESOURCE_<NAME>=<bus>:<dev>` (numbers without leading zeros; `_<i>` after it when grouped,
the index of that devnode), and a device whose id lies on a PCI path (and not below a USB bus)
adds `PCI_RESOURCE_<NAME>=<the last PCI address in its devpath>`; `<NAME>` is the resource name
upper-cased with `.` and `/` as `_`. With `vfioPassthrough: "true"` such a PCI device also gets
its IOMMU group's `/dev/vfio/<group>` and the VFIO container `/dev/vfio/vfio` (`rwm`); one
with no IOMMU group (no IOMMU, or not bound to vfio-pci) is still reported, without them
(`missing_iommu_groups` names such devices so the handler can say so).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import attrs

from akri_trio.discovery.handlers.udev_rules import DeviceSnapshot
from akri_trio.model.device import Device, DeviceSpec

DEVPATH_PROPERTY: Final = "UDEV_DEVPATH"
DEVNODE_PROPERTY: Final = "UDEV_DEVNODE"
PERMISSIONS: Final = ("r", "w", "m", "rw", "rm", "rwm", "wm")
RESOURCE_NAME_PROPERTY: Final = "devicePluginResourceName"
VFIO_PASSTHROUGH_PROPERTY: Final = "vfioPassthrough"
USB_RESOURCE_PREFIX: Final = "USB_RESOURCE_"
PCI_RESOURCE_PREFIX: Final = "PCI_RESOURCE_"
VFIO_CONTAINER: Final = "/dev/vfio/vfio"
_HEX: Final = "[0-9A-Fa-f]+"
_PCI_ADDRESS: Final = re.compile(f"{_HEX}:{_HEX}:{_HEX}\\.{_HEX}")
_USB_NODE: Final = re.compile(r"/dev/bus/usb/(?:.*/)?([0-9]+)/([0-9]+)")


@attrs.frozen
class Passthrough:
    """What a Configuration's discoveryProperties ask of the udev handler beyond devnodes."""

    resource_name: str | None = None
    vfio: bool = False


NO_PASSTHROUGH: Final = Passthrough()


def passthrough_of(properties: Mapping[str, bytes | None]) -> Passthrough:
    """Upstream's reading: the UTF-8 values, trimmed; vfioPassthrough is "true" in any case."""

    def text(key: str) -> str | None:
        raw = properties.get(key)
        try:
            return raw.decode().strip() if raw is not None else None
        except UnicodeDecodeError:
            return None

    name = text(RESOURCE_NAME_PROPERTY)
    vfio = (text(VFIO_PASSTHROUGH_PROPERTY) or "").lower() == "true"
    return Passthrough(resource_name=name or None, vfio=vfio)


def resource_variable(prefix: str, resource_name: str) -> str:
    """`akri.sh/udev-gpu` -> `<prefix>AKRI_SH_UDEV-GPU` (ASCII upper-cased, `.`/`/` -> `_`)."""
    return prefix + "".join(
        "_" if c in "./" else c.upper() if c.isascii() else c for c in resource_name
    )


def usb_address(devnode: str) -> str | None:
    """`/dev/bus/usb/001/010` -> `1:10`; None for any other node."""
    found = _USB_NODE.fullmatch(devnode)
    return f"{int(found[1])}:{int(found[2])}" if found else None


def pci_address(devpath: str) -> str | None:
    """The last PCI address (`0000:01:00.0`) among the devpath's components, unless the device
    sits below a USB bus (a USB device's path crosses its host controller's PCI address)."""
    parts = devpath.split("/")
    if any(part.startswith("usb") for part in parts):
        return None
    return next((p for p in reversed(parts) if _PCI_ADDRESS.fullmatch(p)), None)


def missing_iommu_groups(devices: Iterable[Device], passthrough: Passthrough) -> list[str]:
    """The ids of PCI devices that asked for VFIO passthrough and got no IOMMU group."""
    if not (passthrough.vfio and passthrough.resource_name):
        return []
    variable = resource_variable(PCI_RESOURCE_PREFIX, passthrough.resource_name)
    return [
        d.id
        for d in devices
        if variable in d.properties
        and not any(spec.host_path == VFIO_CONTAINER for spec in d.device_specs)
    ]


@attrs.frozen(order=True)
class Match:
    """A matched device reduced to what a Device needs: its devpath and the devnode to expose
    (its own, else its nearest ancestor's; None if no device up the tree has one)."""

    devpath: str
    devnode: str | None
    iommu_group: str | None = None  # the matched device's own (read only for passthrough)


def resolve(device: DeviceSnapshot) -> Match:
    devnode = next((d.devnode for d in device.lineage() if d.devnode), None)
    return Match(device.devpath, devnode, device.iommu_group)


def _with_passthrough(
    device: Device, top: Match, devnodes: Sequence[str], passthrough: Passthrough, grouped: bool
) -> Device:
    """`device` plus the USB/PCI resource properties and VFIO specs `passthrough` asks for."""
    name = passthrough.resource_name
    if name is None:
        return device
    properties = dict(device.properties)
    specs = list(device.device_specs)
    usb = resource_variable(USB_RESOURCE_PREFIX, name)
    for i, node in enumerate(devnodes):
        address = usb_address(node)
        if address is not None:
            properties[f"{usb}_{i}" if grouped else usb] = address
    pci = pci_address(top.devpath)
    if pci is not None:
        properties[resource_variable(PCI_RESOURCE_PREFIX, name)] = pci
        if passthrough.vfio and top.iommu_group is not None:
            group = f"/dev/vfio/{top.iommu_group}"
            specs.append(DeviceSpec(group, group, "rwm"))
            specs.append(DeviceSpec(VFIO_CONTAINER, VFIO_CONTAINER, "rwm"))
    return attrs.evolve(device, properties=properties, device_specs=tuple(specs))


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
    matched: Sequence[DeviceSnapshot],
    *,
    group_recursive: bool,
    permissions: str,
    passthrough: Passthrough = NO_PASSTHROUGH,
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
            device = Device(id=m.devpath, properties=properties, device_specs=specs)
            nodes = [m.devnode] if m.devnode is not None else []
            by_id[m.devpath] = _with_passthrough(device, m, nodes, passthrough, grouped=False)
        return [by_id[k] for k in sorted(by_id)]
    devices = []
    for top, members in sorted(group(matches).items()):
        devnodes = list(dict.fromkeys(m.devnode for m in members if m.devnode is not None))
        properties = {DEVPATH_PROPERTY: top}
        properties.update({f"{DEVNODE_PROPERTY}_{i}": node for i, node in enumerate(devnodes)})
        device = Device(
            id=top,
            properties=properties,
            device_specs=tuple(DeviceSpec(n, n, permissions) for n in devnodes),
        )
        devices.append(_with_passthrough(device, members[0], devnodes, passthrough, grouped=True))
    return devices
