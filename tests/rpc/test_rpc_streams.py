"""Concurrent streams per connection are capped (issue 21 item 4, akri_trio.rpc.uds (j)).

purerpc advertised 65,536 streams per connection, each a task of ours. Our servers advertise
`MAX_CONCURRENT_STREAMS`: a hand-rolled HTTP/2 peer that ignores the setting has the stream past
it refused while its other calls, its connection and other clients are served on; grpcio, which
honours the setting, queues its calls past it instead of failing them; and ten times the cap
opened at once on the kubelet's own device plugin socket leaves its event loop under the lag
bound and its Allocate calls answered (tests/support/flood.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import h2.connection  # h2 3.x has no types
import h2.errors
import h2.events
import h2.settings
import pytest
import trio

from akri_trio.rpc import uds
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from tests.rpc.rpc_testing import Plugin, dp_grpcio, grpcio_allocate, request_headers
from tests.support.flood import watched_loop

CAP = uds.MAX_CONCURRENT_STREAMS
LIST_AND_WATCH = request_headers("/v1beta1.DevicePlugin/ListAndWatch")
EMPTY_MESSAGE = b"\0\0\0\0\0"  # a gRPC frame: uncompressed, length 0 (dp.Empty)


@asynccontextmanager
async def raw_peer(path: Path, ids: list[int]) -> AsyncIterator[RawPeer]:
    """A RawPeer connected to `path` that has opened ListAndWatch calls on `ids` at once."""
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        await sock.connect(os.fspath(path))
        peer = RawPeer(sock)
        for stream_id in ids:
            peer.open(stream_id)
        await peer.flush()
        yield peer


class RawPeer:
    """An HTTP/2 client that opens streams without waiting for the server's settings."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.conn = h2.connection.H2Connection()
        self.conn.initiate_connection()
        self.answered: set[int] = set()
        self.resets: dict[int, int] = {}
        self.advertised: int | None = None

    def open(self, stream_id: int) -> None:
        self.conn.send_headers(stream_id, LIST_AND_WATCH)
        self.conn.send_data(stream_id, EMPTY_MESSAGE, end_stream=True)

    async def flush(self) -> None:
        await self.sock.send(self.conn.data_to_send())

    async def read_until(self, answered: set[int], reset: set[int]) -> None:
        while not (answered <= self.answered and reset <= set(self.resets)):
            data = await self.sock.recv(65536)
            assert data, "the server closed the connection"
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    setting = event.changed_settings.get(
                        h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
                    )
                    if setting is not None:
                        self.advertised = setting.new_value
                elif isinstance(event, h2.events.DataReceived):
                    self.answered.add(event.stream_id)
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                elif isinstance(event, h2.events.StreamReset):
                    self.resets[event.stream_id] = event.error_code
            await self.flush()


async def test_a_stream_past_the_cap_is_refused_and_everything_else_is_served(
    plugin: Plugin, sock_dir: Path
) -> None:
    ids = [2 * n + 1 for n in range(CAP + 1)]
    held, past = set(ids[:-1]), ids[-1]
    with trio.fail_after(60):  # a hang guard, not a timing
        async with trio.open_nursery() as nursery:
            path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
            async with raw_peer(path, ids) as peer:
                await peer.read_until(answered=held, reset={past})
                assert peer.advertised == CAP
                assert peer.resets == {past: h2.errors.ErrorCodes.REFUSED_STREAM}
                assert peer.answered == held  # each held call got its first device list
                assert plugin.live_streams == CAP
                # Another client is served meanwhile.
                assert (
                    await trio.to_thread.run_sync(grpcio_allocate, path, ["x"])
                    == grpc.StatusCode.OK
                )
                assert plugin.allocations == [["x"]]
                # A call ended frees its place on this connection for the next one.
                peer.conn.reset_stream(ids[0], h2.errors.ErrorCodes.CANCEL)
                peer.open(past + 2)
                await peer.flush()
                await peer.read_until(answered={past + 2}, reset=set())
                assert set(peer.resets) == {past}
            nursery.cancel_scope.cancel()


async def test_the_cap_is_the_servers_setting(plugin: Plugin, sock_dir: Path) -> None:
    ids = [1, 3, 5, 7, 9]
    serve = functools.partial(uds.serve_unix, limits=uds.ServerLimits(max_streams=4))
    with trio.fail_after(60):  # a hang guard, not a timing
        async with trio.open_nursery() as nursery:
            path = await nursery.start(serve, sock_dir / "dp.sock", plugin)
            async with raw_peer(path, ids) as peer:
                await peer.read_until(answered=set(ids[:4]), reset={9})
            # Another server in the same process keeps the default cap.
            other = await nursery.start(uds.serve_unix, sock_dir / "other.sock", plugin)
            async with raw_peer(other, ids) as peer_of_other:
                await peer_of_other.read_until(answered=set(ids), reset=set())
            nursery.cancel_scope.cancel()
    assert peer_of_other.advertised == CAP
    assert peer.advertised == 4
    assert peer.resets == {9: h2.errors.ErrorCodes.REFUSED_STREAM}


def test_the_flag_and_its_environment_variable() -> None:
    def parse(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser(exit_on_error=False)
        uds.add_server_arguments(parser, env)
        return parser.parse_args(argv)

    assert parse([], {}).grpc_max_streams == CAP == 128
    assert parse([], {"AKRI_GRPC_MAX_STREAMS": "16"}).grpc_max_streams == 16
    assert parse(["--grpc-max-streams", "8"], {"AKRI_GRPC_MAX_STREAMS": "16"}).grpc_max_streams == 8
    with pytest.raises(argparse.ArgumentError, match="expected a positive whole number"):
        parse(["--grpc-max-streams", "0"], {})
    with pytest.raises(ValueError, match="at least 1"):
        uds.ServerLimits(idle_timeout=1.0, max_streams=0)


async def test_grpcio_queues_calls_past_the_cap_instead_of_failing_them(
    plugin: Plugin, sock_dir: Path
) -> None:
    def live() -> int:
        return trio.from_thread.run_sync(lambda: plugin.live_streams)

    def watch(path: Path) -> tuple[int, list[grpc.StatusCode], list[int]]:
        """Open CAP + 2 watches on one channel; end two of the first CAP once those are
        answered: the last two are then answered too. (answered, codes of the ended calls,
        calls the server held open after each step)."""
        answered, ended, held = 0, [], []
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = dp_grpcio.DevicePluginStub(channel)
            calls = [stub.ListAndWatch(dp.Empty()) for _ in range(CAP + 2)]
            try:
                for call in calls[:CAP]:
                    next(call)
                    answered += 1
                held.append(live())
                for call in calls[:2]:
                    call.cancel()
                    ended.append(call.code())
                for call in calls[CAP:]:
                    next(call)
                    answered += 1
                held.append(live())
            finally:
                for call in calls:
                    call.cancel()
        return answered, ended, held

    with trio.fail_after(60):  # a hang guard, not a timing
        async with trio.open_nursery() as nursery:
            path = await nursery.start(uds.serve_unix, sock_dir / "dp.sock", plugin)
            answered, ended, held = await trio.to_thread.run_sync(watch, path)
            nursery.cancel_scope.cancel()
    assert answered == CAP + 2
    assert ended == [grpc.StatusCode.CANCELLED] * 2
    assert held == [CAP, CAP]


async def test_ten_times_the_cap_at_once_keeps_the_loop_responsive() -> None:
    ids = [2 * n + 1 for n in range(10 * CAP)]
    with trio.fail_after(60):  # a hang guard, not a timing
        async with watched_loop() as watch, raw_peer(watch.plugin_socket, ids) as peer:
            await peer.read_until(answered=set(ids[:CAP]), reset=set(ids[CAP:]))
    watch.assert_held_up()
    assert peer.answered == set(ids[:CAP])
    assert set(peer.resets.values()) == {h2.errors.ErrorCodes.REFUSED_STREAM}
