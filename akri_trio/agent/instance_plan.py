"""Which Instance writes this node's agent must make, as a pure function.

The agent of a node owns exactly two things in an Instance: its entry in `spec.nodes` and its
finalizer (plus the spec fields every node derives identically from the Configuration and the
device). Everything here is decided from the discovery result and the Instances already in the
cluster (the watch cache), so a restarted agent recomputes the same plan and nothing has to be
remembered. A result equal to what the cluster already shows produces no operation at all:
upstream re-applies every Instance on every reconcile, which at fleet scale is the apiserver's
load.

Writes use server-side apply under the field manager `<node>` (deviceUsage has its own manager,
see plugins). `nodes` is a set and `metadata.finalizers` too, so each node owns exactly its own
element of each, and leaving is "apply a body with an empty `nodes` and no finalizer": the
server removes what only this node owned and keeps what other nodes own. That needs no
resourceVersion, so any number of nodes join and leave one Instance at once, each with one
request and no conflict. The body carries the Instance's uid: an apply naming a uid that no
object has is refused (409), even where the object is gone, so a late leave never re-creates a
deleted Instance. It also restates, without `force`, the
required spec fields with the values read, so the last node's leave is accepted like any other
(it leaves an Instance with no node) and that node then deletes it, once, with uid and
resourceVersion preconditions: N nodes leaving cost N applies and one delete. Only departures
decided from a fresh read after a refused leave are guarded by a resourceVersion (see
`Guarded`). A guarded write is a JSON patch, never an apply: the API server creates a missing
object from an apply even when it carries a resourceVersion (a uid it does check).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import attrs

from akri_trio.discovery.device_rules import shown
from akri_trio.model import naming
from akri_trio.model.device import Device
from akri_trio.model.resources import JSON, Configuration, Instance


class Found(Protocol):
    """A discovered device and whether its handler shares it across nodes."""

    @property
    def device(self) -> Device: ...

    @property
    def shared(self) -> bool: ...


@attrs.frozen
class Apply:
    """Server-side apply `body` (field manager = node): create, join, or update fields."""

    name: str
    body: JSON


@attrs.frozen
class Leave:
    """Drop this node's `nodes` entry and finalizer: apply `body` (see `leave_body`).

    It is refused (409) only when the Instance is gone or was replaced (the uid), or when a
    required field changed since it was read; the caller then decides again from a fresh read
    (`guarded_departure`)."""

    name: str
    body: JSON


@attrs.frozen
class Guarded:
    """A departure decided from a read (`read`) and guarded by its resourceVersion: a JSON patch
    (`ops`, possibly empty) that `test`s the resourceVersion and removes this node's finalizer
    (and, when others stay, its `nodes` entry) — refused with 422 if anyone wrote since, 404 if
    it is gone, never a creation; then, when `delete` (this node was the last one), delete the
    Instance with the uid and resourceVersion the patch left."""

    name: str
    ops: list[JSON]
    delete: bool
    read: Instance


Operation = Apply | Leave | Guarded


def instance_name_for(config_name: str, device_id: str, shared: bool, node: str) -> str:
    return naming.instance_name(
        config_name, naming.device_hash(device_id, None if shared else node)
    )


def broker_properties(device: Device, config: Configuration) -> dict[str, str]:
    """Device properties merged with the Configuration's; the Configuration wins on a clash."""
    return {**device.properties, **config.spec.broker_properties}


def _owner_reference(config: Configuration) -> JSON:
    return {
        "apiVersion": config.api_version,
        "kind": config.kind,
        "name": config.metadata.name,
        "uid": config.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _spec(config: Configuration, found: Found, node: str) -> JSON:
    digest = naming.device_hash(found.device.id, None if found.shared else node)
    return {
        "configurationName": config.metadata.name,
        "cdiName": naming.cdi_name(config.metadata.name, digest),
        "capacity": config.spec.capacity,
        "brokerProperties": broker_properties(found.device, config),
        "shared": found.shared,
    }


def desired_body(config: Configuration, found: Found, node: str) -> JSON:
    name = instance_name_for(config.metadata.name, found.device.id, found.shared, node)
    return {
        "apiVersion": naming.API_VERSION,
        "kind": "Instance",
        "metadata": {
            "name": name,
            "namespace": config.metadata.namespace,
            "ownerReferences": [_owner_reference(config)],
            "finalizers": [node],
        },
        "spec": {**_spec(config, found, node), "nodes": [node]},
    }


def _up_to_date(existing: Instance, config: Configuration, found: Found, node: str) -> bool:
    spec = _spec(config, found, node)
    meta = existing.metadata
    owned_by_config = any(
        ref.get("uid") == config.metadata.uid and ref.get("controller")
        for ref in meta.owner_references
    )
    return (
        node in existing.spec.nodes
        and node in meta.finalizers
        and owned_by_config
        and existing.spec.configuration_name == spec["configurationName"]
        and existing.spec.cdi_name == spec["cdiName"]
        and existing.spec.capacity == spec["capacity"]
        and existing.spec.broker_properties == spec["brokerProperties"]
        and existing.spec.shared == spec["shared"]
    )


@attrs.frozen
class Assignment:
    """Which discovered device each Instance name stands for, and the hash collisions met."""

    devices: dict[str, Found]
    collisions: tuple[str, ...] = ()


def assign(
    node: str, config: Configuration, discovered: Iterable[Found], existing: Mapping[str, Instance]
) -> Assignment:
    """Instance name -> the one device it stands for. An Instance's name holds 24 bits of its
    device id's hash, so two ids can share it; then one device wins, the same one for the plan
    (whose properties the Instance carries) and for the plugin (whose mounts and device nodes
    Allocate hands out): the device the existing Instance already describes (its broker
    properties), else the lowest id. The loser is reported, never served."""
    groups: dict[str, list[Found]] = {}
    for found in discovered:
        name = instance_name_for(config.metadata.name, found.device.id, found.shared, node)
        groups.setdefault(name, []).append(found)
    chosen: dict[str, Found] = {}
    collisions: list[str] = []
    for name, candidates in sorted(groups.items()):
        candidates.sort(key=lambda f: f.device.id)
        winner = candidates[0]
        current = existing.get(name)
        if current is not None and len(candidates) > 1:
            described = [
                f
                for f in candidates
                if broker_properties(f.device, config) == current.spec.broker_properties
            ]
            winner = described[0] if described else winner
        chosen[name] = winner
        losers = [f.device.id for f in candidates if f is not winner]
        if losers:
            collisions.append(
                f"device ids {', '.join(shown(i) for i in losers)} hash to Instance {name} "
                f"as {shown(winner.device.id)} does; only {shown(winner.device.id)} is used"
            )
    return Assignment(chosen, tuple(collisions))


def plan(
    node: str,
    config: Configuration,
    discovered: Iterable[Found],
    existing: Mapping[str, Instance],
) -> list[Operation]:
    """The writes that make the cluster agree with this node's discovery for `config`.

    `existing` holds the cluster's Instances of this Configuration (by name). An Instance being
    deleted is never joined again: this node leaves it (dropping its finalizer), and the device,
    if still present, comes back as a new Instance once the old one is gone.
    """
    ops: list[Operation] = []
    wanted = assign(node, config, discovered, existing).devices
    for name, found in sorted(wanted.items()):
        current = existing.get(name)
        if current is not None and current.metadata.deletion_timestamp is not None:
            if node in current.metadata.finalizers:
                ops.append(Leave(name, leave_body(current)))
            continue
        if current is None or not _up_to_date(current, config, found, node):
            ops.append(Apply(name, desired_body(config, found, node)))
    for name, current in sorted(existing.items()):
        if name in wanted or current.spec.configuration_name != config.metadata.name:
            continue
        if node in current.spec.nodes or node in current.metadata.finalizers:
            ops.append(departure(current, node))
    return ops


def in_node_order(ops: Sequence[Operation], node: str) -> list[Operation]:
    """`ops` (in the plan's name order) rotated to start at a place that depends on `node`
    only, so nodes writing the same shared Instances at the same moment start on different
    ones instead of all queueing on the first."""
    if not ops:
        return []
    start = zlib.crc32(node.encode()) % len(ops)
    return [*ops[start:], *ops[:start]]


def departure(current: Instance, node: str) -> Leave | Guarded:
    """How this node stops serving `current`: leave it to the others (or to the garbage
    collector deleting it), or, as the last node, remove it."""
    others = set(current.spec.nodes) - {node}
    if current.metadata.deletion_timestamp is not None or others:
        return Leave(current.metadata.name, leave_body(current))
    return Guarded(current.metadata.name, guarded_ops(current, node, False), True, current)


def guarded_departure(current: Instance, node: str) -> Guarded:
    """The same decision from a fresh read, every write guarded by its resourceVersion."""
    others = set(current.spec.nodes) - {node}
    if current.metadata.deletion_timestamp is not None:
        return Guarded(current.metadata.name, guarded_ops(current, node, False), False, current)
    if others:
        return Guarded(current.metadata.name, guarded_ops(current, node, True), False, current)
    return Guarded(current.metadata.name, guarded_ops(current, node, False), True, current)


def guarded_ops(current: Instance, node: str, drop_entry: bool) -> list[JSON]:
    """JSON patch removing this node's finalizer (and its `nodes` entry when `drop_entry`) from
    `current` as read, after testing nothing changed since; empty when there is nothing to
    remove. The last node keeps its entry: the Instance is deleted next."""
    removals = [
        {"op": "remove", "path": f"{path}/{items.index(node)}"}
        for path, items, wanted in (
            ("/metadata/finalizers", current.metadata.finalizers, True),
            ("/spec/nodes", current.spec.nodes, drop_entry),
        )
        if wanted and node in items
    ]
    if not removals:
        return []
    test = {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": current.metadata.resource_version,
    }
    return [test, *removals]


def leave_body(current: Instance) -> JSON:
    """Names the Instance by uid (so it can never create one) and states an empty `nodes` and
    no finalizer: this node's entry and finalizer go, every field other nodes own stays. It
    keeps a share of the required spec fields and of the Configuration's owner reference, with
    the values read, so the last node's leave leaves a valid Instance, still owned by its
    Configuration, for that node to delete."""
    meta, spec = current.metadata, current.spec
    metadata: JSON = {"name": meta.name, "namespace": meta.namespace}
    body: JSON = {"apiVersion": naming.API_VERSION, "kind": "Instance", "metadata": metadata}
    if not meta.uid:  # never read from the server: no field that could make it a creation
        return {**body, "spec": {"nodes": []}}
    metadata["uid"] = meta.uid
    owners = [ref for ref in meta.owner_references if ref.get("controller")]
    if owners:
        metadata["ownerReferences"] = owners
    return {
        **body,
        "spec": {
            "configurationName": spec.configuration_name,
            "cdiName": spec.cdi_name,
            "capacity": spec.capacity,
            "nodes": [],
        },
    }
