"""The controller's DRA-mode edges: the DeviceClass and shared-pool reconcilers and the broker
claim template (the decisions are plan.py's beside it).

Both reconcilers are keyed by the cluster-scoped object's own name (`ObjectKey("", name)`), and
both the wanted side (Configurations, Instances, indexed by that name) and the written side
(our DeviceClasses and shared ResourceSlices, watched by label) map to it. So a class or pool
left behind while the controller was down (its Configuration or Instance deleted meanwhile) is
in the first list, is mapped to its own key, finds nothing that wants it, and is deleted: that
is the orphan cleanup on start, with no separate pass.

In device-plugin mode, `remove_leftovers` deletes once, as each leadership starts, the
DeviceClasses and shared pools a DRA-mode controller left (a switch back): without a class no
Pod asking for `akri.sh/...` is allocated through DRA any more, which the scheduler would do
on a node whose device plugin has no free slot to offer.

A shared pool is written by `akri_trio.dra.edge.PoolWriter`, the writer the agent's node pools
use too (`agent/dra/pool_reconciler.py`): the same round (`dra.plan_round`, the offline grace
included), the same apply-then-delete.

`Requeuer` (keyed by Pod) annotates the DeviceClass of a Pod the scheduler refused an Akri
device, so that the scheduler looks at it again (requeue.py says why and when).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Final

import attrs
import trio

from akri_trio.controller.dra.plan import (
    CLASS_INDEX,
    POOL_INDEX,
    claim_template,
    class_key,
    class_selector,
    class_up_to_date,
    class_wanted,
    hostname_of,
    instance_class_key,
    is_our_class,
    shared_pool_key,
    shared_pool_of,
    shared_pool_wanted,
    slice_selector,
)
from akri_trio.controller.dra.requeue import (
    EXTENDED_INDEX,
    REQUEUE_ANNOTATION,
    Waiting,
    extended_resource_of,
    nudge_step,
    slim_unscheduled,
)
from akri_trio.controller.lease_rules import micro_time
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.dra import DEVICE_CLASSES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES
from akri_trio.dra.edge import PoolWriter, slice_store
from akri_trio.kube import (
    AlreadyExists,
    ApiError,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    ObjectKey,
    Requeue,
    Store,
    by_field,
    drop_managed_fields,
)
from akri_trio.model.resources import Configuration, Instance

log = logging.getLogger(__name__)

LEFTOVERS = (
    "delete them with `kubectl delete deviceclasses,resourceslices -l akri.sh/namespace`, "
    "or give the controller list and delete on both"
)

FIELD_MANAGER: Final = "akri-controller"

# Added to the controller's Configuration and Instance stores in DRA mode.
CONFIGURATION_INDEXES: Final = {CLASS_INDEX: by_field(class_key)}
INSTANCE_INDEXES: Final = {
    POOL_INDEX: by_field(shared_pool_key),
    CLASS_INDEX: by_field(instance_class_key),
}


@attrs.frozen
class DraCaches:
    """Our DeviceClasses and shared ResourceSlices (watched by label: plan.class_selector,
    plan.slice_selector), and the unscheduled Pods (requeue.py)."""

    classes: Store = attrs.field(
        factory=lambda: Store(
            transform=drop_managed_fields,
            indexes={EXTENDED_INDEX: by_field(extended_resource_of)},
        )
    )
    slices: Store = attrs.field(factory=slice_store)
    unscheduled: Store = attrs.field(factory=lambda: Store(transform=slim_unscheduled))


# --- reconcilers -----------------------------------------------------------------------------


@attrs.define
class DraReconcilers:
    api: Client
    # the controller's typed caches (triggers.make_caches), indexed (CONFIGURATION_INDEXES, ...)
    configurations: Store[Configuration]
    instances: Store[Instance]
    nodes: Store
    c: DraCaches
    metrics: ControllerMetrics
    consumable: bool
    pools: PoolWriter = attrs.field(init=False)
    requeue: Requeuer = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.requeue = Requeuer(
            self.api,
            self.c.unscheduled,
            self.c.classes,
            on_write=lambda: self._count("DeviceClass", "patch"),
        )
        self.pools = PoolWriter(
            self.api,
            self.c.slices,
            field_manager=FIELD_MANAGER,
            configurations=self.configurations,
            on_write=lambda verb: self._count("ResourceSlice", verb),
        )

    def _count(self, kind: str, verb: str) -> None:
        self.metrics.writes.labels(kind=kind, verb=verb).inc()

    async def device_class(self, key: ObjectKey) -> Requeue | None:
        instances = []
        for k in self.instances.keys_for(CLASS_INDEX, key):
            instance = self.instances.get(k)
            if instance is not None:
                instances.append((k.namespace, k.name, instance.spec.configuration_name))
        wanted = class_wanted(
            [(k.namespace, k.name) for k in self.configurations.keys_for(CLASS_INDEX, key)],
            key.name,
            instances,
        )
        existing = self.c.classes.get(key)
        if wanted is None:
            if existing is not None and is_our_class(existing):
                uid = (existing.get("metadata") or {}).get("uid")
                try:
                    await self.api.delete(DEVICE_CLASSES, key.name, uid=uid)
                    log.info("deleted DeviceClass %s (no Configuration or Instance)", key.name)
                except (NotFound, Conflict):
                    pass
                self._count("DeviceClass", "delete")
            return None
        if class_up_to_date(existing, wanted):
            return None
        await self.api.apply(DEVICE_CLASSES, wanted, field_manager=FIELD_MANAGER, force=True)
        self._count("DeviceClass", "apply")
        log.info("applied DeviceClass %s", key.name)
        return None

    def _hostnames(self, instance: Instance) -> dict[str, str]:
        out: dict[str, str] = {}
        for node in instance.spec.nodes:
            obj = self.nodes.get(ObjectKey("", node))
            label = None if obj is None else hostname_of(obj)
            if label:
                out[node] = label
        return out

    async def shared_pool(self, key: ObjectKey) -> Requeue | None:
        pool = key.name
        instance: Instance | None = None
        for k in sorted(self.instances.keys_for(POOL_INDEX, key)):
            candidate = self.instances.get(k)
            if candidate is not None and shared_pool_of(candidate) == pool:
                instance = candidate
                break
        wanted = shared_pool_wanted(
            pool,
            instance,
            hostname={} if instance is None else self._hostnames(instance),
            consumable=self.consumable,
        )
        return await self.pools.publish(pool, wanted)

    async def ensure_claim_template(self, instance: Instance) -> None:
        """Create the Instance's broker claim template unless it exists (its spec is a function
        of the Instance's name and Configuration only, so an existing one is right)."""
        body = claim_template(instance)
        try:
            await self.api.create(RESOURCE_CLAIM_TEMPLATES, body, field_manager=FIELD_MANAGER)
            log.info(
                "created ResourceClaimTemplate %s/%s",
                body["metadata"]["namespace"],
                body["metadata"]["name"],
            )
        except AlreadyExists:
            pass
        self._count("ResourceClaimTemplate", "create")


async def remove_leftovers(api: Client, namespace: str | None) -> int:
    """Device-plugin mode: delete our DeviceClasses and shared pools' slices (of `namespace`,
    or all), and say how many went. Without the rights to (the chart grants none in
    device-plugin mode) it logs what to run instead."""
    deleted = 0
    for res, selector in (
        (DEVICE_CLASSES, class_selector(namespace)),
        (RESOURCE_SLICES, slice_selector(namespace)),
    ):
        try:
            found = await api.list(res, label_selector=selector)
        except NotFound:
            continue  # no resource.k8s.io/v1 on this cluster
        except Forbidden:  # the usual case in device-plugin mode: said once, not as a warning
            log.info("no right to list %s: if DRA mode left any, %s", res.plural, LEFTOVERS)
            continue
        except ApiError as exc:
            log.warning("cannot list %s left from DRA mode (%s): %s", res.plural, exc, LEFTOVERS)
            continue
        for obj in found.items:
            meta = obj.get("metadata") or {}
            try:
                await api.delete(res, meta["name"], uid=meta.get("uid"))
            except (NotFound, Conflict):
                continue
            except ApiError as exc:
                log.warning(
                    "cannot delete %s %s (%s): %s", res.plural, meta["name"], exc, LEFTOVERS
                )
                break
            deleted += 1
            log.info("deleted %s %s, left from DRA mode", res.plural, meta["name"])
    return deleted


# --- Pods the scheduler refused a device (requeue.py) ---------------------------------------


@attrs.define
class Requeuer:
    """The reconcile of one unscheduled Pod (keyed by it), reading `pods` (a store of
    `slim_unscheduled` Pods) and `classes` (our DeviceClasses, indexed by EXTENDED_INDEX)."""

    api: Client
    pods: Store
    classes: Store
    on_write: Callable[[], None] = lambda: None
    clock: Callable[[], float] = trio.current_time
    waiting: dict[ObjectKey, Waiting] = attrs.Factory(dict)
    nudged: dict[str, float] = attrs.Factory(dict)  # class name -> when last nudged

    async def pod(self, key: ObjectKey) -> Requeue | None:
        pod = self.pods.get(key)
        waits = () if pod is None else pod.get("waits") or ()
        if not waits:
            self.waiting.pop(key, None)
            return None
        now = self.clock()
        state, gap = nudge_step(self.waiting.get(key), now)
        if gap is not None:  # a write that fails on the way (no answer) is made again by the retry
            await self._nudge(self._classes(waits), key, now, gap)
        self.waiting[key] = state
        return Requeue(state.due() - now)

    def _classes(self, resources: Iterable[str]) -> set[str]:
        return {
            key.name
            for resource in resources
            for key in self.classes.keys_for(EXTENDED_INDEX, resource)
        }

    async def _nudge(self, classes: Iterable[str], pod: ObjectKey, now: float, gap: float) -> None:
        """Annotate each class not nudged within `gap` (the one nudge requeued this Pod too).
        One Pod at a time (the queue runs one worker), so two never nudge one class at once."""
        stamp = micro_time(time.time())
        for name in sorted(classes):
            if now - self.nudged.get(name, -math.inf) < gap:
                continue
            patch = {"metadata": {"annotations": {REQUEUE_ANNOTATION: stamp}}}
            try:
                await self.api.merge_patch(DEVICE_CLASSES, name, patch)
            except NotFound:
                continue
            except ApiError as exc:
                log.warning("cannot annotate DeviceClass %s to requeue %s: %s", name, pod, exc)
                continue
            self.nudged[name] = now
            self.on_write()
            log.info(
                "DeviceClass %s annotated: the scheduler refused %s a device, looking again",
                name,
                pod,
            )
