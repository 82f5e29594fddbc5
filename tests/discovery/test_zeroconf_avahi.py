"""zeroconf against Avahi, an independent mDNS implementation (Debian's avahi-daemon, no D-Bus,
a static service file), so the handler is not only tested against the library it is built on.

Avahi refuses interfaces without the MULTICAST flag, and we do not touch the host's interfaces:
the test creates its own network namespace, turns on multicast on that namespace's loopback,
runs avahi-daemon there, and runs the handler there too (in a subprocess under `ip netns exec`).
`ip netns exec` bind-mounts /etc/netns/<ns>/avahi over /etc/avahi, which is how the daemon gets
our config and service file. Needs root, `ip` and avahi-daemon; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("avahi-daemon"),
    reason="needs root, iproute2 and avahi-daemon (apt-get install avahi-daemon)",
)

AVAHI_CONF = """\
[server]
use-ipv4=yes
use-ipv6=no
enable-dbus=no
allow-interfaces=lo
[publish]
publish-hinfo=no
publish-workstation=no
"""

SERVICE = """\
<?xml version="1.0" standalone='no'?>
<!DOCTYPE service-group SYSTEM "avahi-service.dtd">
<service-group>
  <name>avahi-sensor</name>
  <service>
    <type>_akritest._tcp</type>
    <port>8555</port>
    <txt-record>model=AV1</txt-record>
    <txt-record>flag</txt-record>
  </service>
</service-group>
"""

HANDLER_SCRIPT = """
import json, sys, trio
from akri_trio.discovery.handlers.zeroconf_handler import Zeroconf, parse_details

async def main():
    handler = Zeroconf(interfaces=("127.0.0.1",), settle=0.5)
    found = []
    with trio.move_on_after(10) as scope:
        async def send(devices):
            if devices:
                found.extend(devices)
                scope.cancel()  # done: leave through discover's cleanup
        await handler.discover(parse_details(sys.argv[1]), {}, send)
    print(json.dumps([{"id": d.id, "properties": d.properties} for d in found]))

trio.run(main)
"""


async def ip(*args: str) -> None:
    await trio.run_process(["ip", *args], capture_stdout=True, capture_stderr=True)


@pytest.fixture
async def avahi_netns() -> AsyncIterator[str]:
    ns = f"akt-zc-{os.getpid()}"
    etc = Path("/etc/netns") / ns
    (etc / "avahi" / "services").mkdir(parents=True)
    (etc / "avahi" / "avahi-daemon.conf").write_text(AVAHI_CONF)
    (etc / "avahi" / "services" / "akri.service").write_text(SERVICE)
    daemon: trio.Process | None = None
    try:
        await ip("netns", "add", ns)
        await ip("-n", ns, "link", "set", "lo", "up")
        await ip("-n", ns, "link", "set", "lo", "multicast", "on")
        daemon = await trio.lowlevel.open_process(
            [
                *("ip", "netns", "exec", ns, "avahi-daemon", "--no-drop-root", "--no-chroot"),
                *("--no-rlimits", "--no-proc-title"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert daemon.stderr is not None
        seen = b""
        with trio.fail_after(10):
            while b"Server startup complete" not in seen:
                chunk = await daemon.stderr.receive_some()
                assert chunk, f"avahi-daemon exited: {seen.decode(errors='replace')}"
                seen += chunk
        yield ns
    finally:
        with trio.CancelScope(shield=True):
            if daemon is not None:
                daemon.terminate()
                await daemon.wait()
                if daemon.stderr is not None:
                    await daemon.stderr.aclose()
            await trio.run_process(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(etc, ignore_errors=True)


REPO = Path(__file__).resolve().parents[2]


async def test_avahi_announced_service_is_found(avahi_netns: str) -> None:
    repo = REPO
    result = await trio.run_process(
        [
            *("ip", "netns", "exec", avahi_netns, sys.executable, "-c", HANDLER_SCRIPT),
            "{kind: _akritest._tcp, txtRecords: {model: AV1, flag: null}}",
        ],
        capture_stdout=True,
        capture_stderr=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    devices = json.loads(result.stdout)
    assert [d["id"] for d in devices] == ["avahi-sensor._akritest._tcp.local."], result.stderr
    props = devices[0]["properties"]
    assert props["AKRI_ZEROCONF_DEVICE_NAME"] == "avahi-sensor"
    assert props["AKRI_ZEROCONF_DEVICE_PORT"] == "8555"
    assert props["AKRI_ZEROCONF_DEVICE_MODEL"] == "AV1"
    assert props["AKRI_ZEROCONF_DEVICE_FLAG"] == ""
    # avahi also publishes ::1 for lo; IPv4 comes first
    assert props["AKRI_ZEROCONF_DEVICE_ADDRESSES"].split(",")[0] == "127.0.0.1"
    assert props["AKRI_ZEROCONF_DEVICE_HOST"].endswith(".local")
