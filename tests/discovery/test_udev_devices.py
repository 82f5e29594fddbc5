"""From matched devices to Devices, pure: devnodes from ancestors (#521), grouping (#490), ids,
properties and DeviceSpecs; plus discoveryDetails parsing and every error it reports."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.handlers.udev import UdevDetails, UdevHandler, devices_for, parse_details
from akri_trio.discovery.handlers.udev_devices import (
    VFIO_CONTAINER,
    Match,
    Passthrough,
    build_devices,
    group,
    is_below,
    missing_iommu_groups,
    passthrough_of,
    pci_address,
    resolve,
    resource_variable,
    usb_address,
)
from akri_trio.discovery.handlers.udev_rules import DeviceSnapshot, parse_rule
from akri_trio.discovery.interface import InvalidDetails
from akri_trio.model.device import Device, DeviceSpec

USB = DeviceSnapshot("/devices/usb1/1-1", "1-1", subsystem="usb", devnode="/dev/bus/usb/001/002")
IFACE = DeviceSnapshot("/devices/usb1/1-1/1-1:1.0", "1-1:1.0", subsystem="usb", parent=USB)
VIDEO0 = DeviceSnapshot(
    "/devices/usb1/1-1/1-1:1.0/video4linux/video0",
    "video0",
    subsystem="video4linux",
    devnode="/dev/video0",
    parent=IFACE,
)
VIDEO1 = DeviceSnapshot(
    "/devices/usb1/1-1/1-1:1.0/video4linux/video1",
    "video1",
    subsystem="video4linux",
    devnode="/dev/video1",
    parent=IFACE,
)
# A sibling whose devpath merely starts with the same characters (upstream: a "child").
USB11 = DeviceSnapshot(
    "/devices/usb1/1-11", "1-11", subsystem="usb", devnode="/dev/bus/usb/001/003"
)
ORPHAN = DeviceSnapshot("/devices/platform/foo", "foo", subsystem="platform")


def test_devnode_from_nearest_ancestor_that_has_one() -> None:  # upstream #521
    assert resolve(VIDEO0) == Match(VIDEO0.devpath, "/dev/video0")
    assert resolve(IFACE) == Match(IFACE.devpath, "/dev/bus/usb/001/002")
    assert resolve(ORPHAN) == Match(ORPHAN.devpath, None)


def test_one_device_per_match_with_its_devnode() -> None:
    devices = build_devices(
        [VIDEO1, VIDEO0, IFACE, ORPHAN], group_recursive=False, permissions="rw"
    )
    assert devices == [
        Device(
            ORPHAN.devpath, {"UDEV_DEVPATH": ORPHAN.devpath}
        ),  # no devnode anywhere: no DeviceSpec
        Device(
            IFACE.devpath,
            {"UDEV_DEVPATH": IFACE.devpath, "UDEV_DEVNODE": "/dev/bus/usb/001/002"},
            device_specs=(DeviceSpec("/dev/bus/usb/001/002", "/dev/bus/usb/001/002", "rw"),),
        ),
        Device(
            VIDEO0.devpath,
            {"UDEV_DEVPATH": VIDEO0.devpath, "UDEV_DEVNODE": "/dev/video0"},
            device_specs=(DeviceSpec("/dev/video0", "/dev/video0", "rw"),),
        ),
        Device(
            VIDEO1.devpath,
            {"UDEV_DEVPATH": VIDEO1.devpath, "UDEV_DEVNODE": "/dev/video1"},
            device_specs=(DeviceSpec("/dev/video1", "/dev/video1", "rw"),),
        ),
    ]


def test_grouping_gathers_every_devnode_under_the_topmost_match() -> None:  # upstream #490
    devices = build_devices(
        [VIDEO1, USB11, VIDEO0, IFACE, USB], group_recursive=True, permissions="rwm"
    )
    assert devices == [
        Device(
            USB.devpath,
            {
                "UDEV_DEVPATH": USB.devpath,
                "UDEV_DEVNODE_0": "/dev/bus/usb/001/002",  # USB's own, and IFACE's (deduped)
                "UDEV_DEVNODE_1": "/dev/video0",
                "UDEV_DEVNODE_2": "/dev/video1",
            },
            device_specs=tuple(
                DeviceSpec(n, n, "rwm")
                for n in ("/dev/bus/usb/001/002", "/dev/video0", "/dev/video1")
            ),
        ),
        Device(  # /devices/usb1/1-11 is no child of /devices/usb1/1-1
            USB11.devpath,
            {"UDEV_DEVPATH": USB11.devpath, "UDEV_DEVNODE_0": "/dev/bus/usb/001/003"},
            device_specs=(DeviceSpec("/dev/bus/usb/001/003", "/dev/bus/usb/001/003", "rwm"),),
        ),
    ]


def test_grouping_without_the_top_device_groups_under_the_next_match() -> None:
    devices = build_devices([VIDEO0, IFACE, VIDEO1], group_recursive=True, permissions="r")
    assert [d.id for d in devices] == [IFACE.devpath]
    assert devices[0].properties == {
        "UDEV_DEVPATH": IFACE.devpath,
        "UDEV_DEVNODE_0": "/dev/bus/usb/001/002",  # #521: from USB, which itself did not match
        "UDEV_DEVNODE_1": "/dev/video0",
        "UDEV_DEVNODE_2": "/dev/video1",
    }


def test_is_below_uses_path_components() -> None:
    assert is_below("/devices/a/b", "/devices/a")
    assert not is_below("/devices/ab", "/devices/a")
    assert not is_below("/devices/a", "/devices/a")


segments = st.lists(st.sampled_from(["a", "b", "a-b", "ab"]), min_size=1, max_size=4)
match_lists = st.lists(
    st.builds(
        Match,
        segments.map(lambda s: "/" + "/".join(s)),
        st.none() | st.sampled_from(["/dev/x", "/dev/y", "/dev/z"]),
    ),
    max_size=12,
    unique_by=lambda m: m.devpath,
)


@given(match_lists)
def test_grouping_partitions_matches_under_topmost_ancestors(matches: list[Match]) -> None:
    groups = group(matches)
    members = [m for ms in groups.values() for m in ms]
    assert sorted(members) == sorted(matches)  # every match exactly once
    for top, ms in groups.items():
        assert ms[0].devpath == top  # the group's own device comes first
        assert all(m.devpath == top or is_below(m.devpath, top) for m in ms)
        assert not any(is_below(top, m.devpath) for m in matches)  # nothing above the top
    assert group(list(reversed(matches))) == groups  # input order does not matter


@given(match_lists, st.booleans())
def test_devices_are_consistent(matches: list[Match], grouped: bool) -> None:
    snapshots = [DeviceSnapshot(m.devpath, "x", devnode=m.devnode) for m in matches]
    devices = build_devices(snapshots, group_recursive=grouped, permissions="rw")
    assert [d.id for d in devices] == sorted({d.id for d in devices})
    for d in devices:
        assert d.properties["UDEV_DEVPATH"] == d.id
        nodes = [s.host_path for s in d.device_specs]
        assert len(nodes) == len(set(nodes))
        assert all(
            s.container_path == s.host_path and s.permissions == "rw" for s in d.device_specs
        )
        if grouped:
            assert [d.properties[f"UDEV_DEVNODE_{i}"] for i in range(len(nodes))] == nodes
            assert len(d.properties) == 1 + len(nodes)
        else:
            assert d.properties.get("UDEV_DEVNODE") == (nodes[0] if nodes else None)
    if not grouped:
        assert len(devices) == len(matches)


# ---- details ------------------------------------------------------------------------------------


def test_details_defaults_and_values() -> None:
    details = parse_details("udevRules: ['KERNEL==\"null\"']")
    assert details == UdevDetails((parse_rule('KERNEL=="null"'),), False, "rwm")
    details = parse_details(
        '{"udevRules": ["SUBSYSTEM==\\"mem\\""], "groupRecursive": true, "permissions": "r",'
        ' "other": 1}'
    )
    assert (details.group_recursive, details.permissions) == (True, "r")
    assert parse_details("udevRules: []").rules == ()  # as upstream: valid, finds nothing
    for perm in ("r", "w", "m", "rw", "rm", "rwm", "wm"):
        assert parse_details(f"udevRules: []\npermissions: {perm}").permissions == perm


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("", "udevRules", "discoveryDetails.udevRules: is required"),
        ("udevRules:", "udevRules", "discoveryDetails.udevRules: is required"),
        ("udevRules: x", "udevRules", "must be a list of strings, got a string"),
        ("udevRules: [1]", "udevRules[0]", "discoveryDetails.udevRules[0]: must be a string"),
        ("[1, 2]", None, "discoveryDetails: must be a mapping, got a list"),
        ("udevRules: [", None, "discoveryDetails: not valid YAML"),
        (
            'udevRules: [\'KERNEL=="a"\', \'KERNEL=="a", RUN+="/bin/x"\']',
            "udevRules[1]",
            'discoveryDetails.udevRules[1]: token 2 `RUN+="/bin/x"`: RUN is a udev key',
        ),
        (
            "udevRules: ['KERNEL=\"a\"']",
            "udevRules[0]",
            'token 1 `KERNEL="a"`: assignment `=` is not supported',
        ),
        ("udevRules: ['']", "udevRules[0]", "is empty (it would match every device)"),
        (
            "udevRules: []\ngroupRecursive: 'yes'",
            "groupRecursive",
            "discoveryDetails.groupRecursive: must be true or false, got 'yes'",
        ),
        ("udevRules: []\ngroupRecursive: 1", "groupRecursive", "got 1 (int)"),
        (
            "udevRules: []\npermissions: rwx",
            "permissions",
            "discoveryDetails.permissions: must be one of r, w, m, rw, rm, rwm, wm, got 'rwx'",
        ),
        ("udevRules: []\npermissions: mw", "permissions", "got 'mw'"),
        ("udevRules: []\npermissions: [r]", "permissions", "got ['r'] (list)"),
    ],
)
def test_details_errors(text: str, field: str | None, message: str) -> None:
    with pytest.raises(InvalidDetails) as info:
        parse_details(text)
    assert info.value.field == field
    assert message in str(info.value)


def test_handler_parse_details_and_env() -> None:
    handler = UdevHandler.from_env({})
    assert (handler.name, handler.shared, handler.source, handler.rescan_interval) == (
        "udev",
        False,
        "auto",
        30.0,
    )
    assert handler.parse_details("udevRules: []") == UdevDetails(())
    env = {"UDEV_MONITOR_SOURCE": "kernel", "UDEV_RESCAN_INTERVAL_SECONDS": "2.5"}
    handler = UdevHandler.from_env(env)
    assert (handler.source, handler.rescan_interval) == ("kernel", 2.5)
    with pytest.raises(ValueError, match="UDEV_MONITOR_SOURCE must be one of"):
        UdevHandler.from_env({"UDEV_MONITOR_SOURCE": "netlink"})
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(ValueError, match="UDEV_RESCAN_INTERVAL_SECONDS must be a positive"):
            UdevHandler.from_env({"UDEV_RESCAN_INTERVAL_SECONDS": bad})


def test_devices_for_unions_rules() -> None:
    details = parse_details(
        'udevRules: [\'KERNEL=="video0"\', \'KERNEL=="video*", SUBSYSTEM=="video4linux"\']'
    )
    ids = [d.id for d in devices_for(details, [USB, IFACE, VIDEO0, VIDEO1, ORPHAN])]
    assert ids == [VIDEO0.devpath, VIDEO1.devpath]  # video0 matched twice, reported once


# ---- passthrough: devicePluginResourceName and vfioPassthrough (upstream's semantics) ----------

GPU = DeviceSnapshot(
    "/devices/pci0000:00/0000:00:01.0/0000:01:00.0", "0000:01:00.0", subsystem="pci",
    iommu_group="7",
)  # fmt: skip
NIC = DeviceSnapshot("/devices/pci0000:00/0000:00:03.0", "0000:00:03.0", subsystem="pci")
GPU_VFIO = (
    DeviceSpec("/dev/vfio/7", "/dev/vfio/7", "rwm"),
    DeviceSpec(VFIO_CONTAINER, VFIO_CONTAINER, "rwm"),
)


def with_passthrough(
    *matched: DeviceSnapshot, grouped: bool = False, **props: bytes
) -> list[Device]:
    return build_devices(
        matched, group_recursive=grouped, permissions="rw", passthrough=passthrough_of(props)
    )


def test_passthrough_properties_read_as_upstream() -> None:
    assert passthrough_of({}) == Passthrough()
    assert passthrough_of(
        {"devicePluginResourceName": b" akri.sh/gpu \n", "vfioPassthrough": b" TRUE "}
    ) == Passthrough("akri.sh/gpu", vfio=True)
    assert passthrough_of({"devicePluginResourceName": None, "vfioPassthrough": b"yes"}) == (
        Passthrough()
    )


@pytest.mark.parametrize(
    ("name", "variable"),
    [
        ("akri.sh/udev-usb-keyboard", "USB_RESOURCE_AKRI_SH_UDEV-USB-KEYBOARD"),
        ("example.com/my-device", "USB_RESOURCE_EXAMPLE_COM_MY-DEVICE"),
        ("vendor.io/dévice", "USB_RESOURCE_VENDOR_IO_DéVICE"),  # ASCII only, as Rust's
    ],
)
def test_resource_variable_names(name: str, variable: str) -> None:
    assert resource_variable("USB_RESOURCE_", name) == variable


@pytest.mark.parametrize(
    ("node", "address"),
    [
        ("/dev/bus/usb/001/010", "1:10"),
        ("/dev/bus/usb/3/127", "3:127"),
        ("/dev/bus/usb/abc/def", None),
        ("/dev/bus/usb/", None),
        ("/dev/ttyUSB0", None),
        ("/dev/video0", None),
    ],
)
def test_usb_address_of_a_devnode(node: str, address: str | None) -> None:
    assert usb_address(node) == address


@pytest.mark.parametrize(
    ("devpath", "address"),
    [
        ("/devices/pci0000:00/0000:00:01.0/0000:01:00.0", "0000:01:00.0"),
        ("/devices/pci0000:00/0000:00:04.0/virtio1/block/vda", "0000:00:04.0"),
        ("/devices/pci0000:00/0000:00:14.0/usb1/1-1", None),  # below a USB bus
        ("/devices/virtual/mem/null", None),
        ("/devices/platform/serial8250/tty/ttyS0", None),
    ],
)
def test_pci_address_of_a_devpath(devpath: str, address: str | None) -> None:
    assert pci_address(devpath) == address


def test_usb_device_nodes_get_bus_and_device() -> None:
    (dev,) = with_passthrough(USB, devicePluginResourceName=b"akri.sh/udev-usb")
    assert dev.properties == {
        "UDEV_DEVPATH": USB.devpath,
        "UDEV_DEVNODE": "/dev/bus/usb/001/002",
        "USB_RESOURCE_AKRI_SH_UDEV-USB": "1:2",
    }
    (grouped,) = with_passthrough(
        USB, IFACE, VIDEO0, grouped=True, devicePluginResourceName=b"akri.sh/udev-usb"
    )
    assert grouped.properties["UDEV_DEVNODE_0"] == "/dev/bus/usb/001/002"
    assert grouped.properties["USB_RESOURCE_AKRI_SH_UDEV-USB_0"] == "1:2"
    assert "USB_RESOURCE_AKRI_SH_UDEV-USB_1" not in grouped.properties  # /dev/video0 is no USB node
    assert not any(k.startswith("PCI_RESOURCE") for k in grouped.properties)


def test_pci_devices_get_their_address_and_vfio_group() -> None:
    gpu, nic = with_passthrough(
        GPU, NIC, devicePluginResourceName=b"example.com/my-gpu", vfioPassthrough=b"true"
    )
    assert gpu.properties["PCI_RESOURCE_EXAMPLE_COM_MY-GPU"] == "0000:01:00.0"
    assert gpu.device_specs == GPU_VFIO
    # No IOMMU group: still reported, with its address, without /dev/vfio ...
    assert nic.properties["PCI_RESOURCE_EXAMPLE_COM_MY-GPU"] == "0000:00:03.0"
    assert nic.device_specs == ()
    # ... and named as such for the handler's log line.
    assert missing_iommu_groups([gpu, nic], Passthrough("example.com/my-gpu", vfio=True)) == [
        NIC.devpath
    ]


def test_no_vfio_without_passthrough_and_nothing_without_a_resource_name() -> None:
    (gpu,) = with_passthrough(GPU, devicePluginResourceName=b"x/gpu")
    assert gpu.device_specs == () and gpu.properties["PCI_RESOURCE_X_GPU"] == "0000:01:00.0"
    (plain,) = with_passthrough(GPU, vfioPassthrough=b"true")
    assert plain == Device(id=GPU.devpath, properties={"UDEV_DEVPATH": GPU.devpath})
    assert missing_iommu_groups([plain], Passthrough(None, vfio=True)) == []
