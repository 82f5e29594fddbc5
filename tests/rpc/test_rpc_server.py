"""purerpc/trio servers on Unix sockets, driven by a grpcio client playing the kubelet.

grpcio's sync API blocks, so its calls run in worker threads (each with a grpc timeout, so a
failure cannot hang the test); the server's reactions are observed through the Plugin's events.
"""

from __future__ import annotations

import functools
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

import grpc
import h2.connection  # h2 3.x has no types
import h2.errors
import h2.events
import pytest
import trio

from akri_trio.rpc import uds
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc
from tests.rpc.rpc_testing import Plugin, request_headers

dp_grpcio: Any = deviceplugin_v1beta1_pb2_grpc  # grpcio stubs are untyped

GRPC_TIMEOUT_S = 10


def grpcio_channel(path: Path) -> Any:
    return grpc.insecure_channel(f"unix://{path}")


def allocate_via_grpcio(path: Path, ids: list[str]) -> dp.AllocateResponse:
    with grpcio_channel(path) as channel:
        stub = dp_grpcio.DevicePluginStub(channel)
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        response: dp.AllocateResponse = stub.Allocate(request, timeout=GRPC_TIMEOUT_S)
        return response


async def test_unary_allocate_round_trips(plugin: Plugin, sock_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        response = await trio.to_thread.run_sync(allocate_via_grpcio, path, ["a", "b"])
        nursery.cancel_scope.cancel()

    (container,) = response.container_responses
    assert dict(container.envs) == {"AKRI_DEV": "a,b"}
    assert [(m.container_path, m.host_path, m.read_only) for m in container.mounts] == [
        ("/akri", "/srv/akri", True)
    ]
    assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
        ("/dev/akri", "/dev/null", "rw")
    ]
    assert dict(container.annotations) == {"akri.sh/ids": "a,b"}
    assert plugin.allocations == [["a", "b"]]


async def test_list_and_watch_delivers_every_update_in_order(
    plugin: Plugin, sock_dir: Path
) -> None:
    updates = 200
    for n in range(1, updates + 1):
        plugin.publish([dp.Device(ID=f"dev-{i}", health="Healthy") for i in range(n)])

    def watch(path: Path) -> list[int]:
        with grpcio_channel(path) as channel:
            stream = dp_grpcio.DevicePluginStub(channel).ListAndWatch(
                dp.Empty(), timeout=GRPC_TIMEOUT_S
            )
            counts = []
            for message in stream:
                counts.append(len(message.devices))
                if len(counts) == updates + 1:
                    stream.cancel()
                    break
            return counts

    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        counts = await trio.to_thread.run_sync(watch, path)
        nursery.cancel_scope.cancel()

    assert counts == [1, *range(1, updates + 1)]


def open_stream_then(path: Path, how: str) -> int:
    """Open ListAndWatch, read the first message, then end it from the client side."""
    channel = grpcio_channel(path)
    try:
        stream = dp_grpcio.DevicePluginStub(channel).ListAndWatch(
            dp.Empty(), timeout=GRPC_TIMEOUT_S * 3
        )
        first = next(stream)
        if how == "cancel":
            stream.cancel()
    finally:
        channel.close()
    return len(first.devices)


@pytest.mark.parametrize("how", ["cancel", "close"])
async def test_client_ending_stream_finalizes_parked_generator(
    plugin: Plugin, sock_dir: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The generator is parked waiting for an update that never comes: only the stream
    # cancellation glue can make its `finally` run.
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        assert await trio.to_thread.run_sync(open_stream_then, path, how) == 1
        with trio.fail_after(2):
            await plugin.stream_finalized.wait()
        assert plugin.live_streams == 0
        nursery.cancel_scope.cancel()
    # Cancelling a handler on purpose is not worth purerpc's "Got exception" warnings.
    assert [r.getMessage() for r in caplog.records if r.name == "purerpc.server"] == []


def h2_list_and_watch_until_first_message(
    path: Path,
) -> tuple[socket.socket, h2.connection.H2Connection]:
    """A hand-rolled HTTP/2 client: opens ListAndWatch, returns once a DATA frame arrived."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(GRPC_TIMEOUT_S)
    sock.connect(os.fspath(path))
    conn = h2.connection.H2Connection()
    conn.initiate_connection()
    conn.send_headers(1, request_headers("/v1beta1.DevicePlugin/ListAndWatch"))
    conn.send_data(1, struct.pack(">BI", 0, 0), end_stream=True)  # one empty gRPC message
    sock.sendall(conn.data_to_send())
    while True:
        data = sock.recv(65536)
        assert data, "server closed the connection before the first message"
        events = conn.receive_data(data)
        sock.sendall(conn.data_to_send())
        if any(isinstance(e, h2.events.DataReceived) for e in events):
            return sock, conn


async def test_rst_stream_finalizes_generator_and_connection_lives(
    plugin: Plugin, sock_dir: Path
) -> None:
    # RST_STREAM on a connection that stays open: EOF cannot help, only the reset hook can.
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        raw, conn = await trio.to_thread.run_sync(h2_list_and_watch_until_first_message, path)
        with raw:
            conn.reset_stream(1, error_code=h2.errors.ErrorCodes.CANCEL)
            raw.sendall(conn.data_to_send())
            with trio.fail_after(2):
                await plugin.stream_finalized.wait()
            assert plugin.live_streams == 0
        nursery.cancel_scope.cancel()


def vanish(raw: socket.socket) -> None:
    # RST on close (linger 0): the peer vanishes without a goodbye, as on SIGKILL.
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()


async def test_vanished_client_finalizes_stream_and_listener_lives(
    plugin: Plugin, sock_dir: Path
) -> None:
    # Nothing is written after the client vanishes: only EOF can end the parked stream.
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        raw, _ = await trio.to_thread.run_sync(h2_list_and_watch_until_first_message, path)
        vanish(raw)
        with trio.fail_after(2):
            await plugin.stream_finalized.wait()

        response = await trio.to_thread.run_sync(allocate_via_grpcio, path, ["x"])
        assert [dict(c.envs) for c in response.container_responses] == [{"AKRI_DEV": "x"}]
        nursery.cancel_scope.cancel()


async def test_writing_to_vanished_client_does_not_kill_the_listener(
    plugin: Plugin, sock_dir: Path
) -> None:
    # The update races the EOF: the write fails with EPIPE/ECONNRESET inside purerpc's task
    # group, which surfaces as an ExceptionGroup that must stay inside the connection.
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        for _ in range(3):
            plugin.stream_finalized = trio.Event()
            raw, _ = await trio.to_thread.run_sync(h2_list_and_watch_until_first_message, path)
            vanish(raw)
            plugin.publish([dp.Device(ID="late", health="Healthy")])
            with trio.fail_after(2):
                await plugin.stream_finalized.wait()

        response = await trio.to_thread.run_sync(allocate_via_grpcio, path, ["x"])
        assert len(response.container_responses) == 1
        assert plugin.live_streams == 0
        nursery.cancel_scope.cancel()


async def test_garbage_client_does_not_kill_the_listener(plugin: Plugin, sock_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        garbage = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with garbage:
            await garbage.connect(os.fspath(path))
            await garbage.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10)
            with trio.fail_after(2):
                while await garbage.recv(65536):  # purerpc answers GOAWAY, then closes
                    pass

        response = await trio.to_thread.run_sync(allocate_via_grpcio, path, ["y"])
        assert len(response.container_responses) == 1
        nursery.cancel_scope.cancel()


async def test_socket_file_removed_on_cancellation(plugin: Plugin, sock_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        assert stat.S_ISSOCK(path.lstat().st_mode)
        nursery.cancel_scope.cancel()
    assert not path.exists()


async def test_socket_file_removed_with_a_stream_open(plugin: Plugin, sock_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        raw, _ = await trio.to_thread.run_sync(h2_list_and_watch_until_first_message, path)
        nursery.cancel_scope.cancel()
    raw.close()
    assert not path.exists()
    assert plugin.stream_finalized.is_set()


async def test_stale_socket_file_is_replaced(plugin: Plugin, sock_dir: Path) -> None:
    path = sock_dir / "dp.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.fspath(path))
    stale.close()  # the file stays behind, as after a crash; connecting to it is refused
    stale_inode = path.lstat().st_ino

    async with trio.open_nursery() as nursery:
        await nursery.start(uds.serve_unix, path, plugin)
        assert path.lstat().st_ino != stale_inode
        response = await trio.to_thread.run_sync(allocate_via_grpcio, path, ["z"])
        assert len(response.container_responses) == 1
        nursery.cancel_scope.cancel()


async def test_non_socket_file_is_not_clobbered(plugin: Plugin, sock_dir: Path) -> None:
    path = sock_dir / "dp.sock"
    path.write_text("not a socket")
    with pytest.raises(FileExistsError):
        await uds.serve_unix(path, plugin)
    assert path.read_text() == "not a socket"
    assert os.listdir(sock_dir) == ["dp.sock"]  # no temporary left behind


@pytest.mark.parametrize("mode", [0o600, 0o660])
async def test_socket_mode_is_honoured(plugin: Plugin, sock_dir: Path, mode: int) -> None:
    old_umask = os.umask(0o077)  # the mode must not depend on the umask
    try:
        async with trio.open_nursery() as nursery:
            path = await nursery.start(
                functools.partial(uds.serve_unix, sock_dir / "reg.sock", plugin, mode=mode)
            )
            assert stat.S_IMODE(path.lstat().st_mode) == mode
            nursery.cancel_scope.cancel()
    finally:
        os.umask(old_umask)


async def test_replaced_socket_file_is_left_for_its_new_owner(
    plugin: Plugin, sock_dir: Path
) -> None:
    path = sock_dir / "dp.sock"
    async with trio.open_nursery() as old:
        await old.start(uds.serve_unix, path, plugin)
        async with trio.open_nursery() as new:
            await new.start(uds.serve_unix, path, Plugin())
            old.cancel_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert stat.S_ISSOCK(path.lstat().st_mode)  # the old server did not delete it
            response = await trio.to_thread.run_sync(allocate_via_grpcio, path, ["n"])
            assert len(response.container_responses) == 1
            new.cancel_scope.cancel()
    assert not path.exists()
    assert plugin.allocations == []  # the call reached the new server


async def test_tcp_server_serves_grpcio(plugin: Plugin) -> None:
    def allocate_tcp(port: int) -> int:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = dp_grpcio.DevicePluginStub(channel)
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=["t"])]
            )
            response = stub.Allocate(request, timeout=GRPC_TIMEOUT_S)
            return len(response.container_responses)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(uds.serve_tcp, "127.0.0.1", 0, plugin)
        assert await trio.to_thread.run_sync(allocate_tcp, port) == 1
        nursery.cancel_scope.cancel()
    assert plugin.allocations == [["t"]]
