"""What the controller's caches keep and which cache changes wake which reconciler.

The caches hold only what the decisions read (`slim_pod`, `slim_job`, `slim_node`): a busy
kubelet's status updates then change nothing in the cache and wake nobody. Instances and
Configurations are decoded to the model on the way in (`Store[Instance]`), so their mappers read
typed changes; every index files objects by their JSON. A trigger (a
`Mapper` of akri_trio.kube's runner: a change -> the keys it concerns) turns a change of a
watched object into the keys of the objects whose reconcile reads it, through the stores'
indexes (`make_caches`); a change that cannot alter a reconcile's outcome (an agent's status
write, a Pending broker being scheduled) maps to no key. Each is a plain function of the change
and the caches, tested without a cluster; run.py only passes them to the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, TypeVar

from akri_trio.controller.dra.plan import shared_pool_of
from akri_trio.controller.dra.reconcilers import CONFIGURATION_INDEXES, INSTANCE_INDEXES
from akri_trio.controller.reconcilers import Caches, label_key
from akri_trio.controller.services import configuration_of
from akri_trio.dra import HOSTNAME_LABEL, device_class_name, instance_class_name
from akri_trio.kube import (
    JSON,
    Change,
    Mapper,
    ObjectKey,
    Store,
    by_field,
    drop_managed_fields,
    each,
)
from akri_trio.model import naming
from akri_trio.model.convert import structure
from akri_trio.model.resources import Configuration, Instance

T = TypeVar("T")

__all__ = [
    "config_of",
    "configuration_key",
    "configuration_to_class",
    "configuration_to_instances",
    "instance_class_keys",
    "instance_to_configuration",
    "instance_to_services",
    "instance_to_shared_pool",
    "keys",
    "labelled",
    "make_caches",
    "name_label",
    "never",
    "pod_to_services",
    "service_configuration",
    "service_to_configurations",
    "slim_job",
    "slim_node",
    "slim_pod",
    "through",
    "when_changed",
]

# --- what the caches keep --------------------------------------------------------------------

_META = ("name", "namespace", "uid", "labels", "ownerReferences", "resourceVersion")
_POD_META = (*_META, "creationTimestamp", "deletionTimestamp")


def _slim_meta(obj: Mapping[str, Any], keep: Iterable[str]) -> JSON:
    meta = obj.get("metadata") or {}
    return {k: meta[k] for k in keep if k in meta}


def slim_pod(obj: JSON) -> JSON:
    """What ObservedPod and the mappers read of a Pod."""
    status = obj.get("status") or {}
    claims = [{"name": c.get("name")} for c in (obj.get("spec") or {}).get("resourceClaims") or []]
    slim: JSON = {
        "metadata": _slim_meta(obj, _POD_META),
        "status": {k: status[k] for k in ("phase", "startTime") if k in status},
    }
    if claims:  # which allocation mode made it (DRA mode's brokers have a claim)
        slim["spec"] = {"resourceClaims": claims}
    return slim


def slim_job(obj: JSON) -> JSON:
    return {"metadata": _slim_meta(obj, _POD_META)}


def slim_node(obj: JSON) -> JSON:
    """A Node reduced to its Ready condition's status and time of last change and its hostname
    label (a real Node carries its image list, and heartbeat times that change without anything
    happening)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = [
        {k: c[k] for k in ("type", "status", "lastTransitionTime") if k in c}
        for c in conditions
        if c.get("type") == "Ready"
    ]
    meta = _slim_meta(obj, ("name", "uid", "resourceVersion"))
    hostname = ((obj.get("metadata") or {}).get("labels") or {}).get(HOSTNAME_LABEL)
    if hostname is not None:
        meta["labels"] = {HOSTNAME_LABEL: hostname}
    return {"metadata": meta, "status": {"conditions": ready}}


def labelled(label: str) -> Callable[[JSON], ObjectKey | None]:
    """An object's (namespace, value of `label`), the key of the index of that label."""

    def get(obj: JSON) -> ObjectKey | None:
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(label)
        return None if value is None else ObjectKey(str(meta.get("namespace") or ""), value)

    return get


def service_configuration(obj: JSON) -> ObjectKey | None:
    """The Configuration a Service fronts (services.configuration_of: instance Services name it
    in an annotation, as upstream labels them with their Instance only)."""
    value = configuration_of(obj)
    return None if value is None else ObjectKey(str(obj["metadata"].get("namespace") or ""), value)


def name_label(obj: JSON) -> ObjectKey:
    """The key under which objects labelled with this object's name find it."""
    meta = obj["metadata"]
    return label_key(str(meta.get("namespace") or ""), meta["name"])


def config_of(obj: JSON) -> ObjectKey | None:
    name = (obj.get("spec") or {}).get("configurationName")
    return None if not name else ObjectKey(str(obj["metadata"].get("namespace") or ""), name)


def make_caches(*, dra: bool = False) -> Caches:
    instance_label = by_field(labelled(naming.LABEL_INSTANCE))
    config_label = by_field(labelled(naming.LABEL_CONFIGURATION))
    return Caches(
        instances=Store(
            decode=partial(structure, cls=Instance),
            transform=drop_managed_fields,
            indexes={
                "config": by_field(config_of),
                "label": by_field(name_label),
                **(INSTANCE_INDEXES if dra else {}),
            },
        ),
        # An update that does not decode must not look like a deletion (which would take the
        # Configuration's brokers and Services away): the last version that decoded stays.
        configurations=Store(
            decode=partial(structure, cls=Configuration),
            keep_last_good=True,
            transform=drop_managed_fields,
            indexes={"label": by_field(name_label), **(CONFIGURATION_INDEXES if dra else {})},
        ),
        pods=Store(
            transform=slim_pod, indexes={"instance": instance_label, "config": config_label}
        ),
        jobs=Store(transform=slim_job, indexes={"instance": instance_label}),
        services=Store(
            transform=drop_managed_fields,
            indexes={"instance": instance_label, "config": by_field(service_configuration)},
        ),
        nodes=Store(transform=slim_node),
    )


# --- from a change to the keys it concerns ---------------------------------------------------


def when_changed(mapper: Mapper) -> Mapper:
    """Nothing to reconcile when what the cache keeps did not change."""

    def mapped(change: Change[Any]) -> Iterable[ObjectKey]:
        return () if change.old == change.new else mapper(change)

    return mapped


def _both(change: Change[T]) -> list[T]:
    return [obj for obj in (change.old, change.new) if obj is not None]


def through(store: Store[Any], index: str, get: Callable[[JSON], ObjectKey | None]) -> Mapper:
    """Maps an object (of a JSON store) to the keys `store` files under `get(obj)` in
    `index`."""

    def mapper(change: Change[JSON]) -> Iterable[ObjectKey]:
        keys: set[ObjectKey] = set()
        for obj in _both(change):
            value = get(obj)
            if value is not None:
                keys |= store.keys_for(index, value)
        return keys

    return mapper


def _broker_inputs(config: Configuration | None) -> Any:
    """What the brokers of a Configuration's Instances depend on: not its status."""
    if config is None:
        return None
    meta = config.metadata
    return (meta.uid, meta.generation, meta.deletion_timestamp, config.spec)


def configuration_to_instances(instances: Store[Instance]) -> Mapper:
    def mapper(change: Change[Configuration]) -> Iterable[ObjectKey]:
        if _broker_inputs(change.old) == _broker_inputs(change.new):
            return ()  # a status write by an agent
        return instances.keys_for("config", change.key)

    return mapper


def service_to_configurations(caches: Caches) -> Mapper:
    by_config = through(caches.configurations, "label", service_configuration)
    by_instance = through(caches.instances, "label", labelled(naming.LABEL_INSTANCE))

    def mapper(change: Change[JSON]) -> Iterable[ObjectKey]:
        keys = set(by_config(change))
        for key in by_instance(change):
            inst = caches.instances.get(key)
            if inst is not None:
                keys.add(configuration_key(inst))
        return keys

    return mapper


def configuration_key(inst: Instance) -> ObjectKey:
    """The key of the Configuration an Instance belongs to."""
    return ObjectKey(inst.metadata.namespace, inst.spec.configuration_name)


def instance_to_configuration(change: Change[Instance]) -> Iterable[ObjectKey]:
    return {configuration_key(inst) for inst in _both(change)}


def _running(pod: JSON | None) -> bool:
    """A broker that makes its Services wanted (services.py): Running, not being deleted."""
    if pod is None:
        return False
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return (pod.get("status") or {}).get("phase") == "Running" and not deleting


def _has_services(caches: Caches, config: ObjectKey) -> bool:
    """Any Service of this Configuration cached (instance Services name it too)."""
    return bool(caches.services.keys_for("config", label_key(config.namespace, config.name)))


def pod_to_services(caches: Caches, config_of: Mapper) -> Mapper:
    """While a Configuration has no Service, its plan (services.plan_services) turns on its
    brokers being Running and nothing else: a Pod change that leaves that as it was (a broker
    created Pending, scheduled, ...) does not reconcile it. With 1,000 brokers starting at once
    that is 1,000 fewer plans over all the Configuration's Instances."""

    def mapper(change: Change[JSON]) -> Iterable[ObjectKey]:
        if change.old == change.new:
            return ()
        keys = config_of(change)
        if _running(change.old) != _running(change.new):
            return keys
        return {key for key in keys if _has_services(caches, key)}

    return mapper


def instance_to_services(caches: Caches) -> Mapper:
    """An Instance's change matters to its Configuration's Services when some exist, or when
    a broker of it already runs (it needs its Service now); otherwise not (an Instance made or
    edited before its brokers run)."""

    def mapper(change: Change[Instance]) -> Iterable[ObjectKey]:
        keys = set()
        for key in instance_to_configuration(change):
            if _has_services(caches, key):
                keys.add(key)
                continue
            for inst in _both(change):
                selected = label_key(inst.metadata.namespace, inst.metadata.name)
                if any(map(_running, caches.pods.select("instance", selected).values())):
                    keys.add(key)
        return keys

    return mapper


def keys(get: Callable[[JSON], ObjectKey | None]) -> Mapper:
    """A mapper from an object to the one key `get` finds in it (old and new), if any."""
    return each(lambda obj: [k for k in [get(obj)] if k is not None])


def configuration_to_class(change: Change[Configuration]) -> Iterable[ObjectKey]:
    """DRA mode's class queue, for Configurations: the class of each, before and after."""
    return {
        ObjectKey("", device_class_name(c.metadata.name, c.metadata.namespace))
        for c in _both(change)
    }


def instance_class_keys(change: Change[Instance]) -> list[ObjectKey]:
    """DRA mode's class queue, for Instances: their class, when one comes or goes (nothing
    else about an Instance changes its class)."""
    if change.old is not None and change.new is not None:
        return []
    return [
        ObjectKey("", instance_class_name(i.metadata.name, i.metadata.namespace))
        for i in _both(change)
    ]


def instance_to_shared_pool(change: Change[Instance]) -> Iterable[ObjectKey]:
    """DRA mode's pool queue, for Instances: the shared pool of each, before and after, when
    the Instance changed."""
    if change.old == change.new:
        return ()
    pools = (shared_pool_of(i) for i in _both(change))
    return {ObjectKey("", pool) for pool in pools if pool is not None}


def never(change: Change[Any]) -> Iterable[ObjectKey]:
    """For a store a reconciler reads but whose changes it does not react to: the runner
    still waits for its first list."""
    return ()
