"""What every flood test asserts of the agent's event loop (issue 21 item 4, "no flood freezes
the agent"): while the flood runs in the loop, the loop is never more than `LAG_BOUND_S` late
(as the agent's own `LagMonitor` samples it), and a kubelet's Allocate calls keep being
answered by a device plugin served in that loop.

The kubelet is grpcio in a thread of its own, as the real one is another process: it calls
Allocate on one connection over and over, from before the flood starts until a call that
started after the flood began has been answered. The lag bound is the only wall-clock bound of
these tests; everything else is counted.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import attrs
import grpc
import trio

from akri_trio.observe.lag import LagMonitor
from akri_trio.rpc import uds
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.runtime import Changed
from tests.rpc.rpc_testing import Plugin, dp_grpcio

LAG_BOUND_S: Final = 0.25
# Finer than the agent's 0.1 s, so a stall is measured at close to its full length.
SAMPLE_PERIOD_S: Final = 0.01


@attrs.define
class LoopWatch:
    """What was seen of the loop while a flood ran."""

    monitor: LagMonitor
    plugin_socket: Path  # the device plugin the kubelet calls
    codes: list[grpc.StatusCode] = attrs.field(factory=list)  # one per Allocate, in order
    flood_began_at: int = 0  # how many Allocates had been answered when the flood began

    def assert_held_up(self) -> None:
        assert self.monitor.peak < LAG_BOUND_S, f"event loop lag {self.monitor.peak:.3f}s"
        assert set(self.codes) == {grpc.StatusCode.OK}
        assert len(self.codes) >= self.flood_began_at + 2  # the one in flight, and a new one


def _allocate_until(path: Path, stop: threading.Event, watch: LoopWatch, answered: Changed) -> None:
    request = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=["dev-0"])]
    )
    with grpc.insecure_channel(f"unix://{path}") as channel:
        stub = dp_grpcio.DevicePluginStub(channel)
        while not stop.is_set():
            try:
                stub.Allocate(request, timeout=30)  # a hang guard, as the kubelet's
                code = grpc.StatusCode.OK
            except grpc.RpcError as err:
                assert isinstance(err, grpc.Call)
                code = err.code()
            watch.codes.append(code)
            trio.from_thread.run_sync(answered.bump)


@asynccontextmanager
async def watched_loop() -> AsyncIterator[LoopWatch]:
    """The lag sampler and a device plugin in this loop, a kubelet allocating from a thread;
    the block is the flood. Call `assert_held_up` on the watch after the block."""
    answered = Changed()
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="flood-", dir="/tmp") as sock_dir:
        async with trio.open_nursery() as nursery:
            path = await nursery.start(uds.serve_unix, Path(sock_dir) / "dp.sock", Plugin())
            watch = LoopWatch(LagMonitor(LAG_BOUND_S, period=SAMPLE_PERIOD_S), path)
            kubelet_gone = trio.Event()

            async def kubelet() -> None:
                try:
                    await trio.to_thread.run_sync(_allocate_until, path, stop, watch, answered)
                finally:
                    kubelet_gone.set()

            nursery.start_soon(kubelet)
            await answered.wait_past(0)  # the kubelet is connected and served
            nursery.start_soon(watch.monitor.run)
            watch.flood_began_at = len(watch.codes)
            try:
                yield watch
            finally:
                seen = answered.version
                while len(watch.codes) < watch.flood_began_at + 2:
                    seen = await answered.wait_past(seen)
                stop.set()
                await kubelet_gone.wait()  # after its call in flight
            nursery.cancel_scope.cancel()
