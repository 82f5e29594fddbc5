"""What the controller's caches keep and which cache changes wake which reconciler.

The caches hold only what the decisions read (`slim_pod`, `slim_job`, `slim_node`): a busy
kubelet's status updates then change nothing in the cache and wake nobody. A trigger (a
`Mapper` of akri_trio.kube's runner: a change -> the keys it concerns) turns a change of a
watched object into the keys of the objects whose reconcile reads it, through the stores'
indexes (`make_caches`); a change that cannot alter a reconcile's outcome (an agent's status
write, a Pending broker being scheduled) maps to no key. Each is a plain function of the change
and the caches, tested without a cluster; run.py only passes them to the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from akri_trio.controller.dra_reconcilers import CONFIGURATION_INDEXES, INSTANCE_INDEXES
from akri_trio.controller.reconcilers import Caches, label_key
from akri_trio.controller.services import configuration_of
from akri_trio.dra import HOSTNAME_LABEL
from akri_trio.kube import JSON, Change, Mapper, ObjectKey, Store, by_field, drop_managed_fields
from akri_trio.model import naming

__all__ = [
    "config_of",
    "configuration_to_instances",
    "instance_to_configuration",
    "instance_to_services",
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
            transform=drop_managed_fields,
            indexes={
                "config": by_field(config_of),
                "label": by_field(name_label),
                **(INSTANCE_INDEXES if dra else {}),
            },
        ),
        configurations=Store(
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

    def mapped(change: Change) -> Iterable[ObjectKey]:
        return () if change.old == change.new else mapper(change)

    return mapped


def _both(change: Change) -> Iterable[JSON]:
    return [obj for obj in (change.old, change.new) if obj is not None]


def through(store: Store, index: str, get: Callable[[JSON], ObjectKey | None]) -> Mapper:
    """Maps an object to the keys `store` files under `get(obj)` in `index`."""

    def mapper(change: Change) -> Iterable[ObjectKey]:
        keys: set[ObjectKey] = set()
        for obj in _both(change):
            value = get(obj)
            if value is not None:
                keys |= store.keys_for(index, value)
        return keys

    return mapper


def _broker_inputs(obj: JSON | None) -> Any:
    """What the brokers of a Configuration's Instances depend on: not its status."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    return (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"), obj.get("spec"))


def configuration_to_instances(instances: Store) -> Mapper:
    def mapper(change: Change) -> Iterable[ObjectKey]:
        if _broker_inputs(change.old) == _broker_inputs(change.new):
            return ()  # a status write by an agent
        return instances.keys_for("config", change.key)

    return mapper


def service_to_configurations(caches: Caches) -> Mapper:
    by_config = through(caches.configurations, "label", service_configuration)
    by_instance = through(caches.instances, "label", labelled(naming.LABEL_INSTANCE))

    def mapper(change: Change) -> Iterable[ObjectKey]:
        keys = set(by_config(change))
        for key in by_instance(change):
            config = config_of(caches.instances.get(key) or {"metadata": {}})
            if config is not None:
                keys.add(config)
        return keys

    return mapper


def instance_to_configuration(change: Change) -> Iterable[ObjectKey]:
    return {key for key in map(config_of, _both(change)) if key is not None}


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

    def mapper(change: Change) -> Iterable[ObjectKey]:
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

    def mapper(change: Change) -> Iterable[ObjectKey]:
        keys = set()
        for key in instance_to_configuration(change):
            if _has_services(caches, key):
                keys.add(key)
                continue
            for obj in _both(change):
                meta = obj.get("metadata") or {}
                selected = label_key(str(meta.get("namespace") or ""), str(meta.get("name")))
                if any(map(_running, caches.pods.select("instance", selected).values())):
                    keys.add(key)
        return keys

    return mapper


def never(change: Change) -> Iterable[ObjectKey]:
    """For a store a reconciler reads but whose changes it does not react to: the runner
    still waits for its first list."""
    return ()
