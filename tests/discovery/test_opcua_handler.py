"""opcua against real asyncua servers, each in its own process: one acting as the Local
Discovery Server (type DiscoveryServer, so FindServers on it lists itself too), others
registered with it through the real RegisterServer service. The handler's FindServers calls go
through a private asyncio bridge, which must stop cleanly at the end of every test."""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import trio

from akri_trio.discovery.aio_bridge import AioBridge
from akri_trio.discovery.filters import FilterList
from akri_trio.discovery.handlers import opcua as opcua_module
from akri_trio.discovery.handlers.opcua import (
    PROPERTY,
    AnswerTooLarge,
    Application,
    Opcua,
    OpcuaDetails,
    find_servers,
    parse_details,
)
from akri_trio.discovery.interface import discover_changes
from akri_trio.model.device import Device
from tests.support.opcua_server import endpoint, server_argv

# One label, as a container's hostname (a dotted name not allowed is never looked up).
UNRESOLVABLE = "akri-trio-test-no-such-host"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.frozen
class RunningServer:
    name: str
    port: int
    process: trio.Process

    @property
    def url(self) -> str:
        return endpoint(self.name, self.port)

    @property
    def base(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}/"


@asynccontextmanager
async def opcua_server(
    logs: Path,
    name: str,
    *,
    kind: str = "Server",
    register: str | None = None,
    advertise: str | None = None,
    port: int | None = None,
) -> AsyncIterator[RunningServer]:
    port = port or free_port()
    args = server_argv(name, port, kind=kind, register=register, advertise=advertise)
    async with await trio.open_file(logs / f"{name}.log", "wb") as err:
        proc = await trio.lowlevel.open_process(args, stdout=subprocess.PIPE, stderr=err.wrapped)
    try:
        assert proc.stdout is not None
        seen = b""
        with trio.fail_after(60):
            while b"READY" not in seen:
                chunk = await proc.stdout.receive_some()
                if not chunk:
                    raise AssertionError(f"{name} died: {(logs / f'{name}.log').read_text()}")
                seen += chunk
        yield RunningServer(name, port, proc)
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            if proc.stdout is not None:
                await proc.stdout.aclose()


async def kill(server: RunningServer) -> None:
    server.process.kill()
    await server.process.wait()


@pytest.fixture
def bridge() -> Iterator[AioBridge]:
    with AioBridge(name="test-opcua-bridge") as b:
        yield b
    assert not b.running  # the bridge thread stopped


def details(*urls: str, names: FilterList | None = None) -> OpcuaDetails:
    return OpcuaDetails(discovery_urls=urls, application_names=names)


async def test_lds_lists_registered_servers_filtered_and_rebuilt(
    tmp_path: Path, bridge: AioBridge
) -> None:
    handler = Opcua(bridge=bridge, poll_interval=0.5, probe_timeout=1.0)
    lds_port = free_port()
    lds_url = f"opc.tcp://127.0.0.1:{lds_port}/akri/lds/"
    d_port = free_port()
    async with (
        AsyncExitStack() as stack,
        opcua_server(tmp_path, "lds", kind="DiscoveryServer", port=lds_port),
        trio.open_nursery() as nursery,
    ):
        servers: dict[str, RunningServer] = {}

        async def start(name: str, kind: str = "Server", **kw: Any) -> None:
            server = opcua_server(tmp_path, name, kind=kind, register=lds_url, **kw)
            servers[name] = await stack.enter_async_context(server)

        async with trio.open_nursery() as starters:
            starters.start_soon(start, "a")
            starters.start_soon(start, "b")
            starters.start_soon(start, "c", "ClientAndServer")  # not a Server: no device
            # registered under a hostname nobody resolves (a container's, as in #624)
            advertised = f"opc.tcp://{UNRESOLVABLE}:{d_port}/akri/d/"
            starters.start_soon(partial(start, "d", port=d_port, advertise=advertised))
        a, b = servers["a"].url, servers["b"].url
        d = f"opc.tcp://127.0.0.1:{d_port}/akri/d/"

        # the LDS itself (a DiscoveryServer) and c are not devices
        assert sorted(await handler.discover_once(details(lds_url))) == sorted([a, b, d])
        include_a = FilterList(("a",), "Include")
        assert await handler.discover_once(details(lds_url, names=include_a)) == [a]
        exclude_a = FilterList(("a", "zzz"), "Exclude")
        excluded = await handler.discover_once(details(lds_url, names=exclude_a))
        assert sorted(excluded) == sorted([b, d])
        # a server's own URL works as a discovery URL; seen twice, it is one device
        both = await handler.discover_once(details(servers["a"].base, lds_url))
        assert sorted(both) == sorted([a, b, d])

        send, sent = trio.open_memory_channel[list[Device]](10)
        nursery.start_soon(discover_changes, handler, details(lds_url), {}, send.send)
        with trio.fail_after(10):
            first = await sent.receive()
        assert first == [Device(u, {PROPERTY: u}) for u in sorted([a, b, d])]

        killed_at = trio.current_time()
        await kill(servers["b"])
        with trio.fail_after(10):
            second = await sent.receive()
        assert [dev.id for dev in second] == sorted([a, d])
        # gone by the next poll (plus the time a poll takes)
        assert trio.current_time() - killed_at < handler.poll_interval + 2.0

        with trio.move_on_after(2.0):  # several polls, nothing changes: nothing is sent
            unexpected = await sent.receive()
            raise AssertionError(f"sent without a change: {unexpected}")

        # the LDS still lists b; upstream's behaviour (no server probe) would keep it
        upstream_like = Opcua(bridge=bridge, probe_servers=False, probe_timeout=1.0)
        assert sorted(await upstream_like.discover_once(details(lds_url))) == sorted([a, b, d])
        nursery.cancel_scope.cancel()


async def test_unreachable_and_silent_urls_are_skipped(tmp_path: Path, bridge: AioBridge) -> None:
    handler = Opcua(bridge=bridge, probe_timeout=1.0, request_timeout=1.0)
    refused = f"opc.tcp://127.0.0.1:{free_port()}/"

    # accepts TCP connections but never speaks OPC UA: FindServers must time out, not hang
    silent_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    silent_port = silent_listeners[0].socket.getsockname()[1]
    held: list[trio.abc.Stream] = []

    async def hold(stream: trio.abc.Stream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    async with opcua_server(tmp_path, "solo") as solo, trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, hold, silent_listeners)
        silent = f"opc.tcp://127.0.0.1:{silent_port}/"
        start = trio.current_time()
        urls = await handler.discover_once(details(refused, silent, solo.base))
        assert urls == [solo.url]
        assert trio.current_time() - start < 1.0 + 1.0 + 1.0  # bounded by the timeouts
        assert held, "the silent server was really asked"

        # the bridge survived the cancelled FindServers and still works
        assert await handler.discover_once(details(solo.base)) == [solo.url]

        # a server queried directly disappears when it goes away
        await kill(solo)
        assert await handler.discover_once(details(solo.base)) == []
        nursery.cancel_scope.cancel()


async def test_cancelling_discovery_mid_request_leaves_nothing_behind(
    tmp_path: Path, bridge: AioBridge
) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    handler = Opcua(bridge=bridge, request_timeout=100)

    async def hold(stream: trio.abc.Stream) -> None:
        await trio.sleep_forever()

    async def send(devices: list[Device]) -> None:
        raise AssertionError("nothing to send")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, hold, listeners)
        start = trio.current_time()
        with trio.move_on_after(0.5):
            await handler.discover(details(f"opc.tcp://127.0.0.1:{port}/"), {}, send)
        assert trio.current_time() - start < 2.0  # the asyncio side unwound promptly
        nursery.cancel_scope.cancel()


def test_parse_details_of_the_upstream_example() -> None:
    text = """
    opcuaDiscoveryMethod:
      standard:
        discoveryUrls:
        - opc.tcp://127.0.0.1:4855/
    applicationNames:
      action: Include
      items:
      - "Some application name"
    """
    assert parse_details(text) == OpcuaDetails(
        ("opc.tcp://127.0.0.1:4855/",), FilterList(("Some application name",))
    )


async def test_a_flooding_discovery_server_is_cut_off_at_the_limit(
    bridge: AioBridge, caplog: pytest.LogCaptureFixture
) -> None:
    # Answers the Hello with an Acknowledge whose header claims 400 MB, then sends zeros:
    # asyncua would buffer all of it (copying the buffer on every read) before a check.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    sent = 0

    async def flood(stream: trio.SocketStream) -> None:
        nonlocal sent
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with stream:
                await stream.receive_some(65536)  # the Hello
                await stream.send_all(b"ACKF" + struct.pack("<I", 400 << 20))
                chunk = bytes(65536)
                while sent < 400 << 20:
                    await stream.send_all(chunk)
                    sent += len(chunk)

    url = f"opc.tcp://127.0.0.1:{port}/"
    handler = Opcua(bridge=bridge, request_timeout=20, max_response_bytes=1 << 20)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, flood, listeners)
        with trio.fail_after(20):
            with pytest.raises(AnswerTooLarge, match="sent more than 1048576 bytes"):
                await bridge.run(find_servers(url, 1 << 20))
            assert sent < 32 << 20  # socket buffers, not the 400 MB
            assert await handler.discover_once(details(url)) == []
        assert "sent more than 1048576 bytes" in caplog.text
        nursery.cancel_scope.cancel()


def test_the_response_limit_is_a_setting() -> None:
    assert Opcua.from_env({}).max_response_bytes == 1 << 20
    assert Opcua.from_env({"OPCUA_MAX_RESPONSE_BYTES": "4096"}).max_response_bytes == 4096
    with pytest.raises(ValueError, match="OPCUA_MAX_RESPONSE_BYTES"):
        Opcua.from_env({"OPCUA_MAX_RESPONSE_BYTES": "lots"})


T = TypeVar("T")


class CannedBridge(AioBridge):
    """Answers every FindServers with the same applications, so a test decides what a
    (hostile) discovery server lists; the probes that follow are real."""

    def __init__(self, apps: list[Application]) -> None:
        super().__init__()
        self.apps = apps

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        coro.close()
        return self.apps  # type: ignore[return-value]


async def test_servers_on_other_hosts_are_not_probed_unless_allowed() -> None:
    # Both hosts are loopback addresses; the discovery server is on 127.0.0.1.
    lds_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    near_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    far_listeners = await trio.open_tcp_listeners(0, host="127.0.0.2")
    connected: list[str] = []

    def counting(name: str) -> Callable[[trio.SocketStream], Awaitable[None]]:
        async def handle(stream: trio.SocketStream) -> None:
            connected.append(name)
            await stream.aclose()

        return handle

    def port(listeners: list[trio.SocketListener]) -> int:
        return int(listeners[0].socket.getsockname()[1])

    lds = f"opc.tcp://127.0.0.1:{port(lds_listeners)}/"
    near = f"opc.tcp://127.0.0.1:{port(near_listeners)}/near"
    far = f"opc.tcp://127.0.0.2:{port(far_listeners)}/far"
    apps = [Application(n, 0, (u,)) for n, u in [("near", near), ("far", far)]]
    handler = Opcua(bridge=CannedBridge(apps), probe_timeout=2.0)
    async with trio.open_nursery() as nursery:
        for name, listeners in [("lds", lds_listeners), ("near", near_listeners),
                                ("far", far_listeners)]:  # fmt: skip
            nursery.start_soon(trio.serve_listeners, counting(name), listeners)
        with trio.fail_after(10):
            assert await handler.discover_once(details(lds)) == [near]
            assert sorted(connected) == ["lds", "near"]  # nothing ever reached 127.0.0.2
            widened = OpcuaDetails(discovery_urls=(lds,), allowed_hosts=("127.0.0.2",))
            assert sorted(await handler.discover_once(widened)) == sorted([near, far])
            assert "far" in connected
        nursery.cancel_scope.cancel()


async def test_probes_of_listed_servers_have_bounded_concurrency(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: Any
) -> None:
    lds = "opc.tcp://127.0.0.1:4840/"
    apps = [Application(f"s{i}", 0, (f"opc.tcp://127.0.0.1:{10000 + i}/",)) for i in range(40)]
    in_flight = peak = probed = 0

    async def reachable(host: str, port: int) -> bool:
        nonlocal in_flight, peak, probed
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(1)  # a slow host; the clock is mocked
        in_flight -= 1
        probed += 1
        return True

    monkeypatch.setattr(opcua_module, "tcp_reachable", reachable)
    handler = Opcua(bridge=CannedBridge(apps), probe_concurrency=8)
    assert len(await handler.discover_once(details(lds))) == 40
    assert probed == 41 and peak == 8  # the discovery server, then 40 servers 8 at a time
