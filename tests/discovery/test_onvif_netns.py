"""The multicast probe end to end, in network namespaces this test creates: no packet can reach
a real network.

    ns C (client)          ns D (default side)        ns R (second NIC only)
    c1 10.231.1.1 ------- d1 10.231.1.2                 (default route of C via d1)
    c2 10.231.2.1 -------------------------------- r2 10.231.2.2

A real WS-Discovery responder (the `WSDiscovery` package from PyPI, not written here) publishes
a NetworkVideoTransmitter in D and another in R; R also serves the ONVIF device service (the
test server from test_onvif_device.py). The client side runs the project's code inside C in a
subprocess (`python -m tests.discovery.test_onvif_netns ...`), so the probe enumerates C's
interfaces exactly as it would on a node.

The control case proves the test can fail: a probe from a single default socket (what upstream
and most ONVIF clients do) only hears D. An attacker in D that sprays unsolicited ProbeMatches
at the Probe's source (issue 21 item 3) gets neither a query nor the credentials.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

REPO = Path(__file__).resolve().parents[2]
CAMERA_D = "11111111-1111-4111-8111-111111111111"
CAMERA_R = "22222222-2222-4222-8222-222222222222"


@attrs.frozen
class Namespaces:
    client: str
    default_side: str
    other_side: str


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


def _in(ns: str, *args: str) -> None:
    _run("ip", "netns", "exec", ns, *args)


@pytest.fixture
def netns() -> Iterator[Namespaces]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    ns = Namespaces(f"akoc{tag}", f"akod{tag}", f"akor{tag}")
    created: list[str] = []
    try:
        for name in (ns.client, ns.default_side, ns.other_side):
            _run("ip", "netns", "add", name)
            created.append(name)
        _run("ip", "link", "add", "c1", "netns", ns.client, "type", "veth",
             "peer", "name", "d1", "netns", ns.default_side)  # fmt: skip
        _run("ip", "link", "add", "c2", "netns", ns.client, "type", "veth",
             "peer", "name", "r2", "netns", ns.other_side)  # fmt: skip
        for name, dev, addr in (
            (ns.client, "c1", "10.231.1.1/24"),
            (ns.client, "c2", "10.231.2.1/24"),
            (ns.default_side, "d1", "10.231.1.2/24"),
            (ns.other_side, "r2", "10.231.2.2/24"),
        ):
            _in(name, "ip", "addr", "add", addr, "dev", dev)
            _in(name, "ip", "link", "set", dev, "up")
            _in(name, "ip", "link", "set", "lo", "up")
        _in(ns.client, "ip", "route", "add", "default", "via", "10.231.1.2")
        # The responders send Hello and listen on the group: give them a multicast route.
        _in(ns.default_side, "ip", "route", "add", "224.0.0.0/4", "dev", "d1")
        _in(ns.other_side, "ip", "route", "add", "224.0.0.0/4", "dev", "r2")
    except subprocess.CalledProcessError as exc:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        pytest.skip(f"cannot build network namespaces here: {exc.stderr.decode().strip()}")
    try:
        yield ns
    finally:
        for name in created:  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


async def _responder(
    nursery: trio.Nursery, ns: str, uuid: str, ip: str, scope: str, serve_device: bool
) -> trio.Process:
    """Start a responder in `ns` and wait for it to say it is ready."""
    return await _start(nursery, ns, "responder", uuid, ip, scope, "1" if serve_device else "0")


async def _start(nursery: trio.Nursery, ns: str, *command: str) -> trio.Process:
    """Start one of this module's entry points in `ns`; wait for it to say it is ready."""
    args = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.discovery.test_onvif_netns",
            *command]  # fmt: skip
    run = functools.partial(
        trio.run_process, args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO,
        check=False,
    )  # fmt: skip
    proc: trio.Process = await nursery.start(run)
    assert proc.stdout is not None
    with trio.fail_after(20):
        line = b""
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            assert chunk, "responder exited before it was ready"
            line += chunk
    assert line.strip() == b"ready"
    return proc


async def _client(ns: str, *args: str) -> object:
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.discovery.test_onvif_netns",
           *args]  # fmt: skip
    with trio.fail_after(60):
        done = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, cwd=REPO)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


async def _with_responders(ns: Namespaces, *client_args: str) -> object:
    async with trio.open_nursery() as nursery:
        procs = [
            await _responder(nursery, ns.default_side, CAMERA_D, "10.231.1.2",
                             "onvif://www.onvif.org/location/default-side", False),
            await _responder(nursery, ns.other_side, CAMERA_R, "10.231.2.2",
                             "onvif://www.onvif.org/location/second-nic", True),
        ]  # fmt: skip
        try:
            return await _client(ns.client, *client_args)
        finally:
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.aclose()  # EOF: the responder says Bye and exits
            with trio.move_on_after(10):
                for proc in procs:
                    await proc.wait()
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()


async def test_probe_reaches_every_interface(netns: Namespaces) -> None:
    found = await _with_responders(netns, "probe", "2")
    assert isinstance(found, dict)
    assert sorted(found["uuids"]) == [CAMERA_D, CAMERA_R]
    # the reply from R came in on c2's socket: the non-default interface
    assert ["10.231.2.2", "10.231.2.1"] in found["senders"]
    assert ["10.231.1.2", "10.231.1.1"] in found["senders"]


async def test_default_route_only_probe_misses_the_second_nic(netns: Namespaces) -> None:
    """The control: upstream's way (one socket, kernel's choice of interface) hears D only."""
    found = await _with_responders(netns, "probe-default-route", "2")
    assert isinstance(found, dict)
    assert found["uuids"] == [CAMERA_D]


async def test_handler_end_to_end(netns: Namespaces) -> None:
    """The whole handler in C: probe on all NICs, device service on R's camera; D's camera has
    no device service and is dropped (upstream's GetSystemDateAndTime rule)."""
    devices = await _with_responders(netns, "handler", "discoveryTimeoutSeconds: 2")
    url = "http://10.231.2.2:8080/onvif/device_service"
    assert devices == [
        {
            "id": f"{url}-{CAMERA_R}",
            "properties": {
                "ONVIF_DEVICE_SERVICE_URL": url,
                "ONVIF_DEVICE_UUID": CAMERA_R,
                "ONVIF_DEVICE_IP_ADDRESS": "10.231.2.2",
                "ONVIF_DEVICE_MAC_ADDRESS": "02:00:00:00:00:02",
            },
        }
    ]


async def test_sprayed_probe_matches_get_no_credentials(netns: Namespaces) -> None:
    """An attacker in D never reads our Probe's MessageID: it answers the Probe's source port
    with ProbeMatches that relate to nothing (or to a MessageID of its own), listing its own
    device service, and one with the right MessageID naming R's camera from D's address. The
    handler in C (with credentials) still finds R's camera only, and the attacker's device
    service never hears from it."""
    async with trio.open_nursery() as nursery:
        camera = await _responder(nursery, netns.other_side, CAMERA_R, "10.231.2.2",
                                  "onvif://www.onvif.org/location/second-nic", True)  # fmt: skip
        attacker = await _start(nursery, netns.default_side, "sprayer", "10.231.1.2")
        try:
            devices = await _client(
                netns.client, "handler", "discoveryTimeoutSeconds: 2", "admin:s3cret"
            )
        finally:
            for proc in (camera, attacker):
                assert proc.stdin is not None
                await proc.stdin.aclose()
        assert attacker.stdout is not None
        with trio.fail_after(20):
            report = b""
            while chunk := await attacker.stdout.receive_some():
                report += chunk
        with trio.move_on_after(10):
            await camera.wait()
        if camera.returncode is None:
            camera.kill()
    sprayed = json.loads(report.decode().strip().splitlines()[-1])
    assert sprayed["sprayed"] == 4  # it did answer our Probe
    assert sprayed["calls"] == []  # and nothing came to its device service
    assert isinstance(devices, list)
    assert [d["properties"]["ONVIF_DEVICE_UUID"] for d in devices] == [CAMERA_R]


# ---- subprocess entry points (run inside the namespaces) ----------------------------------------


async def _probe_all(window: float) -> dict[str, object]:
    from akri_trio.discovery.handlers.onvif_probe import (
        ProbeReplies,
        local_interfaces,
        multicast_addresses,
        new_message_id,
        probe_interfaces,
    )

    replies = ProbeReplies(new_message_id())
    with trio.move_on_after(window):
        await probe_interfaces(multicast_addresses(local_interfaces()), replies)
    return {
        "uuids": sorted(replies.matches),
        "senders": sorted(map(list, set(replies.senders))),
    }


async def _probe_default_route(window: float) -> dict[str, object]:
    import socket

    from akri_trio.discovery.handlers.onvif_probe import (
        MULTICAST_GROUP,
        WS_DISCOVERY_PORT,
        merge_matches,
        new_message_id,
        parse_probe_matches,
        probe_message,
    )

    matches = []
    with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        await sock.bind(("0.0.0.0", 0))
        await sock.sendto(probe_message(new_message_id()), (MULTICAST_GROUP, WS_DISCOVERY_PORT))
        with trio.move_on_after(window):
            while True:
                data, _ = await sock.recvfrom(65535)
                matches.extend(parse_probe_matches(data))
    return {"uuids": sorted(merge_matches(matches))}


async def _handler(details_text: str, credential: str = "") -> list[dict[str, object]]:
    from akri_trio.discovery.handlers.onvif import Onvif
    from akri_trio.discovery.interface import discover_changes
    from akri_trio.model.device import Device

    user, _, password = credential.partition(":")
    properties: dict[str, bytes | None] = {}
    if credential:
        properties = {"username_default": user.encode(), "password_default": password.encode()}
    handler = Onvif(poll_interval=3600)
    got: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        got.append(devices)
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        details = handler.parse_details(details_text)
        nursery.start_soon(discover_changes, handler, details, properties, send)
    return [{"id": d.id, "properties": d.properties} for d in got[0]]


async def _respond(uuid: str, ip: str, scope: str, serve_device: bool) -> None:
    from wsdiscovery import QName, Scope
    from wsdiscovery.publishing import ThreadedWSPublishing

    from tests.discovery.test_onvif_device import OnvifDeviceService

    nvt = QName("http://www.onvif.org/ver10/network/wsdl", "NetworkVideoTransmitter")
    camera = OnvifDeviceService(ip=ip, mac="02:00:00:00:00:02")
    async with trio.open_nursery() as nursery:
        if serve_device:
            await nursery.start(functools.partial(trio.serve_tcp, camera.handle, 8080, host=ip))
        publisher = ThreadedWSPublishing(uuid_=f"urn:uuid:{uuid}")
        publisher.start()
        try:
            xaddr = f"http://{ip}:8080/onvif/device_service"
            publisher.publishService(types=[nvt], scopes=[Scope(scope)], xAddrs=[xaddr])
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
        finally:
            publisher.stop()
            nursery.cancel_scope.cancel()


SPRAY = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"'
    ' xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing"'
    ' xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery">{header}'
    "<s:Body><d:ProbeMatches><d:ProbeMatch>"
    "<a:EndpointReference><a:Address>urn:uuid:{uuid}</a:Address></a:EndpointReference>"
    "<d:Types>dn:NetworkVideoTransmitter</d:Types><d:XAddrs>{xaddrs}</d:XAddrs>"
    "</d:ProbeMatch></d:ProbeMatches></s:Body></s:Envelope>"
)


async def _spray(ip: str) -> None:
    """The attacker: a device service of its own on `ip`:8080 (recording what reaches it),
    and on the WS-Discovery group, answering each Probe's source without reading it. At EOF
    on stdin it prints what it sprayed and the calls its device service got."""
    import socket
    import uuid as uuid_module

    from akri_trio.discovery.handlers.onvif_probe import MULTICAST_GROUP, WS_DISCOVERY_PORT
    from tests.discovery.test_onvif_device import OnvifDeviceService

    trap = OnvifDeviceService(ip=ip, credential=("admin", "s3cret"))
    trap_url = f"http://{ip}:8080/onvif/device_service"
    sprayed = 0
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await sock.bind(("0.0.0.0", WS_DISCOVERY_PORT))
    membership = socket.inet_aton(MULTICAST_GROUP) + socket.inet_aton(ip)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)

    async def answer_probes() -> None:
        nonlocal sprayed
        while True:
            _, prober = await sock.recvfrom(65535)
            fake = str(uuid_module.uuid4())
            for header, xaddrs in (
                ("", trap_url),
                (f"<a:RelatesTo>urn:uuid:{uuid_module.uuid4()}</a:RelatesTo>", trap_url),
                ("<a:RelatesTo>uuid:NetworkVideoTransmitter</a:RelatesTo>", trap_url),
                # a guess at the right MessageID is as good as none; XAddrs on R, sent from D
                ("", "http://10.231.2.2:8080/onvif/device_service"),
            ):
                datagram = SPRAY.format(header=header, uuid=fake, xaddrs=xaddrs)
                await sock.sendto(datagram.encode(), prober)
                sprayed += 1

    with sock:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(trio.serve_tcp, trap.handle, 8080, host=ip))
            nursery.start_soon(answer_probes)
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()
    print(json.dumps({"sprayed": sprayed, "calls": trap.calls}), flush=True)


def main(argv: list[str]) -> None:
    command, *rest = argv
    if command == "probe":
        print(json.dumps(trio.run(_probe_all, float(rest[0]))))
    elif command == "probe-default-route":
        print(json.dumps(trio.run(_probe_default_route, float(rest[0]))))
    elif command == "handler":
        details_text, credential = rest[0], rest[1] if len(rest) > 1 else ""
        print(json.dumps(trio.run(_handler, details_text, credential)))
    elif command == "sprayer":
        trio.run(_spray, rest[0])
    elif command == "responder":
        uuid, ip, scope, serve = rest
        trio.run(_respond, uuid, ip, scope, serve == "1")
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
