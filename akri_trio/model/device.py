"""A discovered device, as discovery handlers report it (discovery.proto `v0.Device`).

Plain immutable data shared by the handlers (which produce it), the agent's Instance logic
(which names and publishes it) and the device plugins (which turn it into Allocate responses).
Kept free of protobuf so that the pure cores need no generated code.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@attrs.frozen
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rwm"


@attrs.frozen
class Device:
    """`id` is the handler's stable identifier (hashed into the Instance name); `properties`
    become broker env vars."""

    id: str
    properties: dict[str, str] = attrs.field(factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()
