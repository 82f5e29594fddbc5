"""purerpc channels: to a grpcio server (the kubelet's Registration, in its own process), to our
own purerpc servers over UDS and TCP (discovery), and to raw HTTP/2 servers that misbehave."""

from __future__ import annotations

import functools
import os
import socket
import struct
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import h2.config  # h2 3.x has no types
import h2.connection
import h2.errors
import h2.events
import purerpc
import pytest
import trio

from akri_trio.rpc import uds
from akri_trio.rpc.gen import deviceplugin_v1beta1_grpc as dp_grpc
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import discovery_grpc
from akri_trio.rpc.gen import discovery_pb2 as disc
from tests.rpc.rpc_testing import Kubelet, Plugin, fd_count


def register_request(resource_name: str, endpoint: str = "akri-dev.sock") -> dp.RegisterRequest:
    return dp.RegisterRequest(
        version="v1beta1",
        endpoint=endpoint,
        resource_name=resource_name,
        options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
    )


async def register(path: Path, request: dp.RegisterRequest) -> None:
    async with uds.UnixChannel(path) as channel:
        await dp_grpc.RegistrationStub(channel).Register(request)


# ---- purerpc -> grpcio (agent -> kubelet) -------------------------------------------------------


async def test_register_reaches_grpcio_server(kubelet: Kubelet) -> None:
    with trio.fail_after(10):
        await register(kubelet.path, register_request("akri.sh/akri-dev"))
        record = await kubelet.next_register()
    assert record == {
        "version": "v1beta1",
        "endpoint": "akri-dev.sock",
        "resource_name": "akri.sh/akri-dev",
        "pre_start_required": False,
        "get_preferred_allocation_available": True,
    }


async def test_error_status_arrives_as_purerpc_exception(kubelet: Kubelet) -> None:
    with trio.fail_after(10), pytest.raises(purerpc.InvalidArgumentError, match="bad resource"):
        await register(kubelet.path, register_request("akri.sh/bad"))


async def test_missing_socket_raises_file_not_found(sock_dir: Path) -> None:
    before = fd_count()
    with pytest.raises(FileNotFoundError):
        async with uds.UnixChannel(sock_dir / "absent.sock"):
            pass
    assert fd_count() <= before  # a leak adds fds; others may close meanwhile


async def test_client_calls_do_not_leak_fds(kubelet: Kubelet) -> None:
    with trio.fail_after(30):
        await register(kubelet.path, register_request("akri.sh/warm-up"))
        await kubelet.next_register()
        before = fd_count()
        for n in range(30):
            await register(kubelet.path, register_request(f"akri.sh/dev-{n}"))
            await kubelet.next_register()
        assert fd_count() <= before  # a leak adds fds; others may close meanwhile


async def test_purerpc_both_ends_do_not_leak_fds(plugin: Plugin, sock_dir: Path) -> None:
    async def allocate(path: Path, device: str) -> None:
        async with uds.UnixChannel(path) as channel:
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=[device])]
            )
            await dp_grpc.DevicePluginStub(channel).Allocate(request)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
            await allocate(path, "warm-up")
            await trio.testing.wait_all_tasks_blocked()
            before = fd_count()
            for n in range(30):
                await allocate(path, f"d{n}")
            await trio.testing.wait_all_tasks_blocked()  # let the server close its ends
            assert fd_count() <= before  # a leak adds fds; others may close meanwhile
            nursery.cancel_scope.cancel()
    assert len(plugin.allocations) == 31


# ---- purerpc -> purerpc (agent -> discovery handler), UDS and TCP ------------------------------


class Handler(discovery_grpc.DiscoveryHandlerServicer):
    """A discovery handler that reports what it was asked, then parks like a real one."""

    def __init__(self) -> None:
        self.finalized = trio.Event()

    async def Discover(
        self, input_message: disc.DiscoverRequest
    ) -> AsyncIterator[disc.DiscoverResponse]:
        try:
            props = {
                key: (value.vec.decode() if value.HasField("vec") else None)
                for key, value in input_message.discovery_properties.items()
            }
            yield disc.DiscoverResponse(
                devices=[
                    disc.Device(
                        id=input_message.discovery_details,
                        properties={k: str(v) for k, v in sorted(props.items())},
                        mounts=[disc.Mount(container_path="/c", host_path="/h", read_only=True)],
                        device_specs=[disc.DeviceSpec(container_path="/dev/x", permissions="rw")],
                    )
                ]
            )
            await trio.sleep_forever()
        finally:
            self.finalized.set()


def discover_request() -> disc.DiscoverRequest:
    return disc.DiscoverRequest(
        discovery_details="udev: {}",
        discovery_properties={"set": disc.ByteData(vec=b"v"), "empty": disc.ByteData()},
    )


async def first_discovery(channel: uds.UnixChannel | uds.TcpChannel) -> disc.Device:
    stream = discovery_grpc.DiscoveryHandlerStub(channel).Discover(discover_request())
    async for response in stream:
        (device,) = response.devices
        found: disc.Device = device
        return found
    raise AssertionError("stream ended without a response")


def assert_discovered(device: disc.Device) -> None:
    assert device.id == "udev: {}"
    # `optional bytes vec`: an unset value stays distinguishable from a set one.
    assert dict(device.properties) == {"empty": "None", "set": "v"}
    assert [(m.container_path, m.host_path, m.read_only) for m in device.mounts] == [
        ("/c", "/h", True)
    ]
    assert [(d.container_path, d.permissions) for d in device.device_specs] == [("/dev/x", "rw")]


async def test_discover_stream_over_uds(sock_dir: Path) -> None:
    handler = Handler()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            path = await nursery.start(uds.serve_unix, sock_dir / "dh.sock", handler)
            async with uds.open_channel(f"unix://{path}") as channel:
                assert_discovered(await first_discovery(channel))
            await handler.finalized.wait()  # the agent hung up: the handler's stream ends
            nursery.cancel_scope.cancel()


async def test_discover_stream_over_tcp() -> None:
    handler = Handler()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(uds.serve_tcp, "127.0.0.1", 0, handler)
            async with uds.open_channel(f"http://127.0.0.1:{port}") as channel:
                assert_discovered(await first_discovery(channel))
            await handler.finalized.wait()
            nursery.cancel_scope.cancel()


async def test_purerpcs_own_tcp_channel_works_against_serve_tcp() -> None:
    handler = Handler()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(uds.serve_tcp, "127.0.0.1", 0, handler)
            async with purerpc.insecure_channel("127.0.0.1", port) as channel:
                assert_discovered(await first_discovery(channel))
            nursery.cancel_scope.cancel()


# ---- servers that go away under a parked client call ------------------------------------------


Ending = Callable[[socket.socket, h2.connection.H2Connection], None]


def accept_one_call(
    listener: socket.socket,
) -> tuple[socket.socket, h2.connection.H2Connection, int]:
    """A raw HTTP/2 server's start: accept one connection (closing the listener) and read until
    a call opens. Returns the connection's socket, its h2 state and the call's stream."""
    with listener:
        listener.settimeout(10)
        conn_sock, _ = listener.accept()
    conn_sock.settimeout(10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    conn_sock.sendall(conn.data_to_send())
    while True:
        data = conn_sock.recv(65536)
        assert data
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                return conn_sock, conn, event.stream_id


def one_message_then(listener: socket.socket, consumed: threading.Event, ending: Ending) -> None:
    """A raw HTTP/2 server for one call: reply headers and one gRPC message, then `ending`
    once the client has taken the message (so the ending never races the client's read)."""
    conn_sock, conn, stream_id = accept_one_call(listener)
    with conn_sock:
        conn.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])
        body = disc.DiscoverResponse(devices=[disc.Device(id="only")]).SerializeToString()
        conn.send_data(stream_id, struct.pack(">BI", 0, len(body)) + body)
        conn_sock.sendall(conn.data_to_send())
        assert consumed.wait(10), "the client never got the message"
        ending(conn_sock, conn)


def vanish(sock: socket.socket, conn: h2.connection.H2Connection) -> None:
    pass  # returning closes the socket: no trailers, no GOAWAY, as when the process dies


def reset(sock: socket.socket, conn: h2.connection.H2Connection) -> None:
    conn.reset_stream(1, error_code=h2.errors.ErrorCodes.CANCEL)
    sock.sendall(conn.data_to_send())
    sock.recv(1)  # keep the connection open until the client hangs up: only the reset ends it


@pytest.mark.parametrize(
    ("ending", "error"),
    [(vanish, purerpc.UnavailableError), (reset, purerpc.CancelledError)],
)
async def test_parked_client_call_ends_when_server_goes_away(
    sock_dir: Path,
    ending: Ending,
    error: type[Exception],
) -> None:
    path = sock_dir / "dh.sock"
    received: list[str] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(os.fspath(path))
            listener.listen(1)
            consumed = threading.Event()
            serve_one = functools.partial(one_message_then, listener, consumed, ending)
            nursery.start_soon(trio.to_thread.run_sync, serve_one)
            with pytest.raises(error):
                async with uds.UnixChannel(path) as channel:
                    stub = discovery_grpc.DiscoveryHandlerStub(channel)
                    async for response in stub.Discover(discover_request()):
                        received += [d.id for d in response.devices]
                        consumed.set()
    assert received == ["only"]


# ---- endpoint parsing (pure) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("/var/lib/akri/udev.sock", uds.UnixEndpoint("/var/lib/akri/udev.sock")),
        ("unix:///var/lib/akri/udev.sock", uds.UnixEndpoint("/var/lib/akri/udev.sock")),
        ("unix:relative.sock", uds.UnixEndpoint("relative.sock")),
        ("http://10.0.0.7:10000", uds.TcpEndpoint("10.0.0.7", 10000)),
        ("http://onvif.akri:8080/", uds.TcpEndpoint("onvif.akri", 8080)),
        ("10.0.0.7:10000", uds.TcpEndpoint("10.0.0.7", 10000)),
        ("http://[fd00::7]:10000", uds.TcpEndpoint("fd00::7", 10000)),
        ("[::1]:50051", uds.TcpEndpoint("::1", 50051)),
    ],
)
def test_parse_endpoint(endpoint: str, expected: uds.UnixEndpoint | uds.TcpEndpoint) -> None:
    assert uds.parse_endpoint(endpoint) == expected


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://10.0.0.7:443",
        "http://10.0.0.7",
        "10.0.0.7",
        "http://h:99999",
        "http://h:1/x",
        "unix:",
    ],
)
def test_parse_endpoint_rejects(endpoint: str) -> None:
    with pytest.raises(ValueError):
        uds.parse_endpoint(endpoint)


def test_open_channel_picks_the_transport() -> None:
    unix = uds.open_channel("/run/dh.sock")
    tcp = uds.open_channel("http://127.0.0.1:5000")
    assert isinstance(unix, uds.UnixChannel) and unix.path == "/run/dh.sock"
    assert isinstance(tcp, uds.TcpChannel)


# ---- a server answering with a compressed bomb (issue 21 item 1) --------------------------------


def one_compressed_bomb(listener: socket.socket, bomb: bytes) -> None:
    """Answer one call with `grpc-encoding: deflate` and one message that inflates past the
    limit, then wait for the client to hang up."""
    conn_sock, conn, stream_id = accept_one_call(listener)
    with conn_sock:
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        conn.send_headers(stream_id, [*headers, ("grpc-encoding", "deflate")])
        frame = struct.pack(">?I", True, len(bomb)) + bomb
        for start in range(0, len(frame), 16384):
            conn.send_data(stream_id, frame[start : start + 16384])
        conn_sock.sendall(conn.data_to_send())
        while data := conn_sock.recv(65536):
            conn.receive_data(data)


async def test_our_client_refuses_a_compressed_bomb_with_resource_exhausted(
    sock_dir: Path,
) -> None:
    path = sock_dir / "handler.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fspath(path))
    listener.listen()
    bomb = zlib.compress(b"\0" * (uds.MAX_MESSAGE_BYTES + 1), 9)
    server = threading.Thread(target=one_compressed_bomb, args=(listener, bomb), daemon=True)
    server.start()
    with trio.fail_after(30):
        async with uds.UnixChannel(path) as channel:
            stub = discovery_grpc.DiscoveryHandlerStub(channel)
            with pytest.raises(purerpc.ResourceExhaustedError, match="inflates past"):
                async for _ in stub.Discover(discover_request()):
                    pass
        await trio.to_thread.run_sync(server.join, 30)
    assert not server.is_alive()
