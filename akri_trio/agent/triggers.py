"""Which watched change wakes the agent's Configuration queue, and in DRA mode its node pools'
queue: the runner's mappers.

Each is a plain function of a change (kube's `Mapper`: change -> keys), tested without a
cluster; run.py (and DRA's pool_reconciler.py) only pass them to the runner. The Instance
mapper of the Configuration queue also tells the node view of the change (its waiters, its
overlay of our own writes), so a reconcile never reads a view older than the change that
caused it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from akri_trio.agent.status import node_entry_of
from akri_trio.agent.view import NodeView, config_key
from akri_trio.kube import Change, Mapper, ObjectKey, each
from akri_trio.model.resources import Configuration, Instance

__all__ = [
    "configuration_changed",
    "instance_changed",
    "instance_to_node_pool",
    "plan_inputs",
    "slice_to_node_pool",
]


def instance_changed(view: NodeView) -> Mapper:
    """The Instance watch's mapper (over `view.store`): tell the node view of each change, and
    reconcile the Configuration whose plan it may change. Both in one step, so a reconcile never
    reads a view older than the change that caused it."""

    def mapper(change: Change[Instance]) -> Iterable[ObjectKey]:
        before, after = view.watched(change)
        if after is None:
            return () if before is None else (config_key(before),)
        if after == before:
            return ()
        # Claims (every Allocate), brokerInfo and the other nodes' comings and goings are not
        # the plan's business: on a shared Instance they are most of the traffic.
        if before is None or plan_inputs(before, view.node) != plan_inputs(after, view.node):
            return (config_key(after),)
        return ()

    return mapper


def configuration_changed(node: str) -> Mapper:
    """The Configuration watch's mapper: reconcile on every change but the other nodes' status
    entries (N nodes each writing their own entry would make every agent reconcile N times)."""

    def mapper(change: Change[Configuration]) -> Iterable[ObjectKey]:
        old, new = change.old, change.new
        if old is None or new is None or _but_status(old) != _but_status(new):
            return (change.key,)
        if node_entry_of(old.status, node) != node_entry_of(new.status, node):
            return (change.key,)  # ours: e.g. removed by someone else
        return ()

    return mapper


def _but_status(config: Configuration) -> Configuration:
    return attrs.evolve(
        config, status={}, metadata=attrs.evolve(config.metadata, resource_version="")
    )


def plan_inputs(inst: Instance, node: str) -> Instance:
    """What `instance_plan.plan` and the status depend on: everything but deviceUsage, brokerInfo
    and which other nodes serve it (only whether this one does, and holds its finalizer)."""
    meta, spec = inst.metadata, inst.spec
    return attrs.evolve(
        inst,
        metadata=attrs.evolve(
            meta,
            resource_version="",
            generation=0,
            finalizers=tuple(f for f in meta.finalizers if f == node),
        ),
        spec=attrs.evolve(
            spec,
            device_usage={},
            broker_info={},
            nodes=tuple(n for n in spec.nodes if n == node),
        ),
    )


def instance_to_node_pool(node: str) -> Mapper:
    """DRA mode: an Instance change reconciles the node pool it is in on `node`, before or after
    the change (one that leaves the pool, or goes, reconciles the pool it left)."""
    # Imported here, as each DRA mapper's: a device-plugin agent imports no DRA module.
    from akri_trio.agent.dra.plan import node_pool_of

    def mapper(change: Change[Instance]) -> Iterable[ObjectKey]:
        pools = (node_pool_of(inst, node) for inst in (change.old, change.new) if inst)
        return {ObjectKey("", pool) for pool in pools if pool is not None}

    return mapper


def slice_to_node_pool(namespace: str | None) -> Mapper:
    """DRA mode: a change of one of the node's slices reconciles its pool when the pool is this
    agent's (`owns_slice`), so a slice someone else deletes is published again at once."""
    from akri_trio.agent.dra.plan import owns_slice
    from akri_trio.dra import pool_key

    def keys_of(obj: Mapping[str, Any]) -> Iterable[ObjectKey]:
        key = pool_key(obj) if owns_slice(obj, namespace) else None
        return () if key is None else (key,)

    return each(keys_of)
