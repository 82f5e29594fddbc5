"""After a switch back from DRA mode: which slots the claims still prepared on a node hold (pure).

A device-plugin-mode agent shares out an Instance's slots by its `deviceUsage` alone, on every
node the Instance lists. A claim a DRA-mode agent prepared on this node (its Pod still runs)
holds part of a device that `deviceUsage` does not show: the scheduler counted it, not the
Instance. So the agent records each such claim's share there as slots of its own node, value
`D:<claim uid>:<node>` (`naming.DraClaim`), before its device plugins start, and frees them
when the kubelet unprepares the claim. Held that way, a slot is unhealthy to this node's device
plugins (not `<node>`, which they take as theirs), held to every other node's, and never freed
by the slot reclaimer (which frees `<node>` and `C:...:<node>` only).

- A prepared device stands for an Instance by name: a slot device `<instance>-<i>` (no share
  id) or the one consumable-capacity device `<instance>` (a share id), in this node's pool of
  the Instance's namespace or in the shared Instance's own pool (`dra.names`). A slot device
  holds one slot, a consumable device as many as its allocation consumed (`slots`).
- The slots recorded are a count, not the DRA slot device's own index: the lowest free ones.
  A claim keeps the slots it was given; a claim gone gives them back. Only as many as are free
  within capacity can be recorded (`unrecorded` counts the rest, for the log: after a switch
  every holder the scheduler allowed fits).
- A claim the scheduler made for a Pod's `akri.sh/<instance>` (`PreparedClaim.counted`) is
  recorded `DX:<claim uid>:<node>`: the scheduler counts that Pod's request against the node's
  allocatable, so this node's instance plugin shows the slot healthy (shown unhealthy, it
  would be counted twice and keep a slot from use), and still no claim may take it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.slots import claimable_slots, slot_index
from akri_trio.model.naming import DraClaim, format_usage, parse_usage
from akri_trio.model.resources import Instance

if TYPE_CHECKING:
    from akri_trio.dra.checkpoint import PreparedClaim

Want = Mapping[str, int]  # claim uid -> how many slots of one Instance it holds


def device_owners(
    instances: Iterable[Instance], node: str
) -> dict[tuple[str, str, bool], ObjectKey]:
    """(pool, device, consumable) -> the Instance a device prepared on `node` stands for."""
    # Imported here: with no claim prepared (a node that never ran DRA mode) nothing of DRA is.
    from akri_trio.dra.names import device_name, node_pool, shared_pool

    out: dict[tuple[str, str, bool], ObjectKey] = {}
    for inst in instances:
        meta = inst.metadata
        if inst.spec.shared:
            pool = shared_pool(meta.namespace, meta.name)
        else:
            pool = node_pool(node, meta.namespace)
        out[(pool, device_name(meta.name), True)] = meta.key
        for i in range(max(inst.spec.capacity, 0)):
            out[(pool, device_name(meta.name, i), False)] = meta.key
    return out


def _recorded(usage: Mapping[str, str], instance: str, node: str) -> dict[str, str]:
    """`node`'s DRA claim records on slots of `instance`: slot -> claim uid."""
    out = {}
    for key, value in usage.items():
        match parse_usage(value):
            case DraClaim(claim, holder, _) if (
                holder == node and slot_index(instance, key) is not None
            ):
                out[key] = claim
    return out


def wanted(
    prepared: Mapping[str, PreparedClaim], instances: Iterable[Instance], node: str
) -> dict[ObjectKey, dict[str, int]]:
    """Instance -> claim uid -> slots it holds, for every Instance a prepared claim holds and
    every Instance that records a claim of `node` (with what it should record now, maybe
    nothing). A claim's device whose Instance is gone holds nothing left to record."""
    instances = list(instances)
    owners = device_owners(instances, node) if prepared else {}
    out: dict[ObjectKey, dict[str, int]] = {
        inst.metadata.key: {}
        for inst in instances
        if _recorded(inst.spec.device_usage, inst.metadata.name, node)
    }
    for uid, claim in sorted(prepared.items()):
        for d in claim.devices:
            key = owners.get((d.pool, d.device, d.share_id is not None))
            if key is not None:
                per = out.setdefault(key, {})
                per[uid] = per.get(uid, 0) + d.slots
    return out


def record(
    usage: Mapping[str, str],
    instance: str,
    capacity: int,
    node: str,
    want: Want,
    counted: Collection[str] = (),
) -> dict[str, str]:
    """The deviceUsage with `node`'s DRA claim records made `want`, as far as the free slots
    within capacity allow, those of the `counted` claims as such; everything else as it was.
    Never mutates `usage`."""
    new = dict(usage)
    kept: dict[str, int] = {}
    recorded = _recorded(usage, instance, node)
    for slot in sorted(recorded, key=lambda s: slot_index(instance, s) or 0):
        uid = recorded[slot]
        value = format_usage(DraClaim(uid, node, uid in counted))
        if usage[slot] == value and kept.get(uid, 0) < want.get(uid, 0):
            kept[uid] = kept.get(uid, 0) + 1
        else:
            del new[slot]
    for uid, count in sorted(want.items()):
        missing = count - kept.get(uid, 0)
        if missing <= 0:
            continue
        for slot in claimable_slots(instance, capacity, new)[:missing]:
            new[slot] = format_usage(DraClaim(uid, node, uid in counted))
    return new


def unrecorded(usage: Mapping[str, str], instance: str, node: str, want: Want) -> int:
    """How many slots of `want` `usage` does not record (no free slot was left for them)."""
    counts: dict[str, int] = {}
    for uid in _recorded(usage, instance, node).values():
        counts[uid] = counts.get(uid, 0) + 1
    return sum(max(0, n - counts.get(uid, 0)) for uid, n in want.items())
