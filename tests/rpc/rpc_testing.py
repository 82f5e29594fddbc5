"""Test doubles for the purerpc glue tests: a tiny real DevicePlugin servicer, a handle on
the grpcio kubelet stand-in process, and blocking grpcio calls. Imported by conftest.py and the
tests."""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import trio

from akri_trio.rpc.gen import deviceplugin_v1beta1_grpc as dp_grpc
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc

dp_grpcio: Any = deviceplugin_v1beta1_pb2_grpc  # grpcio stubs are untyped

KUBELET_SCRIPT = Path(__file__).with_name("grpcio_kubelet.py")


class Plugin(dp_grpc.DevicePluginServicer):
    """A device plugin as the agent serves it, with hooks the tests observe.

    ListAndWatch yields the initial device list, then one message per `publish` call, in order.
    """

    def __init__(self) -> None:
        self._send, self._recv = trio.open_memory_channel[list[dp.Device]](math.inf)
        self.stream_opened = trio.Event()
        self.stream_finalized = trio.Event()
        self.live_streams = 0
        self.allocations: list[list[str]] = []

    def publish(self, devices: list[dp.Device]) -> None:
        self._send.send_nowait(devices)

    async def GetDevicePluginOptions(self, input_message: dp.Empty) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, input_message: dp.Empty) -> AsyncIterator[dp.ListAndWatchResponse]:
        self.live_streams += 1
        self.stream_opened.set()
        try:
            yield dp.ListAndWatchResponse(devices=[dp.Device(ID="dev-0", health="Healthy")])
            async for devices in self._recv:
                yield dp.ListAndWatchResponse(devices=devices)
        finally:
            self.live_streams -= 1
            self.stream_finalized.set()

    async def Allocate(self, input_message: dp.AllocateRequest) -> dp.AllocateResponse:
        response = dp.AllocateResponse()
        for request in input_message.container_requests:
            ids = list(request.devices_ids)
            self.allocations.append(ids)
            response.container_responses.append(
                dp.ContainerAllocateResponse(
                    envs={"AKRI_DEV": ",".join(ids)},
                    mounts=[
                        dp.Mount(container_path="/akri", host_path="/srv/akri", read_only=True)
                    ],
                    devices=[
                        dp.DeviceSpec(
                            container_path="/dev/akri", host_path="/dev/null", permissions="rw"
                        )
                    ],
                    annotations={"akri.sh/ids": ",".join(ids)},
                )
            )
        return response


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


class Kubelet:
    """The grpcio Registration server subprocess; it prints one JSON line per Register."""

    def __init__(self, proc: trio.Process, path: Path) -> None:
        self.proc = proc
        self.path = path
        self._buffer = b""

    async def next_line(self) -> str:
        assert self.proc.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.proc.stdout.receive_some()
            if not chunk:
                raise EOFError("kubelet stand-in exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    async def next_register(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(await self.next_line())
        return record


def grpcio_status(path: Path, call: Callable[[grpc.Channel], object]) -> grpc.StatusCode:
    """Make one blocking grpcio call on a channel to `path`: its status."""
    with grpc.insecure_channel(f"unix://{path}") as channel:
        try:
            call(channel)
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            return err.code()
    return grpc.StatusCode.OK


def grpcio_allocate(path: Path, ids: list[str], compression: Any = None) -> grpc.StatusCode:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    return grpcio_status(
        path,
        lambda channel: dp_grpcio.DevicePluginStub(channel).Allocate(
            request, timeout=30, compression=compression
        ),
    )


def request_headers(method: str) -> list[tuple[str, str]]:
    """The HTTP/2 headers of a gRPC call to `method` (`/package.Service/Method`), for the
    hand-rolled HTTP/2 peers."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", "localhost"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
    ]
