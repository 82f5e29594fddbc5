"""What to undo when a node is lost: a pure plan of field removals, no writes.

A node that stops being Ready (after having been Ready) or is deleted leaves behind what its
agent owned: its entry in `Instance.spec.nodes`, its finalizer on those Instances, the
deviceUsage slots it held (`<node>` and `C:<vdev>:<node>`), what its brokers reported
(`brokerInfo` keys `<node>/<file>`) and its entry in each Configuration's `status.nodes`.
Nobody else may remove them, so the controller does it, once per loss (`node_transition` says
when).

A node can also be lost while no controller runs (or between two leaders). What a controller
that starts (or starts leading) can know about it:
- a node that Instances or Configuration statuses name (`served_nodes`) but that does not
  exist was deleted: it is cleaned like a live deletion;
- a node that exists and is NotReady: whether it was Ready before is not recorded anywhere
  (the Ready condition only says since when it is what it is). But an agent writes its node
  into an Instance only while it runs there, and it runs on a Ready node (a DaemonSet Pod is
  not scheduled onto a NotReady one), so a node named as serving something had been Ready.
  It may be NotReady only for a moment, though (its kubelet restarting during a node upgrade
  while the controller restarts too), so it is cleaned once, as upstream cleans a node it saw
  go from Ready to NotReady, only after a grace period (`--node-lost-grace`): when its Ready
  condition's lastTransitionTime is that old, or the controller has seen it NotReady for that
  long (the bound when the condition has no time or the clocks disagree). Until then it is
  looked at again when the grace ends; becoming Ready meanwhile ends the matter. (Upstream
  never cleans such a node: it only remembers it, as it does a NotReady node that serves
  nothing, a node still joining, and as this controller does too.) A node seen going from
  Ready to NotReady while the controller watches is cleaned at once, as upstream does.
A node deleted while the Node watch was away (a relist) needs none of this: the cache drops it
at the relist and tells its key as changed, so it is cleaned as a live deletion is.

In DRA mode the scheduler, not `deviceUsage`, counts a shared device's capacity: a claim holds
it while the claim is reserved for a Pod that has not ended, and a Pod on a lost node never ends
on its own (its kubelet is not there to say so; taint eviction only marks it Terminating). So
the lost node's Pods that a claim of a shared pool of ours is reserved for (`shared_claim_holders`)
are deleted with no grace period, as Kubernetes' Pod garbage collector does on a node tainted
out-of-service: their reservations end, and the device's capacity goes to Pods on the nodes that
remain, as the lost node's slots do in device-plugin mode. A controller (a Deployment, a Job)
makes its Pod again elsewhere; a kubelet that comes back stops the deleted Pods' containers.

The plan is a set of removals, rendered as RFC 6902 JSON patches that `test` each entry just
before removing it. Upstream blanks the slots to "" with a merge patch, which makes the
controller the owner of those keys under server-side apply, so the agent's next claim of the
slot conflicts with that owner; a removal leaves no owner behind. A merge patch cannot
remove one entry of a list without rewriting the list, which would overwrite an entry another
agent adds meanwhile; an index-based removal guarded by a `test` fails instead (422), and the
edge recomputes from a fresh read. An Instance whose last node was this one is deleted after
the patch, with its uid as precondition, so a recreated namesake is never touched.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs

from akri_trio.controller.observed import Delete, timestamp
from akri_trio.dra import DRIVER, is_shared_pool
from akri_trio.model import naming
from akri_trio.model.jsonpatch import pointer, remove_if_unchanged
from akri_trio.model.resources import JSON, Configuration, Instance


class NodeState(enum.Enum):
    KNOWN = "Known"  # seen, never Ready while watched
    READY = "Ready"
    CLEANED = "Cleaned"  # lost after Ready; its entries were removed


def node_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_changed_at(node: Mapping[str, Any]) -> float | None:
    """When the Node's Ready condition last changed status (Unix seconds), if it says."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            try:
                return timestamp(c.get("lastTransitionTime"))
            except (TypeError, ValueError):
                return None
    return None


@attrs.frozen
class Transition:
    """What a Node event means: the node's next state (None: forget it), whether to clean up
    after it now, and when to look at it again (seconds) when that is not decided yet."""

    state: NodeState | None
    clean: bool = False
    recheck_after: float | None = None


def node_transition(
    previous: NodeState | None,
    ready: bool | None,
    *,
    serving: bool = False,
    not_ready_for: float = math.inf,
    grace: float = 0.0,
) -> Transition:
    """The transition for a Node event; `ready` is None when it was deleted (or does not
    exist). `serving`: some Instance or Configuration status names the node;
    `not_ready_for`: seconds since its Ready condition last changed.

    A node seen NotReady before ever being Ready is not cleaned (it may be starting), unless it
    is seen for the first time while serving something (a controller that has just started:
    see the module's docstring) and has been NotReady for `grace` seconds at least (no grace:
    at once): within the grace it stays unseen and is looked at again when the grace ends.
    A deleted node is cleaned, unless that was already done."""
    if ready is None:
        return Transition(None, clean=previous is not NodeState.CLEANED)
    if ready:
        return Transition(NodeState.READY)
    if previous is NodeState.READY:
        return Transition(NodeState.CLEANED, clean=True)
    if previous is None and serving:
        if not_ready_for >= grace or grace <= 0:
            return Transition(NodeState.CLEANED, clean=True)
        return Transition(None, recheck_after=grace - max(0.0, not_ready_for))
    return Transition(previous or NodeState.KNOWN)


def served_nodes(
    instances: Iterable[Instance], configurations: Iterable[Configuration]
) -> set[str]:
    """Every node in some Instance's `nodes` or some Configuration's `status.nodes`. (Not
    deviceUsage holders: a value another tool wrote reads as an opaque holder, not a node; nor
    finalizers, which other controllers add too. A lost node's slots and finalizer go with its
    entries in `nodes`.)"""
    named: set[str] = set()
    for instance in instances:
        named.update(instance.spec.nodes)
    for configuration in configurations:
        for entry in configuration.status.get("nodes") or []:
            if isinstance(entry, dict) and isinstance(entry.get("node"), str):
                named.add(entry["node"])
    named.discard("")
    return named


def held_slots(usage: Mapping[str, str], node: str) -> dict[str, str]:
    """The deviceUsage entries held by `node`: at instance or configuration level, or by a DRA
    claim prepared there."""
    held = {}
    for slot, value in usage.items():
        match naming.parse_usage(value):
            case (
                naming.NodeClaim(holder)
                | naming.ConfigClaim(_, holder)
                | naming.DraClaim(_, holder)
            ) if holder == node:
                held[slot] = value
    return held


@attrs.frozen
class InstanceRelease:
    """The entries of one Instance that belong to the lost node. Index tuples are descending,
    so removing them in order never shifts one not yet removed."""

    namespace: str
    name: str
    uid: str
    node: str
    node_indexes: tuple[int, ...]
    finalizer_indexes: tuple[int, ...]
    slots: Mapping[str, str]
    broker_info: Mapping[str, str] = attrs.field(factory=dict)

    def json_patch(self) -> list[JSON]:
        ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": self.uid}]
        for slot, value in sorted(self.slots.items()):
            ops += remove_if_unchanged(pointer("spec", "deviceUsage", slot), value)
        for key, value in sorted(self.broker_info.items()):
            ops += remove_if_unchanged(pointer("spec", "brokerInfo", key), value)
        for i in self.node_indexes:
            ops += remove_if_unchanged(pointer("spec", "nodes", i), self.node)
        for i in self.finalizer_indexes:
            ops += remove_if_unchanged(pointer("metadata", "finalizers", i), self.node)
        return ops


@attrs.frozen
class StatusRelease:
    """The lost node's entries in a Configuration's `status.nodes` (status subresource)."""

    namespace: str
    name: str
    uid: str
    node: str
    indexes: tuple[int, ...]

    def json_patch(self) -> list[JSON]:
        ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": self.uid}]
        for i in self.indexes:
            ops.append(
                {"op": "test", "path": pointer("status", "nodes", i, "node"), "value": self.node}
            )
            ops.append({"op": "remove", "path": pointer("status", "nodes", i)})
        return ops


@attrs.frozen
class NodeLossPlan:
    instances: tuple[InstanceRelease, ...] = ()
    # Instances whose last node was the lost one: delete after their patch has been applied.
    delete: tuple[Delete, ...] = ()
    statuses: tuple[StatusRelease, ...] = ()


def _indexes(items: Iterable[Any], wanted: Any) -> tuple[int, ...]:
    return tuple(sorted((i for i, item in enumerate(items) if item == wanted), reverse=True))


def release_instance(instance: Instance, node: str) -> InstanceRelease | None:
    """The removals for `node` in `instance`, or None when it holds nothing there."""
    meta, spec = instance.metadata, instance.spec
    release = InstanceRelease(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        node=node,
        node_indexes=_indexes(spec.nodes, node),
        finalizer_indexes=_indexes(meta.finalizers, node),
        slots=held_slots(spec.device_usage, node),
        broker_info=naming.node_broker_info(spec.broker_info, node),
    )
    if release.node_indexes or release.finalizer_indexes or release.slots or release.broker_info:
        return release
    return None


def release_status(configuration: Configuration, node: str) -> StatusRelease | None:
    entries = configuration.status.get("nodes") or []
    keys = [e.get("node") if isinstance(e, dict) else None for e in entries]
    indexes = _indexes(keys, node)
    if not indexes:
        return None
    meta = configuration.metadata
    return StatusRelease(meta.namespace, meta.name, meta.uid, node, indexes)


def plan_node_loss(
    node: str, instances: Iterable[Instance], configurations: Iterable[Configuration]
) -> NodeLossPlan:
    releases: list[InstanceRelease] = []
    deletes: list[Delete] = []
    for instance in instances:
        release = release_instance(instance, node)
        if release is None:
            continue
        releases.append(release)
        others = set(instance.spec.nodes) - {node}
        if release.node_indexes and not others and instance.metadata.deletion_timestamp is None:
            meta = instance.metadata
            deletes.append(Delete(meta.namespace, meta.name, meta.uid, f"last node {node} lost"))
    statuses = (release_status(c, node) for c in configurations)
    return NodeLossPlan(tuple(releases), tuple(deletes), tuple(s for s in statuses if s))


def left_without_nodes(instance: Instance) -> Delete | None:
    """After its lost node was removed: delete `instance` if no node is left on it (and it is
    not already being deleted). The edge sends the resourceVersion it read as a precondition
    too, so an agent that adds itself meanwhile keeps the Instance."""
    meta = instance.metadata
    if instance.spec.nodes or meta.deletion_timestamp is not None:
        return None
    return Delete(meta.namespace, meta.name, meta.uid, "no node left")


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def shared_claim_holders(
    node: str, pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
) -> list[Delete]:
    """DRA mode: the Pods on the lost `node`, not ended, that a claim allocated a device of a
    shared pool of ours is reserved for, as deletions with no grace period (uid precondition:
    a namesake made meanwhile is not touched)."""
    on_node: dict[tuple[str, str], Mapping[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName") != node or not meta.get("uid"):
            continue
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        on_node[(str(meta.get("namespace", "")), str(meta["uid"]))] = pod
    holders: dict[tuple[str, str], Delete] = {}
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not any(
            r.get("driver") == DRIVER and is_shared_pool(str(r.get("pool", ""))) for r in results
        ):
            continue
        namespace = str((claim.get("metadata") or {}).get("namespace", ""))
        for consumer in status.get("reservedFor") or []:
            if consumer.get("resource") != "pods" or consumer.get("apiGroup"):
                continue
            holder = on_node.get((namespace, str(consumer.get("uid", ""))))
            if holder is not None:
                reason = f"node {node} lost, holding a shared device"
                holders[(namespace, str(consumer["uid"]))] = attrs.evolve(
                    Delete.of(holder, reason), grace_period_seconds=0
                )
    return sorted(holders.values(), key=lambda d: (d.namespace, d.name))


def freed_resources(releases: Iterable[InstanceRelease]) -> set[str]:
    """The kubelet resource names whose slots on the lost node the releases free: the
    Instance's own (`akri.sh/<instance>`) for a node claim, its Configuration's for a claim of
    a virtual device (`C:<vdev>:<node>`)."""
    names: set[str] = set()
    for release in releases:
        for value in release.slots.values():
            match naming.parse_usage(value):
                case naming.NodeClaim(_):
                    names.add(naming.resource_name(release.name))
                case naming.ConfigClaim(vdev, _):
                    try:
                        names.add(naming.resource_name(naming.split_indexed(vdev)[0]))
                    except naming.BadId:  # anyone who may write an Instance may write this
                        continue
    return names


def slot_holders(
    node: str, pods: Iterable[Mapping[str, Any]], resources: Collection[str]
) -> list[Delete]:
    """Device-plugin mode: the Pods on the lost `node`, not ended, whose containers ask for one
    of `resources` (the names whose slots on that node are being freed), as deletions with no
    grace period. A Pod on a partitioned node keeps running; once its slot is given to another
    node's Pod the device would have two users, so it is deleted (the kubelet stops it when the
    node is back), as DRA mode deletes the holders of a shared claim."""
    holders: list[Delete] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if spec.get("nodeName") != node or not meta.get("uid"):
            continue
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        asked = {
            name
            for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
            for section in ("limits", "requests")
            for name in ((container.get("resources") or {}).get(section) or {})
        }
        if asked & set(resources):
            reason = f"node {node} lost, holding a slot it freed"
            holders.append(attrs.evolve(Delete.of(pod, reason), grace_period_seconds=0))
    return sorted(holders, key=lambda d: (d.namespace, d.name))
