"""Which of this node's devices are healthy, for the kubelet's DRA health stream (KEP-4680).

The kubelet (ResourceHealthStatus: beta and on by default from Kubernetes 1.36) watches a
driver's `DRAResourceHealth.NodeWatchResources` stream and shows each device a container holds
in that container's `status.allocatedResourcesStatus`: under `claim:<the Pod's claim name>`,
the device's CDI id (`akri.sh/claim=<claim uid>-<i>`) Healthy, Unhealthy or Unknown, with the
message. Every message is the whole list: a device the plugin stops
listing turns Unknown once its timeout passes, as does every device when the stream stops.

Healthy: a device this node can prepare now (its Instance serves this node and this node's
discovery reports it). Unhealthy: a device of a claim prepared here that is not, as a device
that went offline (debugEcho OFFLINE, a udev device unplugged) while a Pod runs on it; its
device plugin reports the same device Unhealthy in device-plugin mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from akri_trio.dra.checkpoint import PreparedClaim
from akri_trio.dra.devices import DeviceRef

OFFLINE = "offline: its Instance is gone or this node's discovery no longer reports it"


@attrs.frozen(order=True)
class DeviceHealth:
    pool: str
    device: str
    healthy: bool
    message: str = ""


def device_health(
    usable: Mapping[str, Mapping[str, DeviceRef]], prepared: Iterable[PreparedClaim]
) -> list[DeviceHealth]:
    """Every usable device healthy, every other device of a prepared claim unhealthy, sorted."""
    out = {
        (pool, device): DeviceHealth(pool, device, True)
        for pool, devices in usable.items()
        for device in devices
    }
    for claim in prepared:
        for d in claim.devices:
            out.setdefault((d.pool, d.device), DeviceHealth(d.pool, d.device, False, OFFLINE))
    return sorted(out.values())
