"""The udev handler on this machine's real /sys and real netlink uevents (no mocks): scans
checked against what /sys itself says, event-driven discovery of a real loop device, a real
`change` uevent that must not cause a duplicate list, idling, cleanup, and the handler served
standalone over a real registration socket to the agent's discovery."""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import yaml

from akri_trio.agent.discovery_streams import (
    DiscoveryRequest,
    DiscoveryResult,
    run_configuration_discovery,
)
from akri_trio.discovery.handlers import BUILTIN, load_handler
from akri_trio.discovery.handlers.udev import UdevHandler, parse_details, scan, snapshots
from akri_trio.discovery.handlers.udev_devices import passthrough_of
from akri_trio.discovery.interface import discover_changes
from akri_trio.discovery.registration import serve_registration
from akri_trio.discovery.registry import Registry
from akri_trio.discovery.standalone import run_standalone
from akri_trio.model.device import Device, DeviceSpec
from akri_trio.runtime import Backoff
from tests.support.polling import until_state

SYS = Path("/sys")
NULL = "/devices/virtual/mem/null"
FACTORY = "akri_trio.discovery.handlers.udev:UdevHandler.from_env"


def details(*rules: str, extra: str = "") -> str:
    quoted = ", ".join("'" + r.replace("'", "''") + "'" for r in rules)
    return f"udevRules: [{quoted}]\n{extra}"


def ids(text: str) -> list[str]:
    return [d.id for d in scan(parse_details(text))]


def class_devpaths(cls: str, name_glob: str = "*") -> list[str]:
    """What /sys/class says, independently of libudev: the devpaths of a class's members."""
    return sorted(
        "/" + os.path.relpath(os.path.realpath(entry), SYS)
        for entry in (SYS / "class" / cls).iterdir()
        if fnmatch.fnmatchcase(entry.name, name_glob)
    )


# ---- scans of the real /sys ---------------------------------------------------------------------


def test_kernel_null_is_exactly_dev_null() -> None:
    devices = scan(parse_details(details('KERNEL=="null"', extra="permissions: rw")))
    assert devices == [
        Device(
            NULL,
            {"UDEV_DEVPATH": NULL, "UDEV_DEVNODE": "/dev/null"},
            device_specs=(DeviceSpec("/dev/null", "/dev/null", "rw"),),
        )
    ]


def test_subsystem_mem_finds_the_mem_class() -> None:
    found = ids(details('SUBSYSTEM=="mem"'))
    assert found == class_devpaths("mem")
    assert NULL in found and "/devices/virtual/mem/zero" in found


def test_tty_glob() -> None:
    found = ids(details('SUBSYSTEM=="tty", KERNEL=="tty[0-9]*"'))
    assert found == class_devpaths("tty", "tty[0-9]*")
    assert found  # tty0.. exist on any Linux with virtual consoles
    devices = scan(parse_details(details('SUBSYSTEM=="tty", KERNEL=="tty[0-9]*"')))
    assert all(d.properties["UDEV_DEVNODE"] == "/dev/" + d.id.rsplit("/", 1)[1] for d in devices)


def test_inequalities() -> None:
    mem = class_devpaths("mem")
    without = [p for p in mem if not p.endswith(("/null", "/zero"))]
    assert ids(details('SUBSYSTEM=="mem", KERNEL!="null|zero"')) == without  # regex
    assert ids(details('SUBSYSTEM=="mem", ATTR{dev}!="1:3"')) == [p for p in mem if p != NULL]
    assert ids(details('SUBSYSTEM=="mem", SUBSYSTEM!="m?m"')) == []  # glob nomatch
    assert ids(details('KERNEL=="null", DRIVER!=".*"')) == [NULL]  # no driver: != passes


def test_attributes_read_from_sysfs() -> None:
    expected = [
        p
        for p in class_devpaths("mem")
        if (SYS / p[1:] / "dev").read_text().strip() in ("1:3", "1:5")
    ]
    assert expected == [NULL, "/devices/virtual/mem/zero"]
    assert ids(details('SUBSYSTEM=="mem", ATTR{dev}=="1:[35]"')) == expected


def test_env_from_the_kernels_uevent() -> None:
    # Without /run/udev only the kernel's uevent variables exist; DEVMODE is one of them.
    expected = [
        p for p in class_devpaths("mem") if "DEVMODE=0666" in (SYS / p[1:] / "uevent").read_text()
    ]
    assert expected
    assert ids(details('SUBSYSTEM=="mem", ENV{DEVMODE}=="0666"')) == expected


def real_parent_child() -> tuple[str, str, str]:
    """A non-virtual block device and its nearest ancestor with a driver, from /sys itself:
    (disk devpath, ancestor devpath, the ancestor's driver)."""
    for entry in sorted((SYS / "class" / "block").iterdir()):
        path = Path(os.path.realpath(entry))
        if "/virtual/" in str(path) or (path / "partition").exists():
            continue
        for ancestor in path.parents:
            if (ancestor / "driver").exists():
                devpath = "/" + os.path.relpath(path, SYS)
                return (
                    devpath,
                    "/" + os.path.relpath(ancestor, SYS),
                    (ancestor / "driver").resolve().name,
                )
    pytest.skip("no block device with a driver-bound ancestor on this machine")


def test_grouping_over_a_real_parent_and_child() -> None:
    disk, parent, driver = real_parent_child()  # here: vda under virtio1 (virtio_blk)
    disk_node = "/dev/" + disk.rsplit("/", 1)[1]
    partitions = sorted(
        "/dev/" + p.name for p in (SYS / disk[1:]).iterdir() if (p / "partition").exists()
    )
    rule = f'DRIVERS=="{driver}"'  # the driver's device and everything below it
    flat = scan(parse_details(details(rule)))
    assert parent in [d.id for d in flat] and disk in [d.id for d in flat]
    grouped = scan(parse_details(details(rule, extra="groupRecursive: true")))
    top = [d for d in grouped if d.id == parent]
    assert len(top) == 1 and not any(d.id.startswith(parent + "/") for d in grouped)
    nodes = [s.host_path for s in top[0].device_specs]
    assert nodes == [disk_node, *partitions]
    assert top[0].properties == {
        "UDEV_DEVPATH": parent,
        **{f"UDEV_DEVNODE_{i}": n for i, n in enumerate(nodes)},
    }


def test_snapshots_carry_parents() -> None:
    disk, parent, driver = real_parent_child()
    by_path = {s.devpath: s for s in snapshots()}
    lineage = [d.devpath for d in by_path[disk].lineage()]
    assert parent in lineage and lineage[0] == disk
    assert any(d.driver == driver for d in by_path[disk].lineage())


# ---- events -------------------------------------------------------------------------------------


def netlink_fds() -> int:
    inodes = {line.split()[-1] for line in Path("/proc/net/netlink").read_text().splitlines()[1:]}
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            count += 1
    return count


async def test_a_real_change_uevent_rescans_but_sends_nothing_new() -> None:
    handler = UdevHandler(source="kernel", rescan_interval=3600, debounce=0.05)
    sent: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    before = netlink_fds()
    async with trio.open_nursery() as nursery:
        # The handler itself (not discover_changes) must not repeat an unchanged list.
        nursery.start_soon(handler.discover, parse_details(details('KERNEL=="null"')), {}, send)
        await until_state(lambda: len(sent) == 1 and handler.stats.monitor == "kernel")
        assert netlink_fds() == before + 1
        scans = handler.stats.scans
        (SYS / NULL[1:] / "uevent").write_text("change")
        await until_state(lambda: handler.stats.last_uevent == ("change", NULL))
        await until_state(lambda: handler.stats.scans > scans)  # it re-enumerated...
        await trio.sleep(0.2)
        assert len(sent) == 1  # ...and found nothing new to say
        nursery.cancel_scope.cancel()
    assert handler.stats.monitor is None
    assert netlink_fds() == before  # the monitor's socket is closed


@pytest.mark.skipif(shutil.which("losetup") is None or os.geteuid() != 0, reason="needs losetup")
async def test_a_loop_device_appears_and_goes_by_events_alone(tmp_path: Path) -> None:
    """Attaching a file to a loop device (a real kernel `change` uevent with a new sysfs
    attribute) makes it match; detaching makes it go. With a one-hour rescan interval only
    the monitor can have noticed."""
    image = tmp_path / "akri-udev.img"
    image.write_bytes(b"\0" * 65536)
    handler = UdevHandler(source="kernel", rescan_interval=3600, debounce=0.05)
    text = details(f'SUBSYSTEM=="block", KERNEL=="loop*", ATTR{{loop/backing_file}}=="{image}"')
    send_lists, receive_lists = trio.open_memory_channel[list[Device]](math.inf)
    loop_dev = ""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(discover_changes, handler, parse_details(text), {}, send_lists.send)
        with trio.fail_after(10):
            assert await receive_lists.receive() == []
            await until_state(lambda: handler.stats.monitor == "kernel")
            try:
                attached = await trio.run_process(
                    ["losetup", "-f", "--show", str(image)], capture_stdout=True
                )
                loop_dev = attached.stdout.decode().strip()
                found = await receive_lists.receive()
                assert [d.properties["UDEV_DEVNODE"] for d in found] == [loop_dev]
                assert found[0].id == f"/devices/virtual/block/{loop_dev.removeprefix('/dev/')}"
            finally:
                if loop_dev:
                    await trio.run_process(["losetup", "-d", loop_dev])
            assert await receive_lists.receive() == []
        nursery.cancel_scope.cancel()


async def test_idles_without_cpu_when_nothing_changes() -> None:
    handler = UdevHandler(source="kernel", rescan_interval=3600)
    sent: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler.discover, parse_details(details('SUBSYSTEM=="mem"')), {}, send)
        await until_state(lambda: len(sent) == 1)
        cpu = time.process_time()
        await trio.sleep(1.0)
        used = time.process_time() - cpu
        nursery.cancel_scope.cancel()
    assert used < 0.05, f"{used:.3f} s of CPU in 1 s of idling"
    assert handler.stats.scans == 1


async def test_periodic_rescan_without_a_monitor() -> None:
    # A real clock: the scans run in a worker thread, which an autojump clock jumps past. The
    # bound is generous (a loaded machine); the spacing says the interval is kept.
    handler = UdevHandler(source="none", rescan_interval=0.2)
    sent: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler.discover, parse_details(details('KERNEL=="null"')), {}, send)
        start = trio.current_time()
        await until_state(lambda: handler.stats.scans >= 3, 20, "3 scans", poll=0.01)
        took = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert took >= 0.4  # scans at t = 0, 0.2, 0.4: never faster than the interval
    assert handler.stats.monitor is None
    assert len(sent) == 1  # nothing changed: one list


# ---- passthrough: this machine's own PCI devices (virtio disks and NICs) ------------------------


def pci_devices() -> dict[str, str | None]:
    """What /sys/bus/pci says, independently of libudev: devpath -> IOMMU group (None: none)."""
    found: dict[str, str | None] = {}
    for entry in (SYS / "bus" / "pci" / "devices").iterdir():
        path = Path(os.path.realpath(entry))
        group = path / "iommu_group"
        found["/" + os.path.relpath(path, SYS)] = group.resolve().name if group.exists() else None
    return found


async def test_pci_passthrough_on_the_real_pci_bus(caplog: pytest.LogCaptureFixture) -> None:
    expected = pci_devices()
    if not expected:
        pytest.skip("no PCI bus on this machine")
    props = {"devicePluginResourceName": b"example.com/vm-nic", "vfioPassthrough": b"true"}
    handler = UdevHandler(source="none", rescan_interval=3600)
    sent: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    async with trio.open_nursery() as nursery:
        rules = parse_details(details('SUBSYSTEM=="pci"'))
        nursery.start_soon(handler.discover, rules, props, send)
        await until_state(lambda: len(sent) == 1)
        nursery.cancel_scope.cancel()
    (devices,) = sent
    assert sorted(d.id for d in devices) == sorted(expected)
    for device in devices:
        assert device.properties["PCI_RESOURCE_EXAMPLE_COM_VM-NIC"] == device.id.rsplit("/")[-1]
        group = expected[device.id]
        vfio = [
            DeviceSpec(f"/dev/vfio/{group}", f"/dev/vfio/{group}", "rwm"),
            DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rwm"),
        ]
        assert [s for s in device.device_specs if s.host_path.startswith("/dev/vfio/")] == (
            vfio if group is not None else []
        )
    # A device without an IOMMU group (every one on a VM without a virtual IOMMU) is reported,
    # and said so once, not failed.
    ungrouped = sorted(path for path, group in expected.items() if group is None)
    warned = sorted(
        r.getMessage().split()[3] for r in caplog.records if "has no IOMMU group" in r.getMessage()
    )
    assert warned == ungrouped


def test_a_pci_child_device_reports_its_pci_address_without_vfio() -> None:
    """The root disk (a block device below a virtio PCI function): upstream reads the IOMMU
    group of the matched device itself, which a block device never has."""
    disk, _, _ = real_parent_child()
    props = {"devicePluginResourceName": b"akri.sh/disk", "vfioPassthrough": b"true"}
    name = disk.rsplit("/", 1)[1]
    (device,) = scan(parse_details(details(f'KERNEL=="{name}"')), passthrough_of(props))
    pci = next(p for p in reversed(disk.split("/")) if p.count(":") == 2 and "." in p)
    assert device.properties["PCI_RESOURCE_AKRI_SH_DISK"] == pci
    assert [s.host_path for s in device.device_specs] == [f"/dev/{name}"]


# ---- served standalone --------------------------------------------------------------------------


def test_builtin_factory_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the lead adds to BUILTIN; load_handler must build our handler from it.
    monkeypatch.setitem(BUILTIN, "udev", FACTORY)
    handler = load_handler("udev", {"UDEV_MONITOR_SOURCE": "none"})
    assert isinstance(handler, UdevHandler)
    assert (handler.name, handler.shared, handler.source) == ("udev", False, "none")


async def test_standalone_over_a_real_registration_socket(sock_dir: Path) -> None:
    registry = Registry(trio.current_time)
    fast = Backoff(base=0.02, cap=0.1)

    async def configuration(key: str, text: str) -> DiscoveryResult:
        """Run one Configuration's discovery until it yields devices or a rejection."""
        results_send, results = trio.open_memory_channel[DiscoveryResult](math.inf)
        request = DiscoveryRequest(key=key, handler="udev", details=text)
        nursery.start_soon(
            functools.partial(
                run_configuration_discovery, registry, request, results_send.send, backoff=fast
            )
        )
        while True:
            result = await results.receive()
            if result.devices or "rejected" in "".join(result.problems):
                return result

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_registration, registry, sock_dir / "agent-registration.sock")
            endpoint = await nursery.start(
                functools.partial(
                    run_standalone,
                    UdevHandler(source="kernel"),
                    registration_socket=sock_dir / "agent-registration.sock",
                    socket_path=sock_dir / "udev.sock",
                    backoff=fast,
                    watch_interval=0.05,
                )
            )
            result = await configuration(
                "default/udev-null", details('KERNEL=="null"', extra="permissions: r")
            )
            (found,) = result.devices
            assert found.endpoint == endpoint == str(sock_dir / "udev.sock")
            assert found.shared is False
            assert found.device == Device(
                NULL,
                {"UDEV_DEVPATH": NULL, "UDEV_DEVNODE": "/dev/null"},
                device_specs=(DeviceSpec("/dev/null", "/dev/null", "r"),),
            )
            bad = await configuration("default/udev-bad", details('KERNEL=="null", RUN+="x"'))
            assert bad.devices == ()
            assert bad.problems == (
                f"discovery handler 'udev' at {endpoint} rejected discoveryDetails: "
                'discoveryDetails.udevRules[0]: token 2 `RUN+="x"`: RUN is a udev key that '
                "discovery does not support (supported: ATTR, ATTRS, DEVPATH, DRIVER, DRIVERS, "
                "ENV, KERNEL, KERNELS, SUBSYSTEM, SUBSYSTEMS, TAG, TAGS)",
            )
            nursery.cancel_scope.cancel()
    assert not (sock_dir / "udev.sock").exists()


def test_example_configurations_parse_and_the_demo_finds_dev_null() -> None:
    text = (Path(__file__).resolve().parents[2] / "k8s" / "examples" / "udev.yaml").read_text()
    demo = yaml.safe_load(text)
    assert demo["spec"]["discoveryHandler"]["name"] == "udev"
    devices = scan(parse_details(demo["spec"]["discoveryHandler"]["discoveryDetails"]))
    assert [(d.id, d.device_specs) for d in devices] == [
        (NULL, (DeviceSpec("/dev/null", "/dev/null", "rw"),))
    ]
    # The commented-out camera sample is valid too (with its optional lines enabled).
    lines = [line for line in text.splitlines() if line.startswith("# ")]
    camera = "\n".join(line[2:] for line in lines[lines.index("# apiVersion: akri.sh/v0") :])
    camera = camera.replace("# - 'SUBSYSTEM", "- 'SUBSYSTEM").replace(
        "# groupRecursive", "groupRecursive"
    )
    sample = yaml.safe_load(camera.split("\nA demo")[0])
    details_ = parse_details(sample["spec"]["discoveryHandler"]["discoveryDetails"])
    assert (len(details_.rules), details_.group_recursive) == (2, True)


# ---- hostile device data (issue 8, item 13) -----------------------------------------------------

_SCAN_NET = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from akri_trio.discovery.handlers.udev import parse_details, scan
print(json.dumps([d.id for d in scan(parse_details('udevRules: [SUBSYSTEM=="net"]'))]))
"""


def test_a_device_with_a_non_utf8_name_is_skipped_not_the_scan() -> None:
    # A network namespace of our own, with a veth pair named b"akri\xffbad" / "akgood": any
    # bytes but '/', ':' and whitespace make a valid netdev name. `ip netns exec` mounts the
    # namespace's own sysfs, so the scan sees exactly these (and lo), and no traffic flows.
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create a network namespace")
    ns = f"akudev{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    try:
        subprocess.run(
            [b"ip", b"-n", ns.encode(), b"link", b"add", b"name", b"akri\xffbad", b"type",
             b"veth", b"peer", b"name", b"akgood"],
            check=True, capture_output=True,
        )  # fmt: skip
        done = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", _SCAN_NET],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["/devices/virtual/net/akgood", "/devices/virtual/net/lo"]
    assert "skipping a device whose data is not UTF-8" in done.stderr
    assert "akri\\xffbad" in done.stderr
