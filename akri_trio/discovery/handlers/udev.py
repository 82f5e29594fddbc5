"""udev: local devices (/dev nodes) selected by udev rules, as upstream's udev handler.

Why event-driven: upstream re-enumerates /sys every 10 s, so a camera plugged in takes up to
10 s to appear and an idle node still walks sysfs forever. Here a netlink uevent monitor wakes
discovery within a debounce window (bursts of events, e.g. a USB device bringing up five
interfaces, cost one scan), and a slow periodic re-enumeration (30 s) stays as the safety net
for lost events (netlink drops under load, ENOBUFS) and for a monitor we could not open. With
nothing happening the handler sleeps in `wait_readable`: ~0 % CPU.

Layout: `parse_details` and `devices_for` are pure (rules from `udev_rules`, grouping and
Device building from `udev_devices`); `scan` is the I/O edge that turns pyudev devices into
plain `DeviceSnapshot`s and runs in a worker thread (a full walk of ~400 devices is ~70 ms of
blocking sysfs reads); `watch_uevents` owns the netlink socket.

What needs the host's /run/udev (mounted read-only into the pod): udev-database properties,
i.e. `ENV{...}` values set by udev rules (ID_VENDOR_ID, ID_SERIAL, ...; upstream #476) and
`TAG`/`TAGS`, plus the "udev" monitor source (events after udevd has run its rules). Without
it, ENV sees only the kernel's uevent variables (DEVNAME, MAJOR, DEVTYPE, DRIVER, ...), tags
are empty, and the monitor listens to the kernel directly. Netlink uevents are per network
namespace, so a containerised handler needs `hostNetwork: true` for events (the periodic
re-enumeration works regardless).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import pyudev
import trio

from akri_trio.discovery.handlers.udev_devices import (
    NO_PASSTHROUGH,
    PERMISSIONS,
    Passthrough,
    build_devices,
    missing_iommu_groups,
    passthrough_of,
)
from akri_trio.discovery.handlers.udev_rules import (
    MAX_RULE_LENGTH,
    DeviceSnapshot,
    RuleError,
    UdevRule,
    attribute_keys,
    parse_rule,
    rule_matches,
)
from akri_trio.discovery.interface import (
    MAX_DETAILS_BYTES,
    InvalidDetails,
    Properties,
    Send,
    details_parser,
    load_mapping,
    max_details_bytes,
    positive_int_setting,
    required_str_list,
)
from akri_trio.model.device import Device
from akri_trio.runtime import Changed

log = logging.getLogger(__name__)

NAME: Final = "udev"
RESCAN_INTERVAL_S: Final = 30.0
DEBOUNCE_S: Final = 0.5
MONITOR_SOURCE_ENV: Final = "UDEV_MONITOR_SOURCE"
RESCAN_INTERVAL_ENV: Final = "UDEV_RESCAN_INTERVAL_SECONDS"
MAX_RULE_LENGTH_ENV: Final = "UDEV_MAX_RULE_LENGTH"
# udevd's control socket: libudev itself only delivers "udev" events when this exists.
UDEVD_CONTROL: Final = Path("/run/udev/control")

MonitorSource = Literal["auto", "kernel", "udev", "none"]
MONITOR_SOURCES: Final[tuple[MonitorSource, ...]] = ("auto", "kernel", "udev", "none")


# ---- details (pure) ------------------------------------------------------------------------------


@attrs.frozen
class UdevDetails:
    rules: tuple[UdevRule, ...]
    group_recursive: bool = False
    permissions: str = "rwm"


@details_parser
def parse_details(
    text: str, *, max_rule_length: int = MAX_RULE_LENGTH, max_bytes: int = MAX_DETAILS_BYTES
) -> UdevDetails:
    """`udevRules: [..]` (required; each at most `max_rule_length` characters),
    `groupRecursive: bool = false`, `permissions` (one of r, w, m, rw, rm, rwm, wm; default
    rwm). Other keys are ignored, as upstream's serde."""
    doc = load_mapping(text, max_bytes=max_bytes)
    rules = []
    for i, text_rule in enumerate(required_str_list(doc, "udevRules")):
        try:
            rules.append(parse_rule(text_rule, max_length=max_rule_length))
        except RuleError as exc:
            raise InvalidDetails(f"udevRules[{i}]", str(exc)) from exc
    group_recursive = doc.get("groupRecursive", False)
    if group_recursive is None:
        group_recursive = False
    if not isinstance(group_recursive, bool):
        raise InvalidDetails(
            "groupRecursive", f"must be true or false, got {_shown(group_recursive)}"
        )
    permissions = doc.get("permissions", "rwm")
    if permissions is None:
        permissions = "rwm"
    if permissions not in PERMISSIONS:
        raise InvalidDetails(
            "permissions", f"must be one of {', '.join(PERMISSIONS)}, got {_shown(permissions)}"
        )
    return UdevDetails(tuple(rules), group_recursive, permissions)


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{value!r} ({type(value).__name__})"


def devices_for(
    details: UdevDetails,
    snapshots: Iterable[DeviceSnapshot],
    passthrough: Passthrough = NO_PASSTHROUGH,
) -> list[Device]:
    """The Devices to report, given every enumerated device: a device is selected when any
    rule matches it."""
    matched = [s for s in snapshots if any(rule_matches(r, s) for r in details.rules)]
    return build_devices(
        matched,
        group_recursive=details.group_recursive,
        permissions=details.permissions,
        passthrough=passthrough,
    )


def monitor_source(choice: MonitorSource, udevd_running: bool) -> Literal["kernel", "udev"] | None:
    """The netlink group to listen to (None: no monitor, periodic re-enumeration only)."""
    if choice == "auto":
        return "udev" if udevd_running else "kernel"
    return None if choice == "none" else choice


# ---- sysfs (I/O edge, blocking: run in a thread) -------------------------------------------------


def _iommu_group(sys_path: str) -> str | None:
    """The device's IOMMU group number (its `iommu_group` link's name), None if it has none."""
    try:
        return os.path.basename(os.readlink(os.path.join(sys_path, "iommu_group")))
    except OSError:
        return None


def _snapshot(
    device: Any, keys: frozenset[str], cache: dict[str, DeviceSnapshot], iommu: bool = False
) -> DeviceSnapshot:
    devpath: str = device.device_path
    known = cache.get(devpath)
    if known is not None:
        return known
    parent_device = device.parent
    parent = None if parent_device is None else _snapshot(parent_device, keys, cache, iommu)
    attributes = {}
    for key in keys:
        raw = device.attributes.get(key)
        if raw is not None:
            attributes[key] = bytes(raw).decode(errors="replace").rstrip("\n")
    snapshot = DeviceSnapshot(
        devpath=devpath,
        sys_name=device.sys_name,
        subsystem=device.subsystem,
        driver=device.driver,
        devnode=device.device_node,
        attributes=attributes,
        properties=dict(device.properties),
        tags=frozenset(device.tags),
        parent=parent,
        iommu_group=_iommu_group(device.sys_path) if iommu else None,
    )
    cache[devpath] = snapshot
    return snapshot


def snapshots(keys: frozenset[str] = frozenset(), *, iommu: bool = False) -> list[DeviceSnapshot]:
    """Every device the libudev enumerator lists (the same set upstream's enumerator scans),
    with the sysfs attributes in `keys` read for each device and its ancestors (and, with
    `iommu`, its IOMMU group). A device
    whose path, name or udev properties are not UTF-8 (a netdev or HID name is any bytes) is
    skipped with a warning: it must not cost every other device its scan."""
    context = pyudev.Context()
    cache: dict[str, DeviceSnapshot] = {}
    found = []
    for device in context.list_devices():
        try:
            found.append(_snapshot(device, keys, cache, iommu))
        except (pyudev.DeviceNotFoundError, OSError) as exc:
            # Removed while we walked the tree: the next uevent or scan settles it.
            log.debug("skipping a device that vanished mid-scan: %r", exc)
        except UnicodeDecodeError as exc:
            log.warning(
                "udev: skipping a device whose data is not UTF-8: %r (%s)",
                bytes(exc.object[:120]),
                exc.reason,
            )
    return found


def scan(details: UdevDetails, passthrough: Passthrough = NO_PASSTHROUGH) -> list[Device]:
    """One full enumeration: the Devices for `details` (and `passthrough`) right now."""
    found = snapshots(attribute_keys(details.rules), iommu=passthrough.vfio)
    return devices_for(details, found, passthrough)


# ---- uevents -------------------------------------------------------------------------------------


@attrs.define
class Stats:
    """Counters for observability and tests (shared by every discover() of one handler)."""

    uevents: int = 0
    scans: int = 0
    last_uevent: tuple[str, str] | None = None
    monitor: str | None = None  # the netlink source in use, None = periodic scans only


async def watch_uevents(
    source: Literal["kernel", "udev"],
    dirty: Changed,
    stats: Stats,
    *,
    task_status: trio.TaskStatus[bool] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen for uevents on netlink, bumping `dirty` on each. Reports started(True) once
    listening, or started(False) and returns if no monitor can be opened (no netlink, no
    permission): discovery then relies on periodic scans. Runs until cancelled; closes the
    socket on the way out."""
    try:
        monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
        monitor.start()
    except OSError as exc:
        log.warning("no udev monitor (%r): relying on periodic re-enumeration", exc)
        task_status.started(False)
        return
    fd: int = monitor.fileno()
    stats.monitor = source
    try:
        task_status.started(True)
        while True:
            await trio.lowlevel.wait_readable(fd)
            while True:
                try:
                    event = monitor.poll(timeout=0)
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS:
                        raise
                    # The kernel dropped events: we cannot know what changed, so rescan.
                    log.info("udev monitor overran its buffer; rescanning")
                    dirty.bump()
                    continue
                if event is None:
                    break
                stats.uevents += 1
                stats.last_uevent = (str(event.action), str(event.device_path))
                dirty.bump()
    finally:
        stats.monitor = None
        trio.lowlevel.notify_closing(fd)
        # pyudev has no close(): the socket closes when libudev's monitor is unreferenced,
        # which CPython does right here as the last reference goes.
        del monitor


# ---- the handler ---------------------------------------------------------------------------------


@attrs.define
class UdevHandler:
    """The udev handler (local: its devices belong to this node only)."""

    source: MonitorSource = "auto"
    rescan_interval: float = RESCAN_INTERVAL_S
    debounce: float = DEBOUNCE_S
    max_rule_length: int = MAX_RULE_LENGTH
    max_details_bytes: int = MAX_DETAILS_BYTES
    name: str = NAME
    shared: bool = False
    stats: Stats = attrs.field(factory=Stats)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UdevHandler:
        """`UDEV_MONITOR_SOURCE` (auto|kernel|udev|none, default auto),
        `UDEV_RESCAN_INTERVAL_SECONDS` (default 30) and `UDEV_MAX_RULE_LENGTH` (default
        4096 characters)."""
        env = os.environ if env is None else env
        chosen = env.get(MONITOR_SOURCE_ENV) or "auto"
        source = next((s for s in MONITOR_SOURCES if s == chosen), None)
        if source is None:
            raise ValueError(
                f"{MONITOR_SOURCE_ENV} must be one of {', '.join(MONITOR_SOURCES)}, got {chosen!r}"
            )
        text = env.get(RESCAN_INTERVAL_ENV) or str(RESCAN_INTERVAL_S)
        try:
            interval = float(text)
        except ValueError:
            interval = -1.0
        if not interval > 0:
            raise ValueError(f"{RESCAN_INTERVAL_ENV} must be a positive number, got {text!r}")
        return cls(
            source=source,
            rescan_interval=interval,
            max_rule_length=positive_int_setting(env, MAX_RULE_LENGTH_ENV, MAX_RULE_LENGTH),
            max_details_bytes=max_details_bytes(env),
        )

    def parse_details(self, text: str) -> UdevDetails:
        return parse_details(
            text, max_rule_length=self.max_rule_length, max_bytes=self.max_details_bytes
        )

    async def discover(self, details: UdevDetails, properties: Properties, send: Send) -> None:
        """Scan, send the list if it changed, then sleep until a uevent (plus the debounce
        window) or the rescan interval; repeat until cancelled."""
        dirty = Changed()
        passthrough = passthrough_of(properties)
        source = monitor_source(self.source, UDEVD_CONTROL.exists())
        async with trio.open_nursery() as nursery:
            if source is not None:
                await nursery.start(watch_uevents, source, dirty, self.stats)
            last: list[Device] | None = None
            while True:
                seen = dirty.version  # events from here on (even mid-scan) trigger the next scan
                devices = await trio.to_thread.run_sync(scan, details, passthrough)
                self.stats.scans += 1
                if devices != last:
                    last = devices
                    log.info("udev: %d device(s) match", len(devices))
                    for devpath in missing_iommu_groups(devices, passthrough):
                        log.warning(
                            "udev: PCI device %s has no IOMMU group (no IOMMU, or not bound "
                            "to vfio-pci): reported without /dev/vfio",
                            devpath,
                        )
                    await send(list(devices))
                with trio.move_on_after(self.rescan_interval):
                    await dirty.wait_past(seen)
                    await trio.sleep(self.debounce)  # let the burst finish: one scan for all
