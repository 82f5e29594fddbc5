"""discovery.proto messages <-> the project's plain data (Device, properties).

Both ends of a Discover stream convert here: the standalone handler server (Device ->
DiscoverResponse) and the agent's client (DiscoverResponse -> Device), so a field added to one
direction cannot be forgotten in the other. Pure: protobuf messages are data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from akri_trio.model.device import Device, DeviceSpec, Mount
from akri_trio.rpc.gen import discovery_pb2 as pb


def device_to_proto(device: Device) -> pb.Device:
    return pb.Device(
        id=device.id,
        properties=dict(device.properties),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in device.mounts
        ],
        device_specs=[
            pb.DeviceSpec(
                container_path=s.container_path, host_path=s.host_path, permissions=s.permissions
            )
            for s in device.device_specs
        ],
    )


def device_from_proto(msg: pb.Device) -> Device:
    return Device(
        id=msg.id,
        properties=dict(msg.properties),
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in msg.mounts),
        device_specs=tuple(
            DeviceSpec(s.container_path, s.host_path, s.permissions) for s in msg.device_specs
        ),
    )


def response_to_proto(
    devices: Iterable[Device], problems: Iterable[str] = ()
) -> pb.DiscoverResponse:
    # `problems` is our extension (field 100): upstream agents skip it.
    return pb.DiscoverResponse(devices=[device_to_proto(d) for d in devices], problems=problems)


def response_from_proto(msg: pb.DiscoverResponse) -> list[Device]:
    return [device_from_proto(d) for d in msg.devices]


def request_to_proto(details: str, properties: Mapping[str, bytes | None]) -> pb.DiscoverRequest:
    return pb.DiscoverRequest(
        discovery_details=details,
        # ByteData.vec is `optional bytes`: an unset vec is upstream's "property without value".
        discovery_properties={
            k: pb.ByteData() if v is None else pb.ByteData(vec=v) for k, v in properties.items()
        },
    )


def properties_from_proto(msg: pb.DiscoverRequest) -> dict[str, bytes | None]:
    return {k: (v.vec if v.HasField("vec") else None) for k, v in msg.discovery_properties.items()}
