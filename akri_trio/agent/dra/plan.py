"""Which pools this node's agent publishes, and which devices it may prepare (pure).

- Published: one pool per namespace (`dra.node_pool`) of the non-shared Instances that list
  this node. Shared Instances are the controller's to publish. The pool reconciler
  (pool_reconciler.py) is keyed by pool: `node_pool_of` is the pool an Instance maps to,
  `owns_slice` says which of the node's slices are this agent's.
- Preparable ("usable on this node"): a device of such a node pool, or of the shared pool of a
  shared Instance that lists this node, when this node's discovery currently reports the
  Instance's device (its mounts and device nodes come from there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from akri_trio.address import ObjectKey
from akri_trio.dra import (
    LABEL_NAMESPACE,
    LABEL_POOL_KIND,
    DeviceRef,
    PoolDevices,
    node_pool,
    pool_devices,
    shared_pool,
)
from akri_trio.model.resources import Instance


def serves(inst: Instance, node: str) -> bool:
    return node in inst.spec.nodes and inst.metadata.deletion_timestamp is None


def node_pool_of(inst: Instance, node: str) -> str | None:
    """The node pool an Instance (as the API holds it) is in on `node`: its namespace's, when it
    is not shared and lists the node (being deleted or not: it is leaving that pool)."""
    if inst.spec.shared or node not in inst.spec.nodes:
        return None
    return node_pool(node, inst.metadata.namespace)


def owns_slice(obj: Mapping[str, Any], namespace: str | None) -> bool:
    """Whether a slice of this node is this agent's: a node pool's, of its namespace when it
    watches one (any namespace's otherwise)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_POOL_KIND) != "node":
        return False
    return namespace is None or labels.get(LABEL_NAMESPACE) == namespace


def node_pools(
    instances: Iterable[Instance], node: str, *, consumable: bool
) -> dict[str, tuple[str, PoolDevices]]:
    """pool name -> (namespace, its devices), for every namespace with a non-shared Instance
    this node serves."""
    by_namespace: dict[str, list[Instance]] = {}
    for inst in instances:
        if not inst.spec.shared and serves(inst, node):
            by_namespace.setdefault(inst.metadata.namespace, []).append(inst)
    return {
        node_pool(node, ns): (ns, pool_devices(insts, consumable=consumable))
        for ns, insts in sorted(by_namespace.items())
    }


def usable_devices(
    instances: Iterable[Instance],
    node: str,
    discovered: Callable[[ObjectKey], bool],
    *,
    consumable: bool,
) -> dict[str, dict[str, DeviceRef]]:
    """pool -> device name -> DeviceRef, for the devices this node can prepare now."""
    mine = [i for i in instances if serves(i, node) and discovered(i.metadata.key)]
    usable = {
        pool: dict(devices.refs)
        for pool, (_, devices) in node_pools(mine, node, consumable=consumable).items()
    }
    for inst in mine:
        if inst.spec.shared:
            pool = shared_pool(inst.metadata.namespace, inst.metadata.name)
            usable[pool] = dict(pool_devices([inst], consumable=consumable).refs)
    return usable
