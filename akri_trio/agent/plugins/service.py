"""The kubelet-facing DevicePlugin gRPC service, for instance- and configuration-level plugins.

One servicer class speaks device-plugin v1beta1; what differs between the two kinds of plugin
(which devices exist, how an Allocate maps to slots) is a small `Behaviour` object. Both read the
node's view and claim through `Claims`, so they always agree on deviceUsage: a slot taken through
one plugin shows up as unavailable in the other on the next ListAndWatch.

Errors reach the kubelet as gRPC statuses with a message a person can act on (the kubelet puts it
in the pod's admission error): a bad id -> INVALID_ARGUMENT, a slot someone else holds ->
FAILED_PRECONDITION, too few distinct devices -> RESOURCE_EXHAUSTED, the API server unreachable ->
UNAVAILABLE (nothing was claimed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol

import purerpc
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import WorkloadDirs
from akri_trio.agent.plugins import slots, vdevs
from akri_trio.agent.plugins.claims import ClaimFailed, Claims, InstanceGone
from akri_trio.agent.plugins.slots import DeviceView, InstanceSlots
from akri_trio.agent.view import NodeView
from akri_trio.model import naming
from akri_trio.model.edits import instance_edits
from akri_trio.model.limits import KUBELET_MESSAGE_LIMIT
from akri_trio.model.resources import Instance
from akri_trio.rpc.gen import deviceplugin_v1beta1_grpc as dp_grpc
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# A ListAndWatch stream waits this long after a change before it recomputes: the Allocate that
# caused the change sends its answer first (it is on the pod's admission path; the device list
# is not), and a burst of claims costs one recomputation instead of one each.
SETTLE_S = 0.002
AllocateObserver = Callable[[str, str, float], None]  # (plugin kind, outcome, seconds)
# (plugin key, plugin kind, the device ids asked for per container, why it was refused)
RefusalObserver = Callable[[ObjectKey, str, Sequence[Sequence[str]], str], None]


class Behaviour(Protocol):
    kind: str  # "instance" | "configuration"
    resource: str  # akri.sh/<name>
    preferred_allocation: bool
    key: ObjectKey  # the view key whose changes can change `devices()`

    def devices(self) -> list[DeviceView]: ...

    async def allocate(
        self, requests: Sequence[Sequence[str]]
    ) -> list[dp.ContainerAllocateResponse]: ...

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]: ...


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _field_size(payload: int) -> int:
    """Bytes of one length-delimited protobuf field (tag < 16) carrying `payload` bytes."""
    return 1 + _varint_size(payload) + payload


def device_list_size(devices: Sequence[DeviceView]) -> int:
    """The encoded size of the ListAndWatchResponse listing `devices`."""
    return sum(_entry_size(d) for d in devices)


def _entry_size(device: DeviceView) -> int:
    health = HEALTHY if device.healthy else UNHEALTHY
    ident = _field_size(len(device.id.encode())) if device.id else 0  # proto3 omits ""
    return _field_size(ident + _field_size(len(health)))


def within_message_limit(
    devices: Sequence[DeviceView], limit: int = KUBELET_MESSAGE_LIMIT
) -> list[DeviceView]:
    """The longest head of `devices` whose ListAndWatch answer fits in `limit` bytes: the
    kubelet drops a stream whose message is over its limit, and with it every device."""
    total = 0
    for i, device in enumerate(devices):
        total += _entry_size(device)
        if total > limit:
            return list(devices[:i])
    return list(devices)


def container_response(
    placements: Sequence[Instance],
    view: NodeView,
    workloads: WorkloadDirs | None = None,
    slots: Mapping[str, Sequence[str]] | None = None,
) -> dp.ContainerAllocateResponse:
    """Env vars (each broker property as KEY and KEY_<HASH>), mounts and device nodes of the
    Instances given to one container (`model.edits`, which DRA's CDI specs share); with
    `workloads`, a brokerInfo directory per Instance (`slots`: the slots of each Instance, by
    name, that the container got)."""
    response = dp.ContainerAllocateResponse()
    for inst in placements:
        edits = instance_edits(inst, view.device(inst.metadata.key))
        response.envs.update(edits.env)
        if workloads is not None:
            mount = workloads.mount(inst, (slots or {}).get(inst.metadata.name, ()))
            if mount is not None:
                response.envs.update(mount.envs)
                response.mounts.append(
                    dp.Mount(container_path=mount.container_path, host_path=mount.host_path)
                )
        for m in edits.mounts:
            response.mounts.append(
                dp.Mount(
                    container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
                )
            )
        for d in edits.device_specs:
            response.devices.append(
                dp.DeviceSpec(
                    container_path=d.container_path,
                    host_path=d.host_path,
                    permissions=d.permissions,
                )
            )
    return response


class InstanceBehaviour:
    """`akri.sh/<instance>`: slots `<instance>-<i>`, claimed as `<node>`."""

    kind = "instance"
    preferred_allocation = True

    def __init__(
        self,
        key: ObjectKey,
        view: NodeView,
        claims: Claims,
        workloads: WorkloadDirs | None = None,
    ) -> None:
        self.workloads = workloads
        self.key = key
        self.name = key.name
        self.resource = naming.resource_name(self.name)
        self.view = view
        self.claims = claims

    def devices(self) -> list[DeviceView]:
        inst = self.view.instance(self.key)
        if inst is None:
            return []
        return slots.instance_devices(
            self.name, inst.spec.capacity, inst.spec.device_usage, self.view.node
        )

    async def allocate(
        self, requests: Sequence[Sequence[str]]
    ) -> list[dp.ContainerAllocateResponse]:
        every = [slot for request in requests for slot in request]
        inst = await self.claims.claim_slots(self.key, every)
        return [
            container_response([inst], self.view, self.workloads, {self.name: request})
            for request in requests
        ]

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        inst = self.view.instance(self.key)
        if inst is None:
            return []
        taken = slots.unclaimable(self.name, inst.spec.device_usage, available)
        free = [s for s in available if s not in taken]
        return slots.preferred_slots(
            self.name, inst.spec.capacity, inst.spec.nodes, self.view.node, free, must, size
        )


class ConfigurationBehaviour:
    """`akri.sh/<config>`: virtual devices mapped onto distinct Instances at Allocate."""

    kind = "configuration"
    preferred_allocation = True

    def __init__(
        self,
        namespace: str,
        config: str,
        view: NodeView,
        claims: Claims,
        members: Callable[[], Sequence[ObjectKey]],
        workloads: WorkloadDirs | None = None,
    ) -> None:
        self.workloads = workloads
        self.namespace = namespace
        self.config = config
        self.key = ObjectKey(namespace, config)
        self.resource = naming.resource_name(config)
        self.view = view
        self.claims = claims
        self.members = members  # instance keys this node serves for the Configuration

    def _slots(self) -> dict[str, InstanceSlots]:
        out: dict[str, InstanceSlots] = {}
        for key in self.members():
            inst = self.view.instance(key)
            if inst is not None:
                out[inst.metadata.name] = InstanceSlots(inst.spec.capacity, inst.spec.device_usage)
        return out

    def devices(self) -> list[DeviceView]:
        return vdevs.config_devices(self.config, self._slots(), self.view.node)

    async def allocate(
        self, requests: Sequence[Sequence[str]]
    ) -> list[dp.ContainerAllocateResponse]:
        plan = await self.claims.claim_vdevs(self.config, list(self.members()), requests)
        responses = []
        for placements in plan.containers:
            chosen = [self.view.instance(ObjectKey(self.namespace, p.instance)) for p in placements]
            given: dict[str, list[str]] = {}
            for p in placements:
                given.setdefault(p.instance, []).append(p.slot)
            responses.append(
                container_response(
                    [i for i in chosen if i is not None], self.view, self.workloads, given
                )
            )
        return responses

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        return vdevs.preferred_allocation(
            self.config, self._slots(), self.view.node, available, must, size
        )


def _grpc_error(exc: Exception) -> purerpc.RpcFailedError:
    match exc:
        case slots.BadSlot() | vdevs.BadVdev():
            return purerpc.InvalidArgumentError(str(exc))
        case slots.SlotTaken() | slots.OverCapacity():
            return purerpc.FailedPreconditionError(f"unable to claim slot: {exc}")
        case vdevs.NotEnoughInstances():
            return purerpc.ResourceExhaustedError(str(exc))
        case InstanceGone():
            return purerpc.NotFoundError(f"device is gone: {exc}")
        case ClaimFailed():
            return purerpc.UnavailableError(f"nothing claimed: {exc}")
    return purerpc.InternalError(f"{type(exc).__name__}: {exc}")


_OUTCOMES: Mapping[type, str] = {
    purerpc.InvalidArgumentError: "invalid",
    purerpc.FailedPreconditionError: "taken",
    purerpc.ResourceExhaustedError: "exhausted",
    purerpc.NotFoundError: "gone",
    purerpc.UnavailableError: "unavailable",
}


class DevicePluginService(dp_grpc.DevicePluginServicer):
    def __init__(
        self,
        behaviour: Behaviour,
        view: NodeView,
        observe: AllocateObserver | None = None,
        refused: RefusalObserver | None = None,
    ) -> None:
        self.behaviour = behaviour
        self.view = view
        self.observe = observe
        self.refused = refused

    def options(self) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=self.behaviour.preferred_allocation,
        )

    async def GetDevicePluginOptions(self, _: dp.Empty) -> dp.DevicePluginOptions:
        return self.options()

    async def ListAndWatch(self, _: dp.Empty) -> AsyncIterator[dp.ListAndWatchResponse]:
        """Send the device list now and again whenever it changes, until the kubelet leaves."""
        changes = self.view.changes_of(self.behaviour.key)
        version, last = -1, None
        while True:
            version = changes.version
            devices = self.behaviour.devices()
            if devices != last:
                last = devices
                fitting = within_message_limit(devices)
                if len(fitting) < len(devices):
                    log.warning(
                        "%s: %d devices do not fit in the kubelet's message limit; %d are listed",
                        self.behaviour.resource,
                        len(devices),
                        len(fitting),
                    )
                    devices = fitting
                yield dp.ListAndWatchResponse(
                    devices=[
                        dp.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY)
                        for d in devices
                    ]
                )
            await changes.wait_past(version)
            await trio.sleep(SETTLE_S)

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest
    ) -> dp.PreferredAllocationResponse:
        response = dp.PreferredAllocationResponse()
        for creq in request.container_requests:
            chosen = self.behaviour.preferred(
                list(creq.available_deviceIDs),
                list(creq.must_include_deviceIDs),
                creq.allocation_size,
            )
            response.container_responses.append(
                dp.ContainerPreferredAllocationResponse(deviceIDs=chosen)
            )
        return response

    async def Allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        started = time.monotonic()
        requests = [list(creq.devices_ids) for creq in request.container_requests]
        outcome = "ok"
        try:
            responses = await self.behaviour.allocate(requests)
            return dp.AllocateResponse(container_responses=responses)
        except Exception as exc:
            error = _grpc_error(exc)
            outcome = _OUTCOMES.get(type(error), "error")
            log.warning("Allocate %s on %s refused: %s", requests, self.behaviour.resource, exc)
            if self.refused is not None:
                self.refused(self.behaviour.key, self.behaviour.kind, requests, str(exc))
            raise error from exc
        finally:
            if self.observe is not None:
                self.observe(self.behaviour.kind, outcome, time.monotonic() - started)

    async def PreStartContainer(
        self, _: dp.PreStartContainerRequest
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()
