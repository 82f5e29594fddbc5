"""Configuration-level virtual devices: mapping `<config>-<n>` onto real Instance slots.

A Pod asking for `akri.sh/<config>: 2` wants two *different* devices of that Configuration. The
kubelet only knows opaque device ids, so this plugin shows it virtual devices (vdevs) and decides
at Allocate time which Instance slot each one takes (seed 000, "Configuration-level resources").
These are the pure decisions; the I/O shell reads the Instances, calls these, and writes the new
deviceUsage maps (value `C:<vdev>:<node>`) with preconditions.

Decisions worth knowing:
- Free vdevs are interchangeable placeholders, not bound to an instance. The view shows one per
  instance that has a claimable slot, with ids = the lowest `n` whose `<config>-<n>` this node
  does not hold, plus every vdev this node holds. So the ids depend only on (how many instances
  have room, which vdevs this node holds): a vdev the kubelet allocated keeps its id (it becomes
  held), and when the number of free vdevs changes only the highest free id appears/disappears.
- Allocate works per container request: vdevs this node already holds keep their slot (placed
  first, so a fresh vdev cannot steal the instance a held one needs); each fresh vdev then takes
  the lowest claimable slot of the unused instance with the most claimable slots (ties: lowest
  instance name). Not enough distinct instances -> NotEnoughInstances; nothing is partially
  claimed. Different container requests of one Allocate may share an instance.
- A held vdev whose slot is an orphan (beyond a lowered capacity) is not reused: it is released
  and mapped afresh, so a capacity cut drains. A vdev held on several slots (never produced here,
  but possible if someone edits deviceUsage) keeps the first and releases the others.
- A vdev id held by this node on an Instance the caller did not pass (the node lost it) is
  treated as free: we cannot touch that Instance, and the reclaimer frees the stale claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from akri_trio.agent.plugins.slots import (
    DeviceView,
    InstanceSlots,
    claimable_count,
    claimable_slots,
    slot_index,
)
from akri_trio.model.naming import (
    BadId,
    ConfigClaim,
    format_usage,
    parse_usage,
    split_indexed,
    vdev_id,
)


class VdevError(Exception):
    """Base of the errors a configuration-level Allocate can raise."""


class BadVdev(VdevError, ValueError):
    """The request names an id that is not a vdev of this configuration (a bad request)."""

    def __init__(self, vdev: str, reason: str) -> None:
        super().__init__(f"bad virtual device id {vdev!r}: {reason}")
        self.vdev = vdev
        self.reason = reason


class NotEnoughInstances(VdevError):
    """A container request needs more distinct instances than can serve it (seed 000: deny)."""

    def __init__(self, container: int, message: str) -> None:
        super().__init__(f"container request {container}: {message}")
        self.container = container


@attrs.frozen
class Placement:
    """Where one vdev of one container request landed."""

    vdev: str
    instance: str
    slot: str
    reused: bool  # True: this node already held the vdev on that slot; nothing new was claimed


@attrs.frozen
class AllocationPlan:
    """The outcome of a configuration-level Allocate.

    `containers[c][k]` places `container_requests[c][k]`; `usage` holds the new deviceUsage of
    every Instance whose map changed (empty: nothing to write).
    """

    containers: tuple[tuple[Placement, ...], ...]
    usage: Mapping[str, Mapping[str, str]]


def vdev_holdings(
    instances: Mapping[str, InstanceSlots], node: str
) -> dict[str, list[tuple[str, str]]]:
    """Every vdev `node` holds -> its (instance, slot) pairs, sorted (normally exactly one)."""
    held: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(instances):
        for key, value in instances[name].usage.items():
            if slot_index(name, key) is None:
                continue
            holder = parse_usage(value)
            if isinstance(holder, ConfigClaim) and holder.node == node:
                held.setdefault(holder.vdev, []).append((name, key))
    for places in held.values():
        places.sort(key=lambda p: (p[0], slot_index(*p) or 0))
    return held


def _vdev_order(vdev: str) -> tuple[int, str]:
    try:
        return split_indexed(vdev)[1], vdev
    except BadId:
        return -1, vdev


def _reusable(
    instances: Mapping[str, InstanceSlots], places: Iterable[tuple[str, str]]
) -> tuple[str, str] | None:
    """The first holding that is still a real slot (below capacity), if any."""
    for name, slot in places:
        index = slot_index(name, slot)
        if index is not None and index < instances[name].capacity:
            return name, slot
    return None


def config_devices(
    config: str, instances: Mapping[str, InstanceSlots], node: str
) -> list[DeviceView]:
    """The configuration plugin's ListAndWatch answer for `node`, ordered by vdev index.

    `instances` are the ones of `config` this node can use. All devices are healthy: upstream
    reports health per vdev only through presence.
    """
    held = vdev_holdings(instances, node)
    room = sum(
        1 for name, inst in instances.items() if claimable_count(name, inst.capacity, inst.usage)
    )
    ids = set(held)
    n = 0
    while room:
        candidate = vdev_id(config, n)
        if candidate not in held:
            ids.add(candidate)
            room -= 1
        n += 1
    return [DeviceView(v, True) for v in sorted(ids, key=_vdev_order)]


def _check_ids(config: str, container_requests: Sequence[Sequence[str]]) -> None:
    seen: set[str] = set()
    for request in container_requests:
        for vdev in request:
            try:
                name, _ = split_indexed(vdev)
            except BadId as exc:
                raise BadVdev(vdev, str(exc)) from None
            if name != config:
                raise BadVdev(vdev, f"not a virtual device of configuration {config!r}")
            if vdev in seen:
                raise BadVdev(vdev, "requested twice in one allocation")
            seen.add(vdev)


def allocate(
    instances: Mapping[str, InstanceSlots],
    container_requests: Sequence[Sequence[str]],
    node: str,
    config: str,
) -> AllocationPlan:
    """Map every vdev of every container request to an Instance slot (see module doc).

    Raises BadVdev or NotEnoughInstances; never mutates its inputs.
    """
    if not node:
        raise ValueError("node name must not be empty")
    _check_ids(config, container_requests)
    held = vdev_holdings(instances, node)
    usage = {name: dict(inst.usage) for name, inst in instances.items()}

    containers: list[tuple[Placement, ...]] = []
    for c, request in enumerate(container_requests):
        placed: dict[str, Placement] = {}
        users: dict[str, str] = {}  # instance -> the vdev of this request on it
        fresh: list[str] = []
        for vdev in request:
            places = held.get(vdev, [])
            keep = _reusable(instances, places)
            for name, slot in places:
                if (name, slot) != keep:
                    del usage[name][slot]
            if keep is None:
                fresh.append(vdev)
                continue
            name, slot = keep
            if name in users:
                raise NotEnoughInstances(
                    c,
                    f"{config} devices {users[name]!r} and {vdev!r} both hold slots of instance "
                    f"{name!r}; a container's devices must be distinct instances",
                )
            users[name] = vdev
            placed[vdev] = Placement(vdev, name, slot, reused=True)
        for vdev in fresh:
            best: tuple[int, str] | None = None
            for name in sorted(usage):
                if name in users:
                    continue
                room = claimable_count(name, instances[name].capacity, usage[name])
                if room and (best is None or room > best[0]):
                    best = (room, name)
            if best is None:
                raise NotEnoughInstances(
                    c,
                    f"asks for {len(request)} {config} devices on distinct instances but only "
                    f"{len(users)} can serve node {node!r}",
                )
            name = best[1]
            slot = claimable_slots(name, instances[name].capacity, usage[name])[0]
            usage[name][slot] = format_usage(ConfigClaim(vdev, node))
            users[name] = vdev
            placed[vdev] = Placement(vdev, name, slot, reused=False)
        containers.append(tuple(placed[v] for v in request))

    changed = {name: u for name, u in usage.items() if u != dict(instances[name].usage)}
    return AllocationPlan(tuple(containers), changed)


def free_vdevs(
    instances: Mapping[str, InstanceSlots], vdevs: Iterable[str], node: str
) -> dict[str, dict[str, str]]:
    """New deviceUsage of every Instance changed by releasing `node`'s claims for `vdevs`.

    Only `C:<vdev>:<node>` values go; a vdev this node does not hold is a no-op.
    """
    targets = set(vdevs)
    changed: dict[str, dict[str, str]] = {}
    for name, inst in instances.items():
        kept: dict[str, str] = {}
        for key, value in inst.usage.items():
            holder = parse_usage(value)
            if (
                isinstance(holder, ConfigClaim)
                and holder.node == node
                and holder.vdev in targets
                and slot_index(name, key) is not None
            ):
                continue
            kept[key] = value
        if len(kept) != len(inst.usage):
            changed[name] = kept
    return changed


def preferred_allocation(
    config: str,
    instances: Mapping[str, InstanceSlots],
    node: str,
    available: Iterable[str],
    must_include: Iterable[str],
    size: int,
) -> list[str]:
    """GetPreferredAllocation: up to `size` vdevs, `must_include` first, that `allocate` can
    place in ONE container request (so held vdevs on distinct instances, and no more fresh
    vdevs than instances left with room).

    The kubelet sends `available` in arbitrary order; the answer depends only on its set.
    Candidates are tried in a fixed preference order and kept when `allocate` would still
    succeed, so the answer can never disagree with Allocate: first vdevs this node holds on a
    real slot (reusing them needs no write), those on instances with the fewest claimable slots
    first so roomy instances stay free for fresh vdevs; then held vdevs that `allocate` would
    move (releasing their orphaned slot adds room); then fresh ones by index. When no full
    answer exists the best partial one is returned (the kubelet fills the rest itself and
    Allocate then denies); when `must_include` alone cannot be placed, just `must_include`.
    """
    chosen = list(dict.fromkeys(must_include))

    def fits(vdevs: list[str]) -> bool:
        try:
            allocate(instances, [vdevs], node, config)
        except VdevError:
            return False
        return True

    if len(chosen) >= size or not fits(chosen):
        return chosen
    held = vdev_holdings(instances, node)

    def preference(vdev: str) -> tuple[int, int, tuple[int, str]]:
        places = held.get(vdev)
        keep = _reusable(instances, places or [])
        if keep is not None:
            inst = instances[keep[0]]
            return 0, claimable_count(keep[0], inst.capacity, inst.usage), _vdev_order(vdev)
        return (1 if places else 2), 0, _vdev_order(vdev)

    candidates = sorted(set(available) - set(chosen), key=preference)
    # A later candidate (a released orphan) can make an earlier rejected one fit: sweep again
    # until nothing more fits. Each sweep adds >= 1 or ends, so at most len(candidates) sweeps.
    progress = True
    while progress and len(chosen) < size:
        progress = False
        for vdev in candidates:
            if len(chosen) >= size:
                break
            if vdev not in chosen and fits([*chosen, vdev]):
                chosen.append(vdev)
                progress = True
    return chosen
