"""The controller's DRA-mode edges: the DeviceClass and shared-pool reconcilers, the broker claim
template, and the probe that tells whether the API server takes consumable capacity.

Both reconcilers are keyed by the cluster-scoped object's own name (`ObjectKey("", name)`), and
both the wanted side (Configurations, Instances, indexed by that name) and the written side
(our DeviceClasses and shared ResourceSlices, watched by label) map to it. So a class or pool
left behind while the controller was down (its Configuration or Instance deleted meanwhile) is
in the first list, is mapped to its own key, finds nothing that wants it, and is deleted: that
is the orphan cleanup on start, with no separate pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Final

import attrs
import trio

from akri_trio import dra
from akri_trio.controller.dra import (
    claim_template,
    class_up_to_date,
    class_wanted,
    is_our_class,
    plan_shared_pool,
    shared_pool_of,
    wanted_devices,
)
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.dra import DEVICE_CLASSES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES
from akri_trio.kube import (
    JSON,
    AlreadyExists,
    ApiError,
    Backoff,
    Change,
    Client,
    Conflict,
    Mapper,
    NotFound,
    ObjectKey,
    Requeue,
    Store,
    by_field,
    drop_managed_fields,
    each,
)
from akri_trio.model.resources import Instance
from akri_trio.runtime import run_all

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "akri-controller"
PROBE_BACKOFF = Backoff(base=0.5, cap=30.0)


async def probe_consumable_capacity(api: Client) -> bool:
    """Whether the API server keeps consumable-capacity fields (a dry-run create of
    `dra.probe_slice()`); retried with backoff until it answers."""
    attempt = 0
    while True:
        try:
            answer = await api.request(
                "POST", RESOURCE_SLICES.path(), params={"dryRun": "All"}, body=dra.probe_slice()
            )
            return dra.takes_consumable_capacity(answer)
        except (ApiError, OSError) as exc:
            delay = PROBE_BACKOFF.delay(attempt)
            attempt += 1
            log.warning("consumable-capacity probe failed (%s); again in %.1f s", exc, delay)
            await trio.sleep(delay)


# --- caches ----------------------------------------------------------------------------------


def _class_key(obj: JSON, class_name: Callable[[str, str], str]) -> ObjectKey | None:
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not name or not namespace:
        return None
    return ObjectKey("", class_name(str(name), str(namespace)))


def class_key(obj: JSON) -> ObjectKey | None:
    """A Configuration's DeviceClass, as the key its reconcile runs under."""
    return _class_key(obj, dra.device_class_name)


def instance_class_key(obj: JSON) -> ObjectKey | None:
    """An Instance's DeviceClass, as the key its reconcile runs under."""
    return _class_key(obj, dra.instance_class_name)


def instance_class_keys(change: Change) -> list[ObjectKey]:
    """The class queue's mapper for Instances: their class, when one comes or goes (nothing
    else about an Instance changes its class)."""
    if change.old is not None and change.new is not None:
        return []
    return [k for k in [instance_class_key(change.old or change.new or {})] if k is not None]


def shared_pool_key(obj: JSON) -> ObjectKey | None:
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    if not spec.get("shared") or not meta.get("name"):
        return None
    return ObjectKey("", dra.shared_pool(str(meta.get("namespace") or ""), str(meta["name"])))


CLASS_INDEX: Final = "deviceclass"
POOL_INDEX: Final = "sharedpool"
# Added to the controller's Configuration and Instance stores in DRA mode.
CONFIGURATION_INDEXES: Final = {CLASS_INDEX: by_field(class_key)}
INSTANCE_INDEXES: Final = {
    POOL_INDEX: by_field(shared_pool_key),
    CLASS_INDEX: by_field(instance_class_key),
}


def pool_key(obj: JSON) -> ObjectKey | None:
    """A ResourceSlice's pool, as the key its reconcile runs under."""
    name = dra.pool_name_of(obj)
    return ObjectKey("", name) if name else None


def keys(get: Callable[[JSON], ObjectKey | None]) -> Mapper:
    """A mapper from an object to the one key `get` finds in it (old and new), if any."""
    return each(lambda obj: [k for k in [get(obj)] if k is not None])


@attrs.frozen
class DraCaches:
    """Our DeviceClasses and shared ResourceSlices (watched by label)."""

    classes: Store = attrs.field(factory=lambda: Store(transform=drop_managed_fields))
    slices: Store = attrs.field(
        factory=lambda: Store(transform=drop_managed_fields, indexes={"pool": by_field(pool_key)})
    )


def class_selector(namespace: str | None) -> str:
    """Our DeviceClasses: all, or those of one namespace's Configurations."""
    return dra.LABEL_NAMESPACE if namespace is None else f"{dra.LABEL_NAMESPACE}={namespace}"


def slice_selector(namespace: str | None) -> str:
    """The shared pools' slices (the agents' node pools are theirs)."""
    kind = f"{dra.LABEL_POOL_KIND}=shared"
    return f"{kind},{class_selector(namespace)}"


def hostname_of(node: Mapping[str, Any]) -> str | None:
    return ((node.get("metadata") or {}).get("labels") or {}).get(dra.HOSTNAME_LABEL)


# --- reconcilers -----------------------------------------------------------------------------


@attrs.define
class DraReconcilers:
    api: Client
    configurations: Store  # the controller's caches, indexed (CONFIGURATION_INDEXES, ...)
    instances: Store
    nodes: Store
    c: DraCaches
    metrics: ControllerMetrics
    consumable: bool
    read_instance: Callable[[ObjectKey], Instance | None]  # through the controller's models
    # pool -> the highest generation this controller wrote: a pool deleted and published
    # again never repeats a generation a consumer may still hold.
    written: dict[str, int] = attrs.field(factory=dict)
    offline_grace: float = dra.OFFLINE_GRACE_S
    # pool -> (the devices last wanted, the vanished ones in their offline grace): this run's
    # memory, so a restarted controller deletes at once what has no Instance.
    grace: dict[str, tuple[tuple[JSON, ...], dict[str, dra.Vanished]]] = attrs.field(factory=dict)

    def _count(self, kind: str, verb: str) -> None:
        self.metrics.writes.labels(kind=kind, verb=verb).inc()

    async def device_class(self, key: ObjectKey) -> Requeue | None:
        instances = []
        for k in self.instances.keys_for(CLASS_INDEX, key):
            instance = self.read_instance(k)
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
            candidate = self.read_instance(k)
            if candidate is not None and shared_pool_of(candidate) == pool:
                instance = candidate
                break
        existing = list(self.c.slices.select("pool", key).values())
        wanted = wanted_devices(pool, instance, consumable=self.consumable)
        previous, vanished = self.grace.pop(pool, ((), {}))
        now = trio.current_time()
        grace = self.offline_grace
        gone_with = dra.configurations_of([*previous, *(v.device for v in vanished.values())])
        if instance is None and not any(
            self.configurations.get(ObjectKey(ns, name)) for ns, name in gone_with
        ):
            grace = 0.0  # its Configuration was deleted: nothing will come back to these devices
        step = dra.hold_vanished(wanted, previous, vanished, now=now, grace=grace)
        if wanted or step.vanished:
            self.grace[pool] = (tuple(wanted), dict(step.vanished))
        plan = plan_shared_pool(
            pool,
            instance,
            existing,
            hostname={} if instance is None else self._hostnames(instance),
            consumable=self.consumable,
            written=self.written.get(pool, 0),
            held=[d for d in step.devices if d["name"] in step.vanished],
        )
        # A grace ending is a change nothing else reports: look again then.
        again = None if step.next_deadline is None else Requeue(step.next_deadline - now)
        if plan.unchanged:
            return again
        # Apply first, delete after: at every moment the highest generation is a whole pool.
        await run_all([partial(self._apply_slice, body) for body in plan.apply])
        if plan.apply:
            self.written[pool] = max(self.written.get(pool, 0), plan.generation)
            if instance is not None:
                omitted = dra.device_attributes(
                    instance.spec.configuration_name,
                    instance.metadata.namespace,
                    instance.metadata.name,
                    instance.spec.broker_properties,
                    capacities=1 if self.consumable else 0,
                ).omitted
                for o in omitted:
                    log.info("%s: property %s is no attribute (%s)", pool, o.name, o.reason)
            log.info(
                "published shared pool %s at generation %d (%d slice(s))",
                pool,
                plan.generation,
                len(plan.apply),
            )
        await run_all([partial(self._delete_slice, name) for name in plan.delete])
        return again

    async def _apply_slice(self, body: JSON) -> None:
        await self.api.apply(RESOURCE_SLICES, body, field_manager=FIELD_MANAGER, force=True)
        self._count("ResourceSlice", "apply")

    async def _delete_slice(self, name: str) -> None:
        try:
            await self.api.delete(RESOURCE_SLICES, name)
            log.info("deleted ResourceSlice %s", name)
        except NotFound:
            pass
        self._count("ResourceSlice", "delete")

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
