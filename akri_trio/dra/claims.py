"""Reading a ResourceClaim's allocation: which of its devices are ours, and what they are.

The kubelet asks the node's plugin to prepare claims by uid; the plugin reads each claim and
must refuse devices it cannot stand behind. `resolve` maps each allocated device of driver
`akri.sh` to the Instance (and slot) it stands for, through the devices this node publishes or
may use (`usable`: pool -> device name -> DeviceRef); anything else is an error naming the
device, so the Pod's event says which device and why. A device stands for an Instance of one
namespace, and only claims of that namespace get it: DeviceClasses are cluster-scoped, so
nothing but this check keeps a claim of another namespace (allocated a device of ours through a
class or pool of its own choosing) from a namespace's devices, their properties and mounts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from akri_trio.dra.attributes import qualified
from akri_trio.dra.devices import SLOTS, DeviceRef
from akri_trio.dra.names import DRIVER, INSTANCE_CLASS_DOMAIN


class ClaimError(Exception):
    """A claim this node cannot prepare."""


class NotAllocated(ClaimError):
    pass


class WrongClaim(ClaimError):
    """The claim read back is not the one the kubelet named (uid differs: re-created)."""


class UnusableDevice(ClaimError):
    def __init__(self, pool: str, device: str, reason: str) -> None:
        super().__init__(f"device {pool}/{device}: {reason}")
        self.pool = pool
        self.device = device
        self.reason = reason


@attrs.frozen
class Allocated:
    """One allocation result of our driver; `index` is its place among all results."""

    index: int
    request: str
    pool: str
    device: str
    share_id: str | None = None  # set for a device allocated with allowMultipleAllocations
    slots: int = 1  # of a consumable device's capacity, what the allocation consumed


def consumed_slots(result: Mapping[str, Any]) -> int:
    """The slots an allocation result consumed of a consumable device: its `consumedCapacity`
    of `akri.sh/slots` (a whole number as we publish it: default 1, minimum 1), 1 for a slot
    device or a value we cannot read."""
    value = str((result.get("consumedCapacity") or {}).get(qualified(SLOTS), "1"))
    return int(value) if value.isdigit() and 0 < len(value) <= 9 and int(value) > 0 else 1


def our_results(claim: Mapping[str, Any]) -> list[Allocated]:
    """The claim's allocated devices of driver `akri.sh` (raises NotAllocated when it has no
    allocation at all)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        name = (claim.get("metadata") or {}).get("name", "?")
        raise NotAllocated(f"claim {name!r} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        Allocated(
            i,
            str(r.get("request", "")),
            str(r.get("pool", "")),
            str(r.get("device", "")),
            str(r["shareID"]) if r.get("shareID") else None,
            consumed_slots(r),
        )
        for i, r in enumerate(results)
        if r.get("driver") == DRIVER
    ]


def resolve(
    claim: Mapping[str, Any],
    uid: str,
    usable: Mapping[str, Mapping[str, DeviceRef]],
) -> list[tuple[Allocated, DeviceRef]]:
    """Every device of ours in `claim` with the Instance it stands for.

    Raises WrongClaim when `claim` is not `uid`, NotAllocated, or UnusableDevice for a device
    in a pool this node does not serve, a device that pool does not (or no longer) hold, or a
    device of an Instance in another namespace than the claim's.
    """
    meta = claim.get("metadata") or {}
    got = meta.get("uid")
    if got != uid:
        raise WrongClaim(f"claim has uid {got!r}, the kubelet asked for {uid!r}")
    out: list[tuple[Allocated, DeviceRef]] = []
    for result in our_results(claim):
        pool = usable.get(result.pool)
        if pool is None:
            raise UnusableDevice(result.pool, result.device, "pool not usable on this node")
        ref = pool.get(result.device)
        if ref is None:
            raise UnusableDevice(result.pool, result.device, "no such device (gone?)")
        if ref.namespace != meta.get("namespace"):
            raise UnusableDevice(
                result.pool,
                result.device,
                f"belongs to namespace {ref.namespace!r}, the claim is in "
                f"{meta.get('namespace')!r}",
            )
        out.append((result, ref))
    return out


EXTENDED_RESOURCE_CLAIM: Final = "resource.kubernetes.io/extended-resource-claim"


def counted_on_node(claim: Mapping[str, Any]) -> bool:
    """Whether the scheduler made `claim` for a Pod's extended resource (its annotation) and
    every request is of an Instance's class (`akri.sh/<instance>`): in device-plugin mode the
    scheduler counts such a Pod's request against the node's `akri.sh/<instance>`."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    if annotations.get(EXTENDED_RESOURCE_CLAIM) != "true":
        return False
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    classes = [str((r.get("exactly") or {}).get("deviceClassName", "")) for r in requests]
    return bool(classes) and all(c.endswith(f".{INSTANCE_CLASS_DOMAIN}") for c in classes)
