"""The node's pools as ResourceSlices, kept in step with the Instances: the agent's pool
reconciler, on the shared runner (kube's `Controller`), keyed by pool as the controller's
shared pools are (`controller/dra/reconcilers.py`).

Its primary store is this node's slices (watched by field: `spec.nodeName`, driver akri.sh);
the Instances are the node view's typed store (each version decoded once, capacity clamped), and
an Instance change maps to the node pool it is in (`triggers.instance_to_node_pool`), a slice
change to its pool when the pool is ours (`triggers.slice_to_node_pool`). The reconcile says
what the pool should hold (`plan.node_pools`) and `akri_trio.dra.edge.PoolWriter`, the
controller's writer too, does the rest: the offline grace (a device that leaves stays in its
pool tainted `akri.sh/offline` NoSchedule for the grace, untainted where the API server keeps
no device taints, then leaves it; one back within the grace is published untainted again; one
whose Configuration was deleted leaves at once), the
slices at a bumped generation, applied then deleted. Its own slices are watched, so a slice
someone else deletes (the kubelet wipes a node's slices when it starts, and 30 s after the
node's plugin went away) is published again at once, at a generation above every one this run
has written. The grace is remembered by this run only: a restarted agent publishes what it
finds.

Owned pools: the node pools (label `akri.sh/pool-kind=node`) on this node, of the agent's
namespace when it watches one namespace, of every namespace otherwise. One agent per node
serves DRA (`node.node_lock`): a second one, whatever namespace it watches, waits for the
first to go, so on a node with a namespace-scoped DRA agent other namespaces' local Instances
are not published.
"""

from __future__ import annotations

import functools
import logging
from typing import Final

import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.dra.plan import node_pools
from akri_trio.agent.triggers import instance_to_node_pool, slice_to_node_pool
from akri_trio.dra import (
    DRIVER,
    OFFLINE_GRACE_S,
    RESOURCE_SLICES,
    Wanted,
    node_placement,
    node_pool,
    pool_labels,
)
from akri_trio.dra.edge import PoolWriter, slice_store
from akri_trio.kube import Client, Controller, Requeue, Store, reflect
from akri_trio.model.resources import Configuration, Instance

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "akri-agent-dra"
SYNC_WARN_S: Final = 60.0  # while the first list of the slices takes longer, say so this often


class NodePoolReconciler:
    def __init__(
        self,
        api: Client,
        instances: Store[Instance],
        node: str,
        *,
        namespace: str | None,
        consumable: bool,
        configurations: Store[Configuration] | None = None,
        offline_grace: float = OFFLINE_GRACE_S,
    ) -> None:
        """`instances`: the node view's typed store (`agent.view.instance_store`: its decoder clamps
        capacity to `--max-capacity`, so slot devices beyond it are never built);
        `configurations`: the agent's Configurations, when it watches them all (see
        `PoolWriter`)."""
        self.api = api
        self.instances = instances
        self.node = node
        self.namespace = namespace
        self.consumable = consumable
        self.slices = slice_store()
        self.writer = PoolWriter(
            api,
            self.slices,
            field_manager=FIELD_MANAGER,
            configurations=configurations,
            offline_grace=offline_grace,
        )
        # No drain: a reconcile is cancel-safe (a restarted agent publishes its pools again).
        self.controller = Controller(
            self.reconcile, self.slices, drain=0, mapper=slice_to_node_pool(namespace)
        ).watches(instances, instance_to_node_pool(node))

    def wanted(self, pool: str) -> Wanted | None:
        """What `pool` should hold now (None: nothing of this node's Instances)."""
        mine = [
            inst
            for inst in self.instances.values()
            if node_pool(self.node, inst.metadata.namespace) == pool
            and (self.namespace is None or inst.metadata.namespace == self.namespace)
        ]
        desired = node_pools(mine, self.node, consumable=self.consumable)
        if pool not in desired:
            return None
        namespace, devices = desired[pool]
        return Wanted(devices, node_placement(self.node), pool_labels("node", namespace))

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        return await self.writer.publish(key.name, self.wanted(key.name))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch this node's slices and reconcile its pools until cancelled; started once the
        first list of the slices is in and every pool has been mapped."""
        selector = f"spec.nodeName={self.node},spec.driver={DRIVER}"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(
                    reflect, self.api, RESOURCE_SLICES, self.slices, field_selector=selector
                )
            )
            # No deadline: the watch retries with backoff while the API server cannot answer.
            while not self.slices.synced:
                with trio.move_on_after(SYNC_WARN_S):
                    await self.slices.wait_synced()
                if not self.slices.synced:
                    log.warning("this node's ResourceSlices are not listed yet; still trying")
            await nursery.start(self.controller.run)
            task_status.started()
