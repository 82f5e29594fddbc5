"""Hostile gRPC peers (issue 21 items 1 and 10): compressed bombs and stalled calls.

Real grpcio clients (C-core, compressing on request) and a hand-rolled HTTP/2 peer against our
purerpc servers on Unix sockets (our client meets a bomb in test_rpc_client.py); outcomes are
gRPC statuses and whether the next call is still served, never timings.
"""

from __future__ import annotations

import functools
import gzip
import logging
import os
import socket
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection  # h2 3.x has no types
import h2.errors
import h2.events
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from purerpc.grpclib.exceptions import MessageTooLargeError, UnsupportedMessageEncodingError

from akri_trio.discovery.registration import serve_registration
from akri_trio.discovery.registry import Registry
from akri_trio.rpc import uds
from akri_trio.rpc.gen import deviceplugin_v1beta1_grpc as dp_grpc
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc, discovery_pb2_grpc
from akri_trio.rpc.gen import discovery_pb2 as pb
from tests.rpc.rpc_testing import Plugin

dp_grpcio: Any = deviceplugin_v1beta1_pb2_grpc  # grpcio stubs are untyped
pb_grpcio: Any = discovery_pb2_grpc

LIMIT = uds.MAX_MESSAGE_BYTES
BOMB_BYTES = LIMIT + 8 * 1024 * 1024  # inflates past the limit; compresses to ~40 KB
COMPRESSIONS = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}


# ---- the bounded inflater ----------------------------------------------------------------------


@given(st.binary(max_size=4096), st.sampled_from(["gzip", "deflate"]))
def test_inflate_bounded_round_trips_what_fits(payload: bytes, encoding: str) -> None:
    packed = gzip.compress(payload) if encoding == "gzip" else zlib.compress(payload)
    assert uds.inflate_bounded(packed, encoding, len(payload)) == payload


def test_inflate_bounded_stops_at_the_limit() -> None:
    bomb = zlib.compress(b"\0" * (64 * 1024 * 1024), 9)  # 64 MiB in ~64 KB
    with pytest.raises(MessageTooLargeError, match="inflates past the limit of 1000 bytes"):
        uds.inflate_bounded(bomb, "deflate", 1000)
    with pytest.raises(MessageTooLargeError):
        uds.inflate_bounded(gzip.compress(b"x" * 1001), "gzip", 1000)
    assert uds.inflate_bounded(gzip.compress(b"x" * 1000), "gzip", 1000) == b"x" * 1000


def test_inflate_bounded_refuses_unknown_encodings_and_corrupt_data() -> None:
    with pytest.raises(UnsupportedMessageEncodingError, match="'snappy'"):
        uds.inflate_bounded(b"abc", "snappy", 100)
    with pytest.raises(UnsupportedMessageEncodingError):
        uds.inflate_bounded(b"abc", None, 100)
    with pytest.raises(uds.CorruptMessageError):
        uds.inflate_bounded(b"not compressed", "gzip", 100)
    with pytest.raises(uds.CorruptMessageError, match="not one whole"):
        uds.inflate_bounded(zlib.compress(b"x" * 100)[:-3], "deflate", 1000)
    with pytest.raises(uds.CorruptMessageError, match="not one whole"):
        uds.inflate_bounded(zlib.compress(b"x") + b"trailing", "deflate", 1000)


# ---- bombs sent to our servers by grpcio clients ------------------------------------------------


def grpcio_status(call: Callable[[], object]) -> grpc.StatusCode:
    """Make one blocking grpcio call: its status."""
    try:
        call()
    except grpc.RpcError as err:
        assert isinstance(err, grpc.Call)
        return err.code()
    return grpc.StatusCode.OK


def grpcio_allocate(channel: grpc.Channel, ids: list[str], compression: Any) -> grpc.StatusCode:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    stub = dp_grpcio.DevicePluginStub(channel)
    return grpcio_status(lambda: stub.Allocate(request, timeout=30, compression=compression))


def grpcio_register(channel: grpc.Channel, name: str, compression: Any) -> grpc.StatusCode:
    request = pb.RegisterDiscoveryHandlerRequest(
        name=name,
        endpoint="/var/lib/akri/h.sock",
        endpoint_type=pb.RegisterDiscoveryHandlerRequest.UDS,
    )
    stub = pb_grpcio.RegistrationStub(channel)
    return grpcio_status(
        lambda: stub.RegisterDiscoveryHandler(request, timeout=30, compression=compression)
    )


@pytest.mark.parametrize("encoding", sorted(COMPRESSIONS))
async def test_compressed_bomb_to_a_device_plugin_is_refused_and_it_serves_on(
    plugin: Plugin, sock_dir: Path, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    compression = COMPRESSIONS[encoding]
    async with trio.open_nursery() as nursery:
        path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
        # One channel, one connection: the refusal ends that call only.
        with grpc.insecure_channel(f"unix://{path}") as channel:
            bomb = ["b" * BOMB_BYTES]
            code = await trio.to_thread.run_sync(grpcio_allocate, channel, bomb, compression)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert plugin.allocations == []  # the handler never saw it
            # A compressed message within the limit is read (grpcio compresses on request).
            fits = ["a" * 100_000]
            code = await trio.to_thread.run_sync(grpcio_allocate, channel, fits, compression)
            assert code == grpc.StatusCode.OK
            assert plugin.allocations == [fits]
        nursery.cancel_scope.cancel()
    # The stream was refused, the connection never failed.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("refused a gRPC message on stream 1: ")
    assert "inflates past the limit of 33554432 bytes" in warnings[0]


@pytest.mark.parametrize("encoding", sorted(COMPRESSIONS))
async def test_compressed_bomb_to_the_registration_socket_is_refused_and_it_serves_on(
    sock_dir: Path, encoding: str
) -> None:
    registry = Registry(trio.current_time)
    compression = COMPRESSIONS[encoding]
    async with trio.open_nursery() as nursery:
        path = await nursery.start(serve_registration, registry, sock_dir / "reg.sock")
        with grpc.insecure_channel(f"unix://{path}") as channel:
            bomb = "h" * BOMB_BYTES
            code = await trio.to_thread.run_sync(grpcio_register, channel, bomb, compression)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            code = await trio.to_thread.run_sync(grpcio_register, channel, "zipped", compression)
            assert code == grpc.StatusCode.OK
        assert registry.names() == ["zipped"]
        nursery.cancel_scope.cancel()


# ---- a call opened and then stalled -------------------------------------------------------------


async def stall_a_call(path: Path) -> tuple[float | None, float]:
    """Open an Allocate call and send nothing more: when (after opening) the server reset the
    call, if it did, and when it closed the connection."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        await sock.connect(os.fspath(path))
        conn = h2.connection.H2Connection()
        conn.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v1beta1.DevicePlugin/Allocate"),
            (":authority", "localhost"),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
        ]
        conn.send_headers(1, headers)  # and then nothing: no request message, no end
        await sock.send(conn.data_to_send())
        start = trio.current_time()
        reset_at = None
        while data := await sock.recv(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.StreamReset):
                    assert event.stream_id == 1
                    assert event.error_code == h2.errors.ErrorCodes.CANCEL
                    reset_at = trio.current_time() - start
            await sock.send(conn.data_to_send())
        return reset_at, trio.current_time() - start


async def test_a_stalled_call_is_reset_after_the_idle_timeout_and_then_its_connection_closed(
    plugin: Plugin, sock_dir: Path, autojump_clock: Any
) -> None:
    timeout = 60.0
    with trio.fail_after(10 * timeout):
        async with trio.open_nursery() as nursery:
            path = await nursery.start(
                functools.partial(uds.serve_unix, limits=uds.ServerLimits(idle_timeout=timeout)),
                sock_dir / "dp.sock",
                plugin,
            )
            reset_at, closed_at = await stall_a_call(path)
            nursery.cancel_scope.cancel()
    assert reset_at is not None and timeout <= reset_at < timeout + 1
    assert 2 * timeout <= closed_at < 2 * timeout + 1  # then idle, then closed
    assert plugin.allocations == []


async def test_a_call_whose_request_arrived_is_never_timed_out(
    plugin: Plugin, sock_dir: Path, autojump_clock: Any
) -> None:
    # ListAndWatch parks after its first answer, far past the idle timeout: still open.
    timeout = 60.0
    async with trio.open_nursery() as nursery:
        path = await nursery.start(
            functools.partial(uds.serve_unix, limits=uds.ServerLimits(idle_timeout=timeout)),
            sock_dir / "dp.sock",
            plugin,
        )
        async with uds.UnixChannel(path) as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            updates = stub.ListAndWatch(dp.Empty())
            first = await updates.__anext__()
            assert [d.ID for d in first.devices] == ["dev-0"]
            await trio.sleep(10 * timeout)
            plugin.publish([dp.Device(ID="late", health="Healthy")])
            later = await updates.__anext__()
            assert [d.ID for d in later.devices] == ["late"]
            assert plugin.live_streams == 1
        nursery.cancel_scope.cancel()
