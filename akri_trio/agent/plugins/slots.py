"""Instance-level slots: who may hold which `<instance>-<i>`, and what the kubelet is shown.

An Instance's `capacity` bounds how many containers use the device across *all* nodes, and the
only shared record of who holds what is the Instance's sparse `spec.deviceUsage` map. Every node's
agent reads it, decides, and writes it back under an optimistic-concurrency precondition. The
decisions live here, as pure functions of that map, so that thousands of random multi-node
histories can be thrown at them without a cluster, and so that the I/O shell cannot "half apply"
a claim: it gets a complete new map or a typed error, and changes its local state only after the
write holds (upstream changed local state first and never rolled it back).

Decisions worth knowing:
- Ids are strict: a slot id must be `<instance>-<i>` with `0 <= i < capacity`; anything else is a
  `BadSlot` (a bad request, not a conflict). A slot requested twice in one Allocate is a
  `BadSlot` too: two containers must never share one slot.
- Claiming a slot this node's instance-level plugin already holds is allowed and changes nothing,
  so a retried Allocate (lost response, kubelet restart) converges instead of failing (#849).
- Capacity lowered below a held slot index (upstream panics): the slot is an *orphan*. It stays
  in deviceUsage untouched (its container is still running; we never evict), is no longer shown
  to the kubelet, can no longer be claimed, and is freed normally (by `free` / the reclaimer).
  Orphans still count against capacity: while `held > capacity - free`, only
  `capacity - held` free slots are claimable (the lowest indices) and the rest are reported
  unhealthy, and a claim that would push the held count past capacity is `OverCapacity`. So
  after a capacity cut the number of users drains down to the new capacity and never grows.
- Values we cannot decode are treated as held by an opaque owner (naming.parse_usage), never as
  free; keys that are not slots of this instance are ignored and never touched. That includes
  keys shaped like a slot whose index no capacity allows (`<instance>-<5000 digits>`): they are
  "not a slot", not an error, so nobody who can write an Instance stops its plugins.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

import attrs

from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.model.naming import (
    DraClaim,
    Free,
    NodeClaim,
    Usage,
    index_after,
    parse_usage,
    slot_id,
    split_indexed,
)


class SlotError(Exception):
    """Base of the errors an instance-level claim can raise."""


class BadSlot(SlotError, ValueError):
    """The request names an id that is not a claimable slot of this instance (a bad request)."""

    def __init__(self, slot: str, reason: str) -> None:
        super().__init__(f"bad slot id {slot!r}: {reason}")
        self.slot = slot
        self.reason = reason


class SlotTaken(SlotError):
    """The slot is held by someone other than this node's instance-level plugin."""

    def __init__(self, slot: str, holder: str) -> None:
        super().__init__(f"slot {slot!r} is held by {holder!r}")
        self.slot = slot
        self.holder = holder


class OverCapacity(SlotError):
    """The claim would make more slots held than the instance's capacity (after a capacity cut)."""

    def __init__(self, instance: str, capacity: int, held: int) -> None:
        super().__init__(
            f"instance {instance!r} has capacity {capacity} but {held} slots would be held"
        )
        self.instance = instance
        self.capacity = capacity
        self.held = held


# Keys whose parse slot_index keeps: a few thousand slots of this node's Instances (~100 B each).
SLOT_CACHE_SIZE = 4096


class DeviceView(NamedTuple):
    """One kubelet device in a ListAndWatch answer."""

    id: str
    healthy: bool


@attrs.frozen
class InstanceSlots:
    """What the plugins need of one Instance: its capacity and its sparse deviceUsage."""

    capacity: int
    usage: Mapping[str, str] = attrs.field(factory=dict)


@functools.lru_cache(maxsize=SLOT_CACHE_SIZE)
def slot_index(instance: str, slot: str) -> int | None:
    """The index `i` if `slot` is `<instance>-<i>` with `i < MAX_CAPACITY`, else None
    (whatever the Instance's capacity). Anyone who may write an Instance can put any key in
    its deviceUsage: a key no capacity could ever make a slot is "not a slot", so it neither
    counts against the capacity nor stops an answer (see `poisoned_keys`).

    Cached: every claim and every ListAndWatch answer parses each key of the Instance's
    deviceUsage again (hundreds per Allocate on a device of high capacity), and the keys of
    a node's Instances are few and stable."""
    index = index_after(instance, slot)
    return index if index is not None and index < MAX_CAPACITY else None


def poisoned_keys(instance: str, usage: Mapping[str, str]) -> list[str]:
    """The deviceUsage keys of `instance` that look like its slots (`<instance>-...`) but are
    not one: ignored everywhere, reported once by the agent."""
    prefix = instance + "-"
    return sorted(k for k in usage if k.startswith(prefix) and slot_index(instance, k) is None)


def held_slots(instance: str, usage: Mapping[str, str]) -> dict[str, Usage]:
    """Every held slot of `instance` (orphans beyond capacity included) -> its holder."""
    # A key that parses as slot i is exactly `slot_id(instance, i)` (ids are canonical).
    return {slot_id(instance, i): holder for i, holder in _held_indices(instance, usage).items()}


def _held_indices(instance: str, usage: Mapping[str, str]) -> dict[int, Usage]:
    """Index -> holder of every held slot of `instance` (orphans beyond capacity included).
    Walks the sparse map once, so the cost follows the number of claims, not the capacity."""
    held: dict[int, Usage] = {}
    for key, value in usage.items():
        index = slot_index(instance, key)
        if index is not None:
            holder = parse_usage(value)
            if not isinstance(holder, Free):
                held[index] = holder
    return held


def claimable_slots(instance: str, capacity: int, usage: Mapping[str, str]) -> list[str]:
    """The free slots a new claim may take, lowest index first.

    Normally every free slot below capacity; after a capacity cut left orphans held, only as many
    as keep the held count within capacity.
    """
    held = _held_indices(instance, usage)
    budget = capacity - len(held)
    free_ids: list[str] = []
    for i in range(max(capacity, 0)):
        if len(free_ids) >= budget:
            break
        if i not in held:
            free_ids.append(slot_id(instance, i))
    return free_ids


def claimable_count(instance: str, capacity: int, usage: Mapping[str, str]) -> int:
    """`len(claimable_slots(...))` without listing them."""
    held = _held_indices(instance, usage)
    free_below = capacity - sum(1 for i in held if i < capacity)
    return max(0, min(capacity - len(held), free_below))


def claim(
    usage: Mapping[str, str],
    slot_ids: Collection[str],
    node: str,
    *,
    instance: str,
    capacity: int,
) -> dict[str, str]:
    """The deviceUsage after `node`'s instance-level plugin claims `slot_ids`.

    Pass every id of one Allocate (all container requests together) so a slot given to two
    containers is caught. Raises BadSlot, SlotTaken or OverCapacity; never mutates `usage`.
    """
    if not node:
        raise ValueError("node name must not be empty: '' means free in deviceUsage")
    seen: set[str] = set()
    for slot in slot_ids:
        index = slot_index(instance, slot)
        if index is None:
            raise BadSlot(slot, f"not a slot of instance {instance!r}")
        if index >= capacity:
            raise BadSlot(slot, f"index {index} is beyond capacity {capacity}")
        if slot in seen:
            raise BadSlot(slot, "requested twice in one allocation")
        seen.add(slot)

    mine = NodeClaim(node)
    new = dict(usage)
    claimed_any = False
    for slot in slot_ids:
        raw = usage.get(slot, "")
        holder = parse_usage(raw)
        if holder == mine:
            continue
        if not isinstance(holder, Free):
            raise SlotTaken(slot, raw)
        new[slot] = node
        claimed_any = True
    if claimed_any:
        held = len(held_slots(instance, new))
        if held > capacity:
            raise OverCapacity(instance, capacity, held)
    return new


def free(usage: Mapping[str, str], slot_ids: Iterable[str], node: str) -> dict[str, str]:
    """The deviceUsage after `node`'s instance-level plugin releases `slot_ids`.

    Only keys held by exactly this node's instance-level plugin are removed (the map is sparse);
    a slot held by anyone else, or already free, is left as it is.
    """
    targets = set(slot_ids)
    mine = NodeClaim(node)
    return {k: v for k, v in usage.items() if not (k in targets and parse_usage(v) == mine)}


def node_slots(instance: str, usage: Mapping[str, str], node: str) -> list[str]:
    """The slots of `instance` (orphans included) held by `node`'s instance-level plugin."""
    mine = NodeClaim(node)
    held = held_slots(instance, usage)
    return sorted((s for s, h in held.items() if h == mine), key=lambda s: split_indexed(s)[1])


def instance_devices(
    instance: str, capacity: int, usage: Mapping[str, str], node: str
) -> list[DeviceView]:
    """The instance plugin's ListAndWatch answer for `node`: one device per slot below capacity.

    Upstream's health rules: free -> healthy; held by this node's instance-level plugin ->
    healthy; held by another node or by any configuration-level claim -> unhealthy. Held by
    a DRA claim of this node that the scheduler counts (`counted`) -> healthy. Plus ours:
    a free slot beyond the claimable budget (capacity cut, see module doc) is unhealthy.
    """
    held = _held_indices(instance, usage)
    budget = capacity - len(held)  # how many free slots may still be claimed
    mine = NodeClaim(node)
    devices: list[DeviceView] = []
    for i in range(max(capacity, 0)):
        holder = held.get(i)
        if holder is None:
            devices.append(DeviceView(slot_id(instance, i), budget > 0))
            budget -= 1
        else:
            devices.append(
                DeviceView(slot_id(instance, i), holder == mine or counted(holder, node))
            )
    return devices


def counted(holder: Usage, node: str) -> bool:
    """A slot `node` records for a DRA claim whose Pod asked for `akri.sh/<instance>`: the
    scheduler counts that Pod's request against the node's allocatable, so the instance plugin
    shows the slot healthy (as a slot of its own), but no claim may take it."""
    return isinstance(holder, DraClaim) and holder.counted and holder.node == node


def unclaimable(instance: str, usage: Mapping[str, str], available: Iterable[str]) -> list[str]:
    """`available` without the slots held by anything but a claim of an instance plugin: what
    the kubelet may count as free (a `counted` slot) but Allocate refuses."""
    held = held_slots(instance, usage)
    return [s for s in available if isinstance(held.get(s), DraClaim)]


def preferred_slots(
    instance: str,
    capacity: int,
    nodes: Collection[str],
    node: str,
    available: Iterable[str],
    must: Iterable[str],
    size: int,
) -> list[str]:
    """The kubelet's choice among `available` slots: `must` first, then this node's own order.

    Kubelets on different nodes choose at the same moment from the same free slots; if all of
    them took the lowest ids, all but one would lose the claim. So each node starts at its own
    offset, `i * capacity // n` for its place `i` among the Instance's `n` sorted nodes, and
    goes round from there: n <= capacity nodes claiming one slot each never pick the same one.
    """
    ordered = sorted(nodes)
    place = ordered.index(node) if node in ordered else 0
    start = place * capacity // max(len(ordered), 1)
    chosen = list(dict.fromkeys(must))
    rest = [s for s in dict.fromkeys(available) if s not in chosen]

    def rank(slot: str) -> tuple[int, str]:
        index = slot_index(instance, slot)
        return ((index - start) % capacity if index is not None else capacity, slot)

    chosen += sorted(rest, key=rank)
    return chosen[: max(size, len(set(must)))]
