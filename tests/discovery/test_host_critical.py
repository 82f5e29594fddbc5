"""Host-critical devices: parsing the node's mount, swap and holder facts, deciding which paths
no tenant gets by default, per-namespace allowances, the device check's drop with a reason,
and the node's real facts (its root disk is refused)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.device_rules import DeviceRules, check_devices
from akri_trio.discovery.host_critical import (
    CLASSES,
    BlockDevice,
    allowed_classes,
    host_check,
    node_facts,
    parse_allowances,
    parse_consoles,
    parse_mountinfo,
    parse_swaps,
    read_node_facts,
    refusal,
)
from akri_trio.model.device import Device, DeviceSpec, Mount

MOUNTINFO = """\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
25 22 0:23 / /proc rw,nosuid - proc proc rw
40 22 254:1 /var/lib/kubelet /var/lib/kubelet rw shared:10 - ext4 /dev/vda1 rw
41 22 253:0 / /srv/my\\040data rw - xfs /dev/mapper/vg-data rw
"""
SWAPS = """\
Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority
/dev/vdb2                               partition\t1048572\t\t0\t\t-2
/swap\\040file                           file\t\t1048572\t\t0\t\t-3
"""
BLOCKS = [
    BlockDevice("vda", "254:0"),
    BlockDevice("vda1", "254:1", disk="vda"),
    BlockDevice("vdb", "254:16"),
    BlockDevice("vdb1", "254:17", disk="vdb", holders=("dm-0",)),
    BlockDevice("vdb2", "254:18", disk="vdb"),
    BlockDevice("dm-0", "253:0", aliases=("/dev/mapper/vg-data",)),
    BlockDevice("vdc", "254:32"),  # a spare disk: a tenant may have it
    BlockDevice("cciss/c0d0", "104:0"),
]
FACTS = node_facts(
    BLOCKS,
    parse_mountinfo(MOUNTINFO),
    swap_paths=parse_swaps(SWAPS),
    consoles=parse_consoles("tty0 ttyS0\n"),
)


def test_parsing_the_nodes_files() -> None:
    assert parse_mountinfo(MOUNTINFO) == {
        "254:1": "/",
        "0:23": "/proc",
        "253:0": "/srv/my data",
    }
    assert parse_swaps(SWAPS) == ["/dev/vdb2", "/swap file"]
    assert parse_consoles("tty0 ttyS0\n") == {"/dev/tty0", "/dev/ttyS0"}


def test_which_block_devices_are_critical_and_why() -> None:
    assert FACTS.block == {
        "/dev/vda1": "it holds the node's filesystem mounted at /",
        "/dev/vda": "its partition vda1: it holds the node's filesystem mounted at /",
        "/dev/vdb1": "it is a member of dm-0 (LVM/RAID/dm)",
        "/dev/vdb2": "it is the node's swap",
        "/dev/vdb": "its partition vdb1: it is a member of dm-0 (LVM/RAID/dm)",
        "/dev/dm-0": "it holds the node's filesystem mounted at /srv/my data",
        "/dev/mapper/vg-data": "it holds the node's filesystem mounted at /srv/my data",
    }
    assert FACTS.numbers["254:0"] == "/dev/vda"
    assert "/dev/vdc" not in FACTS.block


@pytest.mark.parametrize(
    ("path", "cls"),
    [
        ("/dev/vda", "block"),
        ("/dev/mapper/vg-data", "block"),
        ("/dev/mem", "kernel"),
        ("/dev/kmem", "kernel"),
        ("/dev/port", "kernel"),
        ("/dev/kmsg", "kernel"),
        ("/dev/console", "console"),
        ("/dev/tty", "console"),
        ("/dev/tty3", "console"),
        ("/dev/vcsa1", "console"),
        ("/dev/ptmx", "console"),
        ("/dev/pts/4", "console"),
        ("/dev/ttyS0", "console"),  # the kernel's active console on this node
    ],
)
def test_critical_paths_are_refused_unless_their_class_is_allowed(path: str, cls: str) -> None:
    why = refusal(path, FACTS, frozenset())
    assert why is not None and why.startswith(f"host path {path!r} is a host-critical device (")
    assert f"--allow-host-devices NAMESPACE:{cls}" in why
    assert refusal(path, FACTS, frozenset({cls})) is None
    assert refusal(path, FACTS, frozenset(set(CLASSES) - {cls})) is not None


@pytest.mark.parametrize(
    "path", ["/dev/vdc", "/dev/null", "/dev/ttyS1", "/dev/ttyUSB0", "/dev/ttyACM0", "/dev/video0"]
)
def test_ordinary_devices_pass(path: str) -> None:
    assert refusal(path, FACTS, frozenset()) is None


def test_an_alias_is_caught_by_its_device_number() -> None:
    why = refusal("/dev/disk/by-uuid/1234", FACTS, frozenset(), number="254:0")
    assert why is not None and "it is /dev/vda: its partition vda1" in why
    assert refusal("/dev/disk/by-uuid/5678", FACTS, frozenset(), number="254:32") is None


@given(st.text(alphabet="/abcdefmnoprstuvyk0123456789", max_size=20))
def test_every_class_allowed_refuses_nothing(path: str) -> None:
    assert refusal(path, FACTS, frozenset(CLASSES), number="254:0") is None


def test_allowances_from_flags() -> None:
    allowances = parse_allowances(["storage:block", "ops:all", "*:console", "storage:kernel"])
    assert allowances == {
        "storage": frozenset({"block", "kernel"}),
        "ops": frozenset(CLASSES),
        "*": frozenset({"console"}),
    }
    assert allowed_classes(allowances, "storage") == {"block", "kernel", "console"}
    assert allowed_classes(allowances, "tenant") == {"console"}
    for bad in ["storage", "storage:disks", ":block"]:
        with pytest.raises(ValueError, match="is not NAMESPACE:CLASS"):
            parse_allowances([bad])


def test_check_devices_drops_a_critical_device_with_its_reason() -> None:
    def host(path: str) -> str | None:
        return refusal(path, FACTS, frozenset())

    devices = [
        Device("/devices/vda", device_specs=(DeviceSpec("/dev/vda", "/dev/vda"),)),
        Device("/devices/vdc", device_specs=(DeviceSpec("/dev/vdc", "/dev/vdc"),)),
        Device("kmsg", mounts=(Mount("/k", "/dev/kmsg"),)),
    ]
    kept, problems = check_devices(devices, DeviceRules(mount_dirs=("/dev",)), host)
    assert [d.id for d in kept] == ["/devices/vdc"]
    assert problems[0].startswith(
        "device '/devices/vda' dropped: host path '/dev/vda' is a host-critical device "
        "(its partition vda1: it holds the node's filesystem mounted at /)"
    )
    assert problems[1].startswith("device 'kmsg' dropped: host path '/dev/kmsg' is a host-")
    assert check_devices(devices, DeviceRules(mount_dirs=("/dev",)))[1] == []  # no host check


# ---- this node -----------------------------------------------------------------------------


def root_disk() -> str:
    """The node's root filesystem's whole disk, from /proc and /sys alone (e.g. /dev/vda)."""
    mounted = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    root = next(dev for dev, mount in mounted.items() if mount == "/")
    sys_dev = Path(os.path.realpath(f"/sys/dev/block/{root}"))
    disk = sys_dev.parent if (sys_dev / "partition").exists() else sys_dev
    return f"/dev/{disk.name}"


def test_this_nodes_root_disk_and_kmsg_are_refused() -> None:
    disk = root_disk()
    facts = read_node_facts()
    assert disk in facts.block
    check = host_check({}, "tenant")
    why = check(disk)
    assert why is not None and "host-critical" in why and "mounted at /" in why
    assert check("/dev/kmsg") is not None
    assert check("/dev/null") is None
    assert host_check({"tenant": frozenset({"block"})}, "tenant")(disk) is None
    assert host_check({"*": frozenset({"block"})}, "tenant")(disk) is None
