"""What a discovery handler may send (akri_trio.discovery.device_rules): bad devices are dropped
with a reason, the others go on."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.device_rules import (
    SHOWN_CHARS,
    DeviceRules,
    check_devices,
    device_bytes,
    device_problems,
)
from akri_trio.model.device import Device, DeviceSpec, Mount

RULES = DeviceRules(refused_host_dirs=("/var/lib/akri",), mount_dirs=("/srv",))
# Every mount allowed but what is refused: the refusals on their own.
ANY_MOUNT = DeviceRules(refused_host_dirs=("/var/lib/akri",), mount_dirs=("/",))


def test_a_well_formed_device_passes() -> None:
    device = Device(
        "/sys/devices/video0",
        {"UDEV_DEVNODE": "/dev/video0", "_x1": ""},
        mounts=(Mount("/data", "/srv/cam", read_only=True),),
        device_specs=(DeviceSpec("/dev/video0", "/dev/video0", "rw"), DeviceSpec("/dev/x", "")),
    )
    assert device_problems(device, RULES) == []


@pytest.mark.parametrize(
    ("device", "problem"),
    [
        (Device(""), "empty device id"),
        (Device("d", {"A-B": "x"}), "property name 'A-B' is not an environment variable name"),
        (Device("d", {"1A": "x"}), "property name '1A' is not an environment variable name"),
        (Device("d", {"A": "x\0y"}), "property 'A' holds a NUL character"),
        (
            Device("d", device_specs=(DeviceSpec("/dev/a", "/dev/a", "rwx"),)),
            "device permissions 'rwx' are not a subset of 'rwm'",
        ),
        (
            Device("d", device_specs=(DeviceSpec("/dev/a", "/dev/a", ""),)),
            "device permissions '' are not a subset of 'rwm'",
        ),
        (
            Device("d", device_specs=(DeviceSpec("/dev/a", "/dev/../etc/shadow"),)),
            "device host path '/dev/../etc/shadow' is not an absolute, normalised path",
        ),
        (
            Device("d", device_specs=(DeviceSpec("dev/a", "/dev/a"),)),
            "device container path 'dev/a' is not an absolute, normalised path",
        ),
        (
            Device("d", mounts=(Mount("/m", "/"),)),
            "mount host path '/' would give the container the node's whole filesystem",
        ),
        (
            Device("d", mounts=(Mount("/m", "//etc"),)),
            "mount host path '//etc' is not an absolute, normalised path",
        ),
        (
            Device("d", mounts=(Mount("/m", "/var/lib/kubelet/device-plugins"),)),
            "mount host path '/var/lib/kubelet/device-plugins' would give the container "
            "/var/lib/kubelet",
        ),
        (
            Device("d", mounts=(Mount("/m", "/var/lib"),)),
            "mount host path '/var/lib' would give the container /var/lib/containerd",
        ),
        (
            Device("d", mounts=(Mount("/m", "/home/cam"),)),
            "mount host path '/home/cam' is not inside a directory the agent lets handlers "
            "mount (--handler-mount-dir: /srv)",
        ),
        (
            Device("d", device_specs=(DeviceSpec("/dev/a", "/srv/a"),)),
            "device host path '/srv/a' is not inside /dev",
        ),
        (
            Device("d", device_specs=(DeviceSpec("/dev/a", "/dev"),)),
            "device host path '/dev' is not inside /dev",
        ),
        (
            Device("d", device_specs=(DeviceSpec("/dev/a", "/proc/1/root/dev/sda"),)),
            "device host path '/proc/1/root/dev/sda' would give the container /proc",
        ),
        (
            Device("d", mounts=(Mount("/m", "relative"),)),
            "mount host path 'relative' is not an absolute, normalised path",
        ),
        (
            Device("d", mounts=(Mount("/m/./x", "/srv"),)),
            "mount container path '/m/./x' is not an absolute, normalised path",
        ),
    ],
)
def test_each_rule_names_its_problem(device: Device, problem: str) -> None:
    assert device_problems(device, RULES) == [problem]
    kept, problems = check_devices([device, Device("good")], RULES)
    assert kept == [Device("good")]
    assert problems == [f"device {device.id!r} dropped: {problem}"]


def test_a_directory_that_only_shares_a_prefix_is_not_refused() -> None:
    mount = Device("d", mounts=(Mount("/m", "/var/lib/kubelet2"),))
    assert device_problems(mount, ANY_MOUNT) == []
    assert device_problems(Device("d", mounts=(Mount("/m", "/srv2"),)), RULES) != []


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ("/proc/1/root", "/proc"),  # the node's whole filesystem, past the "not /" rule
        ("/proc/self/root/var/lib/kubelet", "/proc"),
        ("/sys/fs/cgroup", "/sys"),
        ("/run/containerd/containerd.sock", "/run"),
        ("/var/run/docker.sock", "/var/run"),
        ("/var/run/cdi", "/var/run"),
        ("/etc/kubernetes", "/etc"),
        ("/etc", "/etc"),
        ("/boot", "/boot"),
        ("/root/.kube", "/root"),
        ("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs", "/var/lib/containerd"),
        ("/var/lib/kubelet/pods", "/var/lib/kubelet"),
        ("/var/lib/akri", "/var/lib/akri"),  # a path the agent was given (its handlers')
        ("/var/lib/akri/agent-registration.sock", "/var/lib/akri"),
        ("/var", "/var/run"),  # above a refused directory
    ],
)
def test_the_node_keys_are_refused_to_mounts_and_device_nodes(path: str, refused: str) -> None:
    """The reviewer's ways around a short blocklist: each is refused, as a mount (even when
    every directory may be mounted) and as a device node."""
    mount = Device("d", mounts=(Mount("/m", path),))
    assert device_problems(mount, ANY_MOUNT) == [
        f"mount host path {path!r} would give the container {refused}"
    ]
    node = Device("d", device_specs=(DeviceSpec("/dev/x", path),))
    assert device_problems(node, ANY_MOUNT) == [
        f"device host path {path!r} would give the container {refused}"
    ]


def test_device_nodes_inside_dev_and_mounts_inside_an_allowed_directory_pass() -> None:
    device = Device(
        "d",
        mounts=(Mount("/data", "/srv/cams/0"), Mount("/all", "/srv")),
        device_specs=(DeviceSpec("/dev/video0", "/dev/bus/usb/001/002"), DeviceSpec("/dev/x", "")),
    )
    assert device_problems(device, RULES) == []


def test_mounts_are_refused_unless_the_agent_allows_a_directory() -> None:
    (problem,) = device_problems(Device("d", mounts=(Mount("/m", "/srv/x"),)), DeviceRules())
    assert problem.endswith("(--handler-mount-dir: none)")


def test_a_device_with_thousands_of_problems_gets_one_short_line() -> None:
    """5,000 bad property names (each near the length cut) make one line naming three of
    them and how many more, not a 759 KB message."""
    names = {f"{i}-{'x' * 300}": "" for i in range(5000)}
    roomy = attrs.evolve(RULES, max_properties=5000, max_device_bytes=2_000_000)
    _, (line,) = check_devices([Device("cam", names)], roomy)
    assert line.startswith("device 'cam' dropped: property name '0-xxx")
    assert line.endswith("; and 4997 more")
    assert line.count("property name") == 3
    assert len(line) < 3 * (SHOWN_CHARS + 5) + 60


def test_duplicate_ids_are_reported_and_the_first_is_kept() -> None:
    first, second = Device("a", {"N": "1"}), Device("a", {"N": "2"})
    kept, problems = check_devices([first, Device("b"), second, Device("a")], RULES)
    assert kept == [first, Device("b")]
    assert problems == ["device id 'a' sent 3 times; only the first is considered"]


def test_a_repeat_of_a_dropped_device_is_not_used_either() -> None:
    kept, problems = check_devices([Device("a", {"-": ""}), Device("a")], RULES)
    assert kept == []
    assert len(problems) == 2


def test_the_list_is_cut_to_the_lowest_ids() -> None:
    rules = DeviceRules(max_devices=2)
    kept, problems = check_devices([Device("c"), Device("a"), Device("b")], rules)
    assert kept == [Device("a"), Device("b")]
    assert problems == [
        "3 devices sent; only the first 2 by id are used (the agent's --max-devices-per-handler)"
    ]


def test_a_long_id_is_cut_in_the_reason() -> None:
    _, (problem,) = check_devices([Device("x" * 5000, {"": ""})], RULES)
    assert len(problem) < 300 and "(5000 chars)" in problem


@given(
    st.lists(
        st.builds(
            Device,
            st.text(max_size=5),
            st.dictionaries(st.text(max_size=4), st.text(max_size=3), max_size=2),
            st.tuples(st.builds(Mount, st.text(max_size=6), st.text(max_size=6))),
        ),
        max_size=8,
    )
)
def test_what_is_kept_passes_every_rule_and_every_drop_has_a_reason(devices: list[Device]) -> None:
    kept, problems = check_devices(devices, RULES)
    assert all(device_problems(d, RULES) == [] for d in kept)
    assert len({d.id for d in kept}) == len(kept)
    dropped = {d.id for d in devices} - {d.id for d in kept}
    assert all(any(repr(i) in p for p in problems) for i in dropped)


# --- issue 21 item 7: a device's size is bounded ----------------------------------------------


def test_a_device_over_the_property_count_is_dropped_without_checking_each() -> None:
    rules = DeviceRules(max_properties=3)
    # Bad names past the count are not looked at: the count alone decides.
    device = Device("d", {f"-{i}": "v" for i in range(4)})
    assert device_problems(device, rules) == [
        "4 properties; at most 3 per device (the agent's --max-properties-per-device)"
    ]
    assert device_problems(Device("d", {f"P{i}": "v" for i in range(3)}), rules) == []


def test_a_device_over_the_byte_limit_is_dropped() -> None:
    rules = DeviceRules(max_device_bytes=20)
    # id 1 + name 1 + value 18 (two bytes a character) = 20: at the limit
    assert device_problems(Device("d", {"A": "é" * 9}), rules) == []
    assert device_problems(Device("d", {"A": "é" * 10}), rules) == [
        "22 bytes; at most 20 per device (the agent's --max-device-bytes)"
    ]
    with_paths = Device("d", device_specs=(DeviceSpec("/dev/video0", "/dev/video0"),))
    assert device_bytes(with_paths) == 1 + 2 * len("/dev/video0")


def test_a_200000_property_device_is_dropped_and_the_rest_go_on() -> None:
    huge = Device("huge", {f"P{i}": "x" * 100 for i in range(200_000)})
    kept, refused = check_devices([huge, Device("ok", {"A": "1"})], DeviceRules())
    assert [d.id for d in kept] == ["ok"]
    (line,) = refused
    assert line.startswith("device 'huge' dropped: 200000 properties; at most 256 per device")
    assert "bytes; at most 65536 per device (the agent's --max-device-bytes)" in line
