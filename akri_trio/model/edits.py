"""What a container gets for the Instances it was given: env vars, mounts and device nodes.

Device-plugin mode hands this to the kubelet as an Allocate response; DRA mode writes the same
thing into a CDI spec. Both build it here, so a container sees the same environment whichever
way it got its device.
"""

from __future__ import annotations

import attrs

from akri_trio.model import naming
from akri_trio.model.device import Device, DeviceSpec, Mount
from akri_trio.model.resources import Instance


@attrs.frozen
class ContainerEdits:
    """`env` in order, later keys overriding earlier ones; device nodes with a host path (an
    empty host path means "the same path as in the container", as upstream)."""

    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def instance_edits(instance: Instance, device: Device | None) -> ContainerEdits:
    """Each broker property as KEY and KEY_<HASH>, plus the discovered device's mounts and
    device nodes (`device` is None when this node has not discovered it: env only)."""
    digest = instance.spec.cdi_name.rpartition("=")[2]
    env = tuple(
        (name, value)
        for key, value in instance.spec.broker_properties.items()
        for name in naming.env_var_names(key, digest)
    )
    if device is None:
        return ContainerEdits(env)
    nodes = tuple(
        DeviceSpec(d.container_path, d.host_path or d.container_path, d.permissions)
        for d in device.device_specs
    )
    return ContainerEdits(env, device.mounts, nodes)
