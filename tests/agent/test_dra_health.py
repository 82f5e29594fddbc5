"""The kubelet plugin's health stream (KEP-4680), called by a grpcio client as the kubelet's Go
client calls it: the whole list at once, every device this node can prepare healthy; a device
of a prepared claim whose Instance went offline unhealthy with why, healthy again once it is
back; each report carries the timeout the kubelet waits for the next; v1alpha1 answers as v1.
No API server: the preparer's view and record are set as the agent sets them."""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import trio

from akri_trio import dra
from akri_trio.address import ObjectKey
from akri_trio.agent.dra.plugin import HEALTH_TIMEOUT_S, plugin_socket, serve_kubelet_plugin
from akri_trio.agent.dra.preparer import Preparer
from akri_trio.agent.view import NodeView
from akri_trio.dra.checkpoint import PreparedClaim, PreparedDevice
from akri_trio.dra.health import OFFLINE
from akri_trio.kube import Client
from akri_trio.model.convert import unstructure
from akri_trio.model.device import Device
from akri_trio.rpc.gen import dra_health_v1_pb2 as v1
from akri_trio.rpc.gen import dra_health_v1_pb2_grpc, dra_health_v1alpha1_pb2_grpc
from akri_trio.rpc.gen import dra_health_v1alpha1_pb2 as v1alpha1
from tests.dra.support import instance

NODE = "n1"
CONFIG = ObjectKey("ns", "cam")
KEYS = (ObjectKey("ns", "cam-aaaaaa"), ObjectKey("ns", "cam-bbbbbb"))
POOL = dra.node_pool(NODE, "ns")


@pytest.fixture
async def plugin(short_tmp: Path) -> AsyncIterator[Preparer]:
    view = NodeView(NODE)
    for key in KEYS:
        inst = instance(key.name, namespace="ns", configuration="cam", nodes=(NODE,))
        view.put_instance({**unstructure(inst), "metadata": {"name": key.name, "namespace": "ns"}})
    view.set_devices(CONFIG, {key: Device(key.name) for key in KEYS})
    preparer = Preparer(
        cast(Client, None),  # health reads no claim
        view,
        cdi_dir=short_tmp / "cdi",
        state_dir=short_tmp / "state",
        consumable=True,
    )
    device = PreparedDevice(("r",), POOL, KEYS[0].name, ("akri.sh/claim=u-0",))
    preparer.prepared = {"u": PreparedClaim("ns", "c", (device,), "f")}
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_kubelet_plugin, short_tmp, preparer, lambda *_: None)
        yield preparer
        nursery.cancel_scope.cancel()


class Stream:
    """A NodeWatchResources stream read in a thread, as the kubelet reads it."""

    def __init__(self, socket: Path, alpha: bool) -> None:
        self.answers: queue.Queue[Any] = queue.Queue()
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        stub: Callable[[Any], Any] = (
            dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub
            if alpha
            else dra_health_v1_pb2_grpc.DRAResourceHealthStub
        )
        request = (v1alpha1 if alpha else v1).NodeWatchResourcesRequest()
        self.call = stub(self.channel).NodeWatchResources(request)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for answer in self.call:
                self.answers.put(
                    v1.NodeWatchResourcesResponse.FromString(answer.SerializeToString())
                )
        except grpc.RpcError:
            pass

    async def next(self) -> dict[str, tuple[int, str, int]]:
        """device -> (health, message, timeout) of the next report."""
        answer = await trio.to_thread.run_sync(lambda: self.answers.get(timeout=20))
        return {
            d.device.device_name: (d.health, d.message, d.health_check_timeout_seconds)
            for d in answer.devices
            if d.device.pool_name == POOL
        }

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def streams(plugin: Preparer, short_tmp: Path) -> Iterator[list[Stream]]:
    opened: list[Stream] = []
    yield opened
    for s in opened:
        s.close()


@pytest.mark.parametrize("alpha", [False, True], ids=["v1", "v1alpha1"])
async def test_an_offline_device_of_a_prepared_claim_is_unhealthy_until_it_is_back(
    plugin: Preparer, streams: list[Stream], short_tmp: Path, alpha: bool
) -> None:
    stream = Stream(plugin_socket(short_tmp), alpha)
    streams.append(stream)
    healthy = (v1.HEALTHY, "", HEALTH_TIMEOUT_S)
    assert await stream.next() == {KEYS[0].name: healthy, KEYS[1].name: healthy}

    # Both go offline: the prepared one is unhealthy, the other simply no longer listed.
    plugin.view.set_devices(CONFIG, {})
    report = await stream.next()
    while report != {KEYS[0].name: (v1.UNHEALTHY, OFFLINE, HEALTH_TIMEOUT_S)}:
        report = await stream.next()  # a report between the two changes

    plugin.view.set_devices(CONFIG, {key: Device(key.name) for key in KEYS})
    report = await stream.next()
    while report != {KEYS[0].name: healthy, KEYS[1].name: healthy}:
        report = await stream.next()
