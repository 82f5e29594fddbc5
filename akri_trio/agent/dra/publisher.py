"""The node's pools as ResourceSlices, kept in step with the Instances (the I/O edge).

Woken by any change of the Instances or of this node's slices, it plans every pool it owns with
`dra.plan_pool` and writes the plan: slices by server-side apply (they are whole objects we
own), then deletions. Its own slices are watched, so a slice someone else deletes — the kubelet
wipes a node's slices when it starts, and 30 s after the node's plugin went away — is published
again at once, at a generation above every one this run has written.

A device that leaves (its Instance went: the device vanished from discovery) stays in its pool
tainted `akri.sh/offline` NoSchedule for the offline grace (`dra.offline`), then leaves it; one
back within the grace is published untainted again. The grace is remembered by this run only:
a restarted agent publishes what it finds.

Owned pools: the node pools (label `akri.sh/pool-kind=node`) on this node, of the agent's
namespace when it watches one namespace, of every namespace otherwise. One agent per node
serves DRA (`node.node_lock`): a second one, whatever namespace it watches, waits for the
first to go, so on a node with a namespace-scoped DRA agent other namespaces' local Instances
are not published.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable

import httpx
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.dra.pools import node_pools
from akri_trio.agent.view import with_capacity_at_most
from akri_trio.dra import (
    DRIVER,
    LABEL_NAMESPACE,
    LABEL_POOL_KIND,
    OFFLINE_GRACE_S,
    RESOURCE_SLICES,
    Omitted,
    PoolPlan,
    Vanished,
    generation_of,
    hold_vanished,
    node_placement,
    plan_pool,
    pool_labels,
    pool_name_of,
)
from akri_trio.kube import JSON, ApiError, Backoff, Client, NotFound, Store, drop_managed_fields
from akri_trio.kube.store import reflect
from akri_trio.model.convert import structure
from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.model.resources import Instance
from akri_trio.runtime import Changed

log = logging.getLogger(__name__)

FIELD_MANAGER = "akri-agent-dra"
SETTLE_S = 0.05  # a burst of Instance changes costs one round of writes
RESYNC_S = 300.0  # replan now and then even when nothing woke us (cheap: no writes if equal)
CATCH_UP_S = 10.0  # how long to wait for the slice watch to show our own writes
SYNC_WARN_S = 60.0  # while the first list of the slices takes longer, say so this often


class NodePoolPublisher:
    def __init__(
        self,
        api: Client,
        instances: Store,
        node: str,
        *,
        namespace: str | None,
        consumable: bool,
        max_capacity: int = MAX_CAPACITY,
        offline_grace: float = OFFLINE_GRACE_S,
    ) -> None:
        self.api = api
        self.max_capacity = max_capacity  # an Instance over it is published with this many
        self.instances = instances
        self.node = node
        self.namespace = namespace
        self.consumable = consumable
        self.slices = Store(transform=drop_managed_fields)
        self.written: dict[str, int] = {}  # pool -> highest generation written by this run
        self.rounds = 0  # completed publishing rounds (tests wait on it)
        self._omitted: dict[str, tuple[Omitted, ...]] = {}
        # key -> (resourceVersion, the Instance decoded from it): each version decoded once
        self._decoded: dict[ObjectKey, tuple[str, Instance | None]] = {}
        self._dirty = Changed()
        self._published = Changed()
        self.offline_grace = offline_grace
        # pool -> (its namespace, the devices last wanted, the vanished ones in their grace)
        self._grace: dict[str, tuple[str, tuple[JSON, ...], dict[str, Vanished]]] = {}
        self._deadline = float("inf")  # when the next vanished device's grace ends

    def _instances(self) -> list[Instance]:
        decoded = {}
        for key, obj in self.instances.snapshot().items():
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            held = self._decoded.get(key)
            if held is not None and version and held[0] == version:
                decoded[key] = held
                continue
            try:
                inst = structure(obj, Instance)
                # The node view logs the clamp; slot devices beyond it would be as many objects.
                decoded[key] = (version, with_capacity_at_most(inst, self.max_capacity))
            except Exception as exc:  # one bad object must not stop the node's publishing
                log.warning("skipping an Instance the model cannot read: %s", exc)
                decoded[key] = (version, None)
        self._decoded = decoded
        return [inst for _, inst in decoded.values() if inst is not None]

    def _owned(self, obj: JSON) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_POOL_KIND) != "node":
            return False
        return self.namespace is None or labels.get(LABEL_NAMESPACE) == self.namespace

    def plans(self) -> list[tuple[str, PoolPlan]]:
        """What to write now, per pool (from the two caches and the offline grace it keeps)."""
        desired = node_pools(self._instances(), self.node, consumable=self.consumable)
        if self.namespace is not None:
            desired = {p: v for p, v in desired.items() if v[0] == self.namespace}
        existing: dict[str, list[JSON]] = {}
        namespaces = {pool: ns for pool, (ns, _) in desired.items()}
        for obj in self.slices.snapshot().values():
            if self._owned(obj):
                pool = pool_name_of(obj)
                existing.setdefault(pool, []).append(obj)
                labels = (obj.get("metadata") or {}).get("labels") or {}
                namespaces.setdefault(pool, str(labels.get(LABEL_NAMESPACE, "")))
        for _, pool_devices in desired.values():
            self._report_omitted(pool_devices.omitted.items())
        for pool, (namespace, _, vanished) in self._grace.items():
            if vanished:
                namespaces.setdefault(pool, namespace)
        plans = []
        now, self._deadline = trio.current_time(), float("inf")
        for pool in sorted(namespaces):
            wanted = desired[pool][1].devices if pool in desired else ()
            _, previous, vanished = self._grace.get(pool, ("", (), {}))
            held = hold_vanished(wanted, previous, vanished, now=now, grace=self.offline_grace)
            self._grace[pool] = (namespaces[pool], wanted, dict(held.vanished))
            if held.next_deadline is not None:
                self._deadline = min(self._deadline, held.next_deadline)
            plan = plan_pool(
                pool,
                held.devices,
                node_placement(self.node),
                existing.get(pool, []),
                labels=pool_labels("node", namespaces[pool]),
                written=self.written.get(pool, 0),
            )
            if not plan.unchanged:
                plans.append((pool, plan))
        return plans

    def _report_omitted(self, items: Iterable[tuple[str, tuple[Omitted, ...]]]) -> None:
        for instance, omitted in items:
            if self._omitted.get(instance) != omitted:
                self._omitted[instance] = omitted
                log.info(
                    "Instance %s: properties left out of its DRA attributes: %s",
                    instance,
                    "; ".join(f"{o.name} ({o.reason})" for o in omitted),
                )

    async def _write(self, pool: str, plan: PoolPlan) -> None:
        for body in plan.apply:
            await self.api.apply(RESOURCE_SLICES, body, field_manager=FIELD_MANAGER, force=True)
        for name in plan.delete:
            with contextlib.suppress(NotFound):
                await self.api.delete(RESOURCE_SLICES, name)
        self.written[pool] = max(self.written.get(pool, 0), plan.generation)
        log.info(
            "pool %s: generation %d, %d slice(s) written, %d deleted",
            pool,
            plan.generation,
            len(plan.apply),
            len(plan.delete),
        )
        # Plan the next round from a cache that holds these writes, or it would write again.
        with trio.move_on_after(CATCH_UP_S):
            for body in plan.apply:
                await self.slices.wait_for(
                    ObjectKey("", body["metadata"]["name"]),
                    lambda o: o is not None and generation_of(o) >= plan.generation,
                )
            for name in plan.delete:
                await self.slices.wait_for(ObjectKey("", name), lambda o: o is None)

    async def publish_once(self) -> None:
        for pool, plan in self.plans():
            await self._write(pool, plan)
        self.rounds += 1
        self._published.bump()

    async def wait_published(self) -> None:
        """Until the next publishing round completes (tests)."""
        await self._published.wait_past(self._published.version)

    def wake(self) -> None:
        self._dirty.bump()

    async def _wake_on(self, store: Store) -> None:
        with store.subscribe() as changes:
            async for _ in changes:
                self.wake()

    async def _resync(self) -> None:
        while True:
            await trio.sleep(RESYNC_S)
            self.wake()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
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
            nursery.start_soon(self._wake_on, self.instances)
            nursery.start_soon(self._wake_on, self.slices)
            nursery.start_soon(self._resync)
            backoff, attempt = Backoff(), 0
            self.wake()
            task_status.started()
            seen = 0
            while True:
                with trio.move_on_at(self._deadline):  # a grace ending is a change too
                    seen = await self._dirty.wait_past(seen)
                await trio.sleep(SETTLE_S)
                try:
                    await self.publish_once()
                    attempt = 0
                except (ApiError, httpx.HTTPError) as exc:
                    delay = backoff.delay(attempt)
                    attempt += 1
                    log.warning(
                        "publishing the node's ResourceSlices failed (%s); again in %.1f s",
                        exc,
                        delay,
                    )
                    await trio.sleep(delay)
                    self.wake()
