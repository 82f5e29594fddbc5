"""What a discovery handler may send: the checks every device passes before the agent uses it.

A handler, embedded or external over discovery.proto, is input like any other: its properties
become environment variables of broker containers, its mounts and device nodes go to the
kubelet as host paths. So before a device reaches an Instance or an Allocate answer:

- its id is not empty, and not sent twice in one list (the first is kept, the repeat reported);
- it has at most `max_properties` properties and is at most `max_device_bytes` bytes (the UTF-8
  of its id, property names and values, and paths), checked first: a device over either is
  dropped without looking further, so 200,000 properties cost one count, not 200,000 checks;
- property names are environment variable names (`[A-Za-z_][A-Za-z0-9_]*`), values hold no NUL;
- device-node permissions are a non-empty subset of `rwm`;
- host and container paths are absolute and normalised (no `..`, `.`, `//` or trailing `/`);
- a host path is not `/`, and neither inside nor above one of the refused paths: the node's
  kernel interfaces, configuration and runtime state (`SYSTEM_DIRS`: /proc, whose
  /proc/1/root is the whole node, /sys, /etc, /run and /var/run with the runtimes' sockets,
  the runtimes' storage, the kubelet's directory) and every path the agent was given (its
  handlers directory, the kubelet's directory, device-plugin directory and pod-resources
  socket, the CDI directory, the brokerInfo directory): those are the node's keys;
- a device node's host path is inside /dev; a mount's host path is inside one of the
  directories the agent allows handlers to mount (`mount_dirs`, none by default: upstream's
  handlers send no mounts);
- no more than `max_devices` devices per list (the lowest ids are kept); the agent applies
  `max_configuration_devices` the same way to a Configuration's merged lists;
- with a `host` check (the agent always passes one: discovery.host_critical), no device node
  or mount is one the node itself uses (its mounted disks, swap, /dev/kmsg, consoles...)
  unless the Configuration's namespace is allowed that class (`host_allowances`).

A device that fails is dropped with a reason (at most SHOWN_PROBLEMS of its problems, each cut);
the others go on. Pure functions: paths are checked as text, so a symbolic link on the node
inside /dev or an allowed directory is followed by the runtime (the runtime takes only device
nodes as device nodes; the mount directories must hold no links a handler can plant).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Final

import attrs

from akri_trio.discovery.host_critical import Allowances
from akri_trio.model.device import Device
from akri_trio.model.limits import (
    MAX_DEVICE_BYTES,
    MAX_DEVICES_PER_CONFIGURATION,
    MAX_DEVICES_PER_HANDLER,
    MAX_PROPERTIES_PER_DEVICE,
)

ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PERMISSIONS: Final = frozenset("rwm")
KUBELET_ROOT: Final = "/var/lib/kubelet"
# Refused whatever the agent's flags: a container given one of these (or a directory above one)
# owns the node.
SYSTEM_DIRS: Final = (
    "/proc",
    "/sys",
    "/etc",
    "/boot",
    "/root",
    "/run",
    "/var/run",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/var/lib/docker",
    KUBELET_ROOT,
)
DEVICE_DIR: Final = "/dev"
SHOWN_ID_CHARS: Final = 80
# A dropped device's line names at most this many of its problems, each cut to SHOWN_CHARS, so
# one device (5,000 bad property names) cannot fill a Configuration's status.
SHOWN_PROBLEMS: Final = 3
SHOWN_CHARS: Final = 200


@attrs.frozen
class DeviceRules:
    max_devices: int = MAX_DEVICES_PER_HANDLER  # per handler endpoint's list
    max_configuration_devices: int = MAX_DEVICES_PER_CONFIGURATION  # after the merge
    # Refused besides SYSTEM_DIRS: the paths the agent was given.
    refused_host_dirs: tuple[str, ...] = ()
    # The only directories a mount's host path may be in.
    mount_dirs: tuple[str, ...] = ()
    max_properties: int = MAX_PROPERTIES_PER_DEVICE  # per device
    max_device_bytes: int = MAX_DEVICE_BYTES  # per device, see `device_bytes`
    # Namespace (or "*") -> host-critical device classes it may use (--allow-host-devices).
    host_allowances: Allowances = attrs.field(factory=dict)


# A host path's refusal as a host-critical device, or None (discovery.host_critical.host_check).
HostCheck = Callable[[str], str | None]


def shown(device_id: str) -> str:
    """A device id as a status or log line shows it: quoted, and cut when long."""
    if len(device_id) <= SHOWN_ID_CHARS:
        return repr(device_id)
    return f"{device_id[:SHOWN_ID_CHARS]!r}... ({len(device_id)} chars)"


def _path_problem(path: str, what: str) -> str | None:
    # normpath keeps a leading '//' (POSIX leaves its meaning to the system): refused too.
    normal = posixpath.normpath(path) == path and not path.startswith("//")
    if not path.startswith("/") or "\0" in path or not normal:
        return f"{what} {path[:200]!r} is not an absolute, normalised path"
    return None


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def host_path_problem(path: str, what: str, refused: Sequence[str]) -> str | None:
    """Why a container may not be given host `path` (None: it may): it is not absolute and
    normalised, or is `/`, or is inside or above SYSTEM_DIRS or a path of `refused`."""
    problem = _path_problem(path, what)
    if problem is not None:
        return problem
    if path == "/":
        return f"{what} '/' would give the container the node's whole filesystem"
    for directory in (*SYSTEM_DIRS, *refused):
        if _inside(path, directory) or _inside(directory, path):
            return f"{what} {path!r} would give the container {directory}"
    return None


def _device_node_problem(path: str, rules: DeviceRules) -> str | None:
    problem = host_path_problem(path, "device host path", rules.refused_host_dirs)
    if problem is None and (path == DEVICE_DIR or not _inside(path, DEVICE_DIR)):
        return f"device host path {path!r} is not inside {DEVICE_DIR}"
    return problem


def _mount_problem(path: str, rules: DeviceRules) -> str | None:
    problem = host_path_problem(path, "mount host path", rules.refused_host_dirs)
    if problem is None and not any(_inside(path, d) for d in rules.mount_dirs):
        allowed = ", ".join(rules.mount_dirs) or "none"
        return (
            f"mount host path {path!r} is not inside a directory the agent lets handlers "
            f"mount (--handler-mount-dir: {allowed})"
        )
    return problem


def device_bytes(device: Device) -> int:
    """The size of what `device` carries: the UTF-8 of its id, property names and values, and
    mount and device-node paths."""
    texts = [device.id, *device.properties.keys(), *device.properties.values()]
    texts += [p for m in device.mounts for p in (m.container_path, m.host_path)]
    texts += [p for s in device.device_specs for p in (s.container_path, s.host_path)]
    return sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)


def _size_problems(device: Device, rules: DeviceRules) -> list[str]:
    problems: list[str] = []
    count = len(device.properties)
    if count > rules.max_properties:
        problems.append(
            f"{count} properties; at most {rules.max_properties} per device "
            "(the agent's --max-properties-per-device)"
        )
    size = device_bytes(device)
    if size > rules.max_device_bytes:
        problems.append(
            f"{size} bytes; at most {rules.max_device_bytes} per device "
            "(the agent's --max-device-bytes)"
        )
    return problems


def device_problems(device: Device, rules: DeviceRules, host: HostCheck | None = None) -> list[str]:
    """Why `device` may not be used (empty: it may)."""
    problems = _size_problems(device, rules)
    if problems:
        return problems  # too big to be worth checking further
    if not device.id:
        problems.append("empty device id")
    for name, value in device.properties.items():
        if not ENV_NAME.fullmatch(name):
            problems.append(f"property name {name[:100]!r} is not an environment variable name")
        if "\0" in value:
            problems.append(f"property {name[:100]!r} holds a NUL character")
    for spec in device.device_specs:
        if not spec.permissions or not set(spec.permissions) <= PERMISSIONS:
            problems.append(
                f"device permissions {spec.permissions[:20]!r} are not a subset of 'rwm'"
            )
        problems += filter(None, [_path_problem(spec.container_path, "device container path")])
        host_path = spec.host_path or spec.container_path
        problems += filter(None, [_device_node_problem(host_path, rules)])
        problems += filter(None, [host(host_path) if host is not None else None])
    for mount in device.mounts:
        problems += filter(None, [_path_problem(mount.container_path, "mount container path")])
        problems += filter(None, [_mount_problem(mount.host_path, rules)])
        problems += filter(None, [host(mount.host_path) if host is not None else None])
    return problems


def dropped(device_id: str, problems: Sequence[str]) -> str:
    """The line saying why a device was dropped: at most SHOWN_PROBLEMS problems, each cut to
    SHOWN_CHARS, whatever the device sent."""
    shown_problems = [
        p if len(p) <= SHOWN_CHARS else p[:SHOWN_CHARS] + "..." for p in problems[:SHOWN_PROBLEMS]
    ]
    more = len(problems) - SHOWN_PROBLEMS
    if more > 0:
        shown_problems.append(f"and {more} more")
    return f"device {shown(device_id)} dropped: {'; '.join(shown_problems)}"


def check_devices(
    devices: Iterable[Device], rules: DeviceRules, host: HostCheck | None = None
) -> tuple[list[Device], list[str]]:
    """The devices of one handler's list that may be used (in the list's order), and a line
    per device dropped or list cut. `host` refuses host-critical paths."""
    kept: dict[str, Device] = {}
    seen: set[str] = set()
    repeats: dict[str, int] = {}
    problems: list[str] = []
    for device in devices:
        if device.id in seen:
            repeats[device.id] = repeats.get(device.id, 1) + 1
            continue
        seen.add(device.id)
        why = device_problems(device, rules, host)
        if why:
            problems.append(dropped(device.id, why))
            continue
        kept[device.id] = device
    for device_id, times in repeats.items():
        problems.append(
            f"device id {shown(device_id)} sent {times} times; only the first is considered"
        )
    if len(kept) > rules.max_devices:
        chosen = set(sorted(kept)[: rules.max_devices])
        problems.append(
            f"{len(kept)} devices sent; only the first {rules.max_devices} by id are used "
            "(the agent's --max-devices-per-handler)"
        )
        kept = {i: d for i, d in kept.items() if i in chosen}
    return list(kept.values()), problems
