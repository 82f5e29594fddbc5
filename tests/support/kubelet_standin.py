"""A grpcio (C-core) stand-in for the kubelet's device-plugin side, for tests and benchmarks.

It does what the kubelet does with a device plugin and nothing else: serves Registration on
`<dir>/kubelet.sock`, dials each registered plugin back on `<dir>/<endpoint>`, keeps a
ListAndWatch stream open per resource (recording every device list), and calls Allocate /
GetPreferredAllocation when asked. It is an independent gRPC implementation talking the real
protocol over real Unix sockets — used where a real kubelet cannot go (a second node on one
machine, thousands of Allocates in a benchmark). Blocking API: call it through
`trio.to_thread.run_sync` from trio code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc

dp_grpcio: Any = deviceplugin_v1beta1_pb2_grpc  # grpcio stubs are untyped

Devices = list[tuple[str, str]]  # (id, health)


class KubeletStandin:
    def __init__(self, plugin_dir: Path) -> None:
        self.dir = plugin_dir
        self.registrations: dict[str, dp.RegisterRequest] = {}
        self.devices: dict[str, Devices] = {}
        self.streams_opened: dict[str, int] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> KubeletStandin:
        self.dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        standin = self

        class Registration(dp_grpcio.RegistrationServicer):  # type: ignore[misc]
            def Register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
                standin._on_register(request)
                return dp.Empty()

        dp_grpcio.add_RegistrationServicer_to_server(Registration(), server)
        server.add_insecure_port(f"unix://{self.dir / 'kubelet.sock'}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
        for channel in self._channels.values():
            channel.close()
        (self.dir / "kubelet.sock").unlink(missing_ok=True)

    # --- the kubelet's side of the protocol -----------------------------------------------------

    def _on_register(self, request: dp.RegisterRequest) -> None:
        resource = request.resource_name
        old = self._channels.pop(resource, None)
        if old is not None:
            old.close()
        channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}")
        self._channels[resource] = channel
        with self._cond:
            self.registrations[resource] = request
            self.streams_opened[resource] = self.streams_opened.get(resource, 0) + 1
            self._cond.notify_all()
        threading.Thread(target=self._watch, args=(resource, channel), daemon=True).start()

    def _watch(self, resource: str, channel: grpc.Channel) -> None:
        stub = dp_grpcio.DevicePluginStub(channel)
        try:
            for response in stub.ListAndWatch(dp.Empty()):
                with self._cond:
                    self.devices[resource] = [(d.ID, d.health) for d in response.devices]
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # the plugin went away (or we closed the channel)
        with self._cond:
            # As the kubelet does (markResourceUnhealthy): a plugin whose stream ended offers
            # nothing until it registers again.
            if self._channels.get(resource) is channel:
                self.devices[resource] = [
                    (d, "Unhealthy") for d, _ in self.devices.get(resource, [])
                ]
                self._cond.notify_all()

    def _stub(self, resource: str) -> Any:
        return dp_grpcio.DevicePluginStub(self._channels[resource])

    def allocate(self, resource: str, container_requests: Sequence[Sequence[str]]) -> Any:
        request = dp.AllocateRequest(
            container_requests=[
                dp.ContainerAllocateRequest(devices_ids=list(ids)) for ids in container_requests
            ]
        )
        return self._stub(resource).Allocate(request, timeout=30)

    def preferred(self, resource: str, available: Sequence[str], size: int) -> list[str]:
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available), allocation_size=size
                )
            ]
        )
        response = self._stub(resource).GetPreferredAllocation(request, timeout=30)
        return list(response.container_responses[0].deviceIDs)

    # --- waiting --------------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[KubeletStandin], bool], timeout: float = 20.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout=timeout):
                raise TimeoutError(
                    f"kubelet stand-in: condition not met in {timeout}s; "
                    f"registrations={sorted(self.registrations)} devices={self.devices}"
                )

    def healthy(self, resource: str) -> list[str]:
        with self._cond:
            return [d for d, health in self.devices.get(resource, []) if health == "Healthy"]
