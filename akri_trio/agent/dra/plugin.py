"""The agent's kubelet plugin for driver `akri.sh`: registration and the DRAPlugin service.

The kubelet's plugin watcher finds `<root>/plugins_registry/akri.sh-reg.sock`, asks it GetInfo
(a DRAPlugin named `akri.sh`, served at `<root>/plugins/akri.sh/dra.sock`, versions
`v1.DRAPlugin` and `v1beta1.DRAPlugin`) and reports the outcome through
NotifyRegistrationStatus. Both services are served on the one DRA socket; v1beta1 messages are
v1's without `share_id` (same fields, same numbers), so the v1beta1 service converts by bytes
and runs the v1 code.

The optional health service (`v1.DRAResourceHealth`, and `v1alpha1.DRAResourceHealth` with the
same messages, for 1.36's kubelet) is advertised and served there too: the kubelet
(ResourceHealthStatus, on by default from 1.36) watches NodeWatchResources and shows each
allocated device's health in its containers' `allocatedResourcesStatus` (`dra.health`). The
stream sends the whole list at once, again whenever an Instance or a discovered device of the
node changes, and at least every RESEND_S (the kubelet turns a device Unknown when no report
came for HEALTH_TIMEOUT_S).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

import trio

from akri_trio.agent.dra.preparer import ClaimRef, Preparer
from akri_trio.dra import DRIVER
from akri_trio.dra.checkpoint import PreparedClaim
from akri_trio.dra.health import DeviceHealth
from akri_trio.rpc.gen import (
    dra_health_v1_grpc,
    dra_health_v1alpha1_grpc,
    dra_v1_grpc,
    dra_v1beta1_grpc,
    pluginregistration_v1_grpc,
)
from akri_trio.rpc.gen import dra_health_v1_pb2 as health_v1
from akri_trio.rpc.gen import dra_health_v1alpha1_pb2 as health_v1alpha1
from akri_trio.rpc.gen import dra_v1_pb2 as v1
from akri_trio.rpc.gen import dra_v1beta1_pb2 as v1beta1
from akri_trio.rpc.gen import pluginregistration_v1_pb2 as reg
from akri_trio.rpc.uds import DEFAULT_LIMITS, HasService, ServerLimits, serve_unix

log = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
VERSIONS: Final = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
HEALTH_TIMEOUT_S: Final = 60
RESEND_S: Final = 20.0
SETTLE_S: Final = 0.05  # a burst of changes (a Configuration's devices going) costs one report


def registration_socket(kubelet_root_dir: Path) -> Path:
    return kubelet_root_dir / "plugins_registry" / f"{DRIVER}-reg.sock"


def plugin_socket(kubelet_root_dir: Path) -> Path:
    return kubelet_root_dir / "plugins" / DRIVER / "dra.sock"


def _refs(claims: object) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in claims]  # type: ignore[attr-defined]


class DraPluginV1(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def NodePrepareResources(
        self, input_message: v1.NodePrepareResourcesRequest
    ) -> v1.NodePrepareResourcesResponse:
        answers = await self.preparer.prepare(_refs(input_message.claims))
        response = v1.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            entry = response.claims[uid]
            if not isinstance(answer, PreparedClaim):
                entry.error = answer
                continue
            for d in answer.devices:
                device = entry.devices.add(
                    request_names=list(d.requests),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
                if d.share_id is not None:
                    device.share_id = d.share_id
        return response

    async def NodeUnprepareResources(
        self, input_message: v1.NodeUnprepareResourcesRequest
    ) -> v1.NodeUnprepareResourcesResponse:
        answers = await self.preparer.unprepare(_refs(input_message.claims))
        response = v1.NodeUnprepareResourcesResponse()
        for uid, answer in answers.items():
            entry = response.claims[uid]
            if not isinstance(answer, PreparedClaim):
                entry.error = answer
        return response


class DraPluginV1beta1(dra_v1beta1_grpc.DRAPluginServicer):
    def __init__(self, v1_service: DraPluginV1) -> None:
        self.v1 = v1_service

    async def NodePrepareResources(
        self, input_message: v1beta1.NodePrepareResourcesRequest
    ) -> v1beta1.NodePrepareResourcesResponse:
        request = v1.NodePrepareResourcesRequest.FromString(input_message.SerializeToString())
        answer = await self.v1.NodePrepareResources(request)
        response = v1beta1.NodePrepareResourcesResponse()
        response.ParseFromString(answer.SerializeToString())
        return response

    async def NodeUnprepareResources(
        self, input_message: v1beta1.NodeUnprepareResourcesRequest
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        request = v1.NodeUnprepareResourcesRequest.FromString(input_message.SerializeToString())
        answer = await self.v1.NodeUnprepareResources(request)
        response = v1beta1.NodeUnprepareResourcesResponse()
        response.ParseFromString(answer.SerializeToString())
        return response


def health_response(
    devices: list[DeviceHealth], now: float
) -> health_v1.NodeWatchResourcesResponse:
    return health_v1.NodeWatchResourcesResponse(
        devices=[
            health_v1.DeviceHealth(
                device=health_v1.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                health=health_v1.HEALTHY if d.healthy else health_v1.UNHEALTHY,
                last_updated_time=int(now),
                health_check_timeout_seconds=HEALTH_TIMEOUT_S,
                message=d.message,
            )
            for d in devices
        ]
    )


class DraHealthV1(dra_health_v1_grpc.DRAResourceHealthServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def NodeWatchResources(
        self, input_message: health_v1.NodeWatchResourcesRequest
    ) -> AsyncIterator[health_v1.NodeWatchResourcesResponse]:
        changes = self.preparer.view.membership
        while True:
            seen = changes.version
            yield health_response(self.preparer.health(), time.time())
            with trio.move_on_after(RESEND_S):
                await changes.wait_past(seen)
                await trio.sleep(SETTLE_S)


class DraHealthV1alpha1(dra_health_v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, v1_service: DraHealthV1) -> None:
        self.v1 = v1_service

    async def NodeWatchResources(
        self, input_message: health_v1alpha1.NodeWatchResourcesRequest
    ) -> AsyncIterator[health_v1alpha1.NodeWatchResourcesResponse]:
        async for answer in self.v1.NodeWatchResources(health_v1.NodeWatchResourcesRequest()):
            yield health_v1alpha1.NodeWatchResourcesResponse.FromString(answer.SerializeToString())


class Registration(pluginregistration_v1_grpc.RegistrationServicer):
    def __init__(
        self,
        endpoint: Path,
        on_status: Callable[[bool, str], None],
        versions: tuple[str, ...] = VERSIONS,
    ) -> None:
        self.endpoint = endpoint
        self.on_status = on_status
        self.versions = versions

    async def GetInfo(self, input_message: reg.InfoRequest) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=list(self.versions),
        )

    async def NotifyRegistrationStatus(
        self, input_message: reg.RegistrationStatus
    ) -> reg.RegistrationStatusResponse:
        if input_message.plugin_registered:
            log.info("the kubelet registered DRA driver %s", DRIVER)
        else:
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, input_message.error)
        self.on_status(input_message.plugin_registered, input_message.error)
        return reg.RegistrationStatusResponse()


async def serve_kubelet_plugin(
    kubelet_root_dir: Path,
    preparer: Preparer,
    on_status: Callable[[bool, str], None],
    *,
    limits: ServerLimits = DEFAULT_LIMITS,
    health: bool = True,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the DRA socket, then the registration socket (the kubelet connects to the DRA
    socket as soon as it has read GetInfo), until cancelled; both files go on the way out.
    `limits`: what each connection to either may do (the agent's --grpc-* flags). Without
    `health` (a device-plugin-mode agent unpreparing what DRA mode left) the health service
    is neither advertised nor served."""
    dra_sock = plugin_socket(kubelet_root_dir)
    reg_sock = registration_socket(kubelet_root_dir)
    dra_sock.parent.mkdir(parents=True, exist_ok=True)
    reg_sock.parent.mkdir(parents=True, exist_ok=True)
    service = DraPluginV1(preparer)
    services: tuple[HasService, ...] = (service, DraPluginV1beta1(service))
    versions: tuple[str, ...] = VERSIONS
    if health:
        watch = DraHealthV1(preparer)
        services += (watch, DraHealthV1alpha1(watch))
    else:
        versions = tuple(v for v in VERSIONS if v.endswith(f".{PLUGIN_TYPE}"))
    registration = Registration(dra_sock, on_status, versions)
    async with trio.open_nursery() as nursery:
        serve = functools.partial(serve_unix, mode=0o600, limits=limits)
        await nursery.start(functools.partial(serve, dra_sock, *services))
        await nursery.start(functools.partial(serve, reg_sock, registration))
        task_status.started()
