"""What every flood test asserts of the event loop (issue 21 item 4, "no flood freezes the
agent"): while the flood runs, the loop is never more than `LAG_BOUND_S` late (as a
`LagMonitor` samples it), and a kubelet's Allocate calls keep being answered by a device plugin
served in that loop.

The kubelet is grpcio in a thread of its own, as the real one is another process: it calls
Allocate over and over, from before the flood starts until a call that started after the flood
began has been answered (`kubelet_allocating`). `watched_loop` serves a device plugin of its own
in the test's loop for floods run in-process; the agent's flood tests (tests/agent/test_floods.py)
give it the running agent's plugin and the agent's own lag monitor instead, the flood coming from
an attacker process (tests/support/flooder.py). The lag bound is the only wall-clock bound of
these tests; everything else is counted.
"""

from __future__ import annotations

import functools
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
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
    codes: list[grpc.StatusCode] = attrs.field(factory=list)  # one per Allocate, in order
    flood_began_at: int = 0  # how many Allocates had been answered when the flood began
    peak: float = 0.0  # the monitor's peak lag over the flood

    def assert_held_up(self) -> None:
        assert self.peak < LAG_BOUND_S, f"event loop lag {self.peak:.3f}s"
        assert set(self.codes) == {grpc.StatusCode.OK}
        assert len(self.codes) >= self.flood_began_at + 2  # the one in flight, and a new one


@attrs.define
class PluginWatch(LoopWatch):
    plugin_socket: Path = attrs.field(kw_only=True)  # the device plugin the kubelet calls


def _allocate_until(
    allocate: Callable[[], object], stop: threading.Event, watch: LoopWatch, answered: Changed
) -> None:
    while not stop.is_set():
        try:
            allocate()
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            code = err.code()
        watch.codes.append(code)
        trio.from_thread.run_sync(answered.bump)


@asynccontextmanager
async def kubelet_allocating(
    watch: LoopWatch, allocate: Callable[[], object], *, sample: bool = True
) -> AsyncIterator[None]:
    """`allocate()` (a kubelet's blocking Allocate call) again and again from a thread; the
    block is the flood, entered once a first call has been answered. `watch.monitor` measures
    the block: started here (`sample`), or already sampling the loop (the agent's own)."""
    answered = Changed()
    stop = threading.Event()
    async with trio.open_nursery() as nursery:
        kubelet_gone = trio.Event()

        async def kubelet() -> None:
            try:
                await trio.to_thread.run_sync(_allocate_until, allocate, stop, watch, answered)
            finally:
                kubelet_gone.set()

        nursery.start_soon(kubelet)
        await answered.wait_past(0)  # the kubelet is connected and served
        watch.monitor.peak = 0.0
        if sample:
            nursery.start_soon(watch.monitor.run)
        watch.flood_began_at = len(watch.codes)
        try:
            yield
        finally:
            seen = answered.version
            while len(watch.codes) < watch.flood_began_at + 2:
                seen = await answered.wait_past(seen)
            watch.peak = watch.monitor.peak
            stop.set()
            await kubelet_gone.wait()  # after its call in flight
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def watched_loop() -> AsyncIterator[PluginWatch]:
    """The lag sampler and a device plugin in this loop, a kubelet allocating from a thread;
    the block is the flood. Call `assert_held_up` on the watch after the block."""
    request = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=["dev-0"])]
    )
    with tempfile.TemporaryDirectory(prefix="flood-", dir="/tmp") as sock_dir:
        async with trio.open_nursery() as nursery:
            path = await nursery.start(uds.serve_unix, Path(sock_dir) / "dp.sock", Plugin())
            monitor = LagMonitor(LAG_BOUND_S, period=SAMPLE_PERIOD_S)
            watch = PluginWatch(monitor, plugin_socket=path)
            with grpc.insecure_channel(f"unix://{path}") as channel:
                stub = dp_grpcio.DevicePluginStub(channel)
                # A hang guard, as the kubelet's.
                allocate = functools.partial(stub.Allocate, request, timeout=30)
                async with kubelet_allocating(watch, allocate):
                    yield watch
            nursery.cancel_scope.cancel()
