"""What a discovery handler may send (akri_trio.discovery.device_rules): bad devices are dropped
with a reason, the others go on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.device_rules import DeviceRules, check_devices, device_problems
from akri_trio.model.device import Device, DeviceSpec, Mount

RULES = DeviceRules(refused_host_dirs=("/var/lib/kubelet",))


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
            "mount host path '/var/lib' would give the container /var/lib/kubelet",
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
    assert device_problems(Device("d", mounts=(Mount("/m", "/var/lib/kubelet2"),)), RULES) == []


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
