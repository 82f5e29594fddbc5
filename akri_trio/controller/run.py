"""`run_controller`: the controller's ONE nursery tree, readable from here.

    run_controller
    ├── health / metrics server                       /healthz, /readyz, /metrics
    └── leader election (leader.py)                   only the leader runs what follows
        └── reconcile_while_leading
            ├── watches -> stores: Instances, Configurations, Nodes, and only what is ours:
            │   Pods and Jobs labelled akri.sh/configuration, Services labelled controller=akri.sh
            ├── event recorder                      Events on Instances and Configurations
            ├── instance queue   Instance key       broker Pods and Job   (reconcilers.instance)
            ├── services queue   Configuration key  its Services          (reconcilers.services)
            ├── node queue       Node key           lost-node cleanup     (reconcilers.node)
            │   in DRA mode (`--allocation dra`) also, from our DeviceClasses and shared slices:
            ├── class queue      DeviceClass name   a Configuration's class (dra_reconcilers)
            └── pool queue       pool name          a shared Instance's pool (dra_reconcilers)

The standby keeps no watches: becoming leader lists everything afresh, so a new leader never
acts on a cache the old one filled. Once the first lists are in, the node queue also gets the
nodes that Instances or Configuration statuses still name but that no longer exist: nodes
deleted while no controller led are cleaned as a live deletion is (nodeloss.py says what a
fresh controller can know about NotReady ones). Losing the Lease cancels the whole subtree.
Nothing needs a timer: each queue is woken by cache changes, and by the `wake_at` a plan
returns (a Pending deadline, a broker's backoff) or the end of a NotReady node's grace, so with
nothing changing the controller sends no request.

Caches hold only what the decisions read (`slim_pod`, `slim_job`, `slim_node`): a busy
kubelet's status updates then change nothing in the cache and wake nobody.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from akri_trio.controller.dra_reconcilers import (
    CONFIGURATION_INDEXES,
    INSTANCE_INDEXES,
    DraCaches,
    DraReconcilers,
    class_key,
    class_selector,
    keys,
    pool_key,
    probe_consumable_capacity,
    shared_pool_key,
    slice_selector,
)
from akri_trio.controller.leader import ClientLeaseApi, LeaderElector
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.controller.reconcilers import (
    JOBS,
    NODE_LOST_GRACE_S,
    NODES,
    PODS,
    SERVICES,
    Caches,
    Reconcilers,
    label_key,
)
from akri_trio.controller.services import configuration_of
from akri_trio.dra import DEVICE_CLASSES, HOSTNAME_LABEL, RESOURCE_SLICES
from akri_trio.kube import (
    JSON,
    Change,
    Client,
    Controller,
    EventRecorder,
    Mapper,
    ObjectKey,
    Requeue,
    Resource,
    Store,
    by_field,
    drop_managed_fields,
    load_config,
    reflect,
)
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.observe.endpoints import serve_observe
from akri_trio.runtime.http import DEFAULT_MAX_CONNECTIONS

log = logging.getLogger(__name__)


def default_identity() -> str:
    """Unique per process: the Pod's name (or host) and a random suffix, as client-go does."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


@attrs.frozen
class ControllerSettings:
    kubeconfig: Path | None = None
    namespace: str | None = None  # watch this namespace only (Nodes are cluster-wide)
    metrics_port: int | None = 8080
    metrics_host: str = "0.0.0.0"
    metrics_max_connections: int = DEFAULT_MAX_CONNECTIONS
    leader_elect: bool = True
    lease_name: str = "akri-controller"
    lease_namespace: str = "akri"
    identity: str = attrs.field(factory=default_identity)
    workers: int = 8
    allocation: str = "device-plugin"  # or "dra"
    node_lost_grace: float = NODE_LOST_GRACE_S  # a NotReady node at start: seconds before cleanup


@attrs.define
class RunningController:
    """Handles to the running controller (tests, the health endpoint)."""

    settings: ControllerSettings
    metrics: ControllerMetrics
    elector: LeaderElector | None = None
    port: int | None = None
    caches: Caches | None = None  # while leading
    reconcilers: Reconcilers | None = None
    synced: bool = False

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading


# --- what the caches keep --------------------------------------------------------------------

_META = ("name", "namespace", "uid", "labels", "ownerReferences", "resourceVersion")
_POD_META = (*_META, "creationTimestamp", "deletionTimestamp")


def _slim_meta(obj: Mapping[str, Any], keep: Iterable[str]) -> JSON:
    meta = obj.get("metadata") or {}
    return {k: meta[k] for k in keep if k in meta}


def slim_pod(obj: JSON) -> JSON:
    """What ObservedPod and the mappers read of a Pod."""
    status = obj.get("status") or {}
    return {
        "metadata": _slim_meta(obj, _POD_META),
        "status": {k: status[k] for k in ("phase", "startTime") if k in status},
    }


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


def _labelled(label: str) -> Callable[[JSON], ObjectKey | None]:
    """An object's (namespace, value of `label`), the key of the index of that label."""

    def get(obj: JSON) -> ObjectKey | None:
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(label)
        return None if value is None else ObjectKey(str(meta.get("namespace") or ""), value)

    return get


def _service_configuration(obj: JSON) -> ObjectKey | None:
    """The Configuration a Service fronts (services.configuration_of: instance Services name it
    in an annotation, as upstream labels them with their Instance only)."""
    value = configuration_of(obj)
    return None if value is None else ObjectKey(str(obj["metadata"].get("namespace") or ""), value)


def _name_label(obj: JSON) -> ObjectKey:
    """The key under which objects labelled with this object's name find it."""
    meta = obj["metadata"]
    return label_key(str(meta.get("namespace") or ""), meta["name"])


def _config_of(obj: JSON) -> ObjectKey | None:
    name = (obj.get("spec") or {}).get("configurationName")
    return None if not name else ObjectKey(str(obj["metadata"].get("namespace") or ""), name)


def make_caches(*, dra: bool = False) -> Caches:
    instance_label = by_field(_labelled(naming.LABEL_INSTANCE))
    config_label = by_field(_labelled(naming.LABEL_CONFIGURATION))
    return Caches(
        instances=Store(
            transform=drop_managed_fields,
            indexes={
                "config": by_field(_config_of),
                "label": by_field(_name_label),
                **(INSTANCE_INDEXES if dra else {}),
            },
        ),
        configurations=Store(
            transform=drop_managed_fields,
            indexes={"label": by_field(_name_label), **(CONFIGURATION_INDEXES if dra else {})},
        ),
        pods=Store(
            transform=slim_pod, indexes={"instance": instance_label, "config": config_label}
        ),
        jobs=Store(transform=slim_job, indexes={"instance": instance_label}),
        services=Store(
            transform=drop_managed_fields,
            indexes={"instance": instance_label, "config": by_field(_service_configuration)},
        ),
        nodes=Store(transform=slim_node),
    )


# --- from a change to the keys it concerns ---------------------------------------------------


def _when_changed(mapper: Mapper) -> Mapper:
    """Nothing to reconcile when what the cache keeps did not change."""

    def mapped(change: Change) -> Iterable[ObjectKey]:
        return () if change.old == change.new else mapper(change)

    return mapped


def _both(change: Change) -> Iterable[JSON]:
    return [obj for obj in (change.old, change.new) if obj is not None]


def _through(store: Store, index: str, get: Callable[[JSON], ObjectKey | None]) -> Mapper:
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


def _configuration_to_instances(instances: Store) -> Mapper:
    def mapper(change: Change) -> Iterable[ObjectKey]:
        if _broker_inputs(change.old) == _broker_inputs(change.new):
            return ()  # a status write by an agent
        return instances.keys_for("config", change.key)

    return mapper


def _service_to_configurations(caches: Caches) -> Mapper:
    by_config = _through(caches.configurations, "label", _service_configuration)
    by_instance = _through(caches.instances, "label", _labelled(naming.LABEL_INSTANCE))

    def mapper(change: Change) -> Iterable[ObjectKey]:
        keys = set(by_config(change))
        for key in by_instance(change):
            config = _config_of(caches.instances.get(key) or {"metadata": {}})
            if config is not None:
                keys.add(config)
        return keys

    return mapper


def _instance_to_configuration(change: Change) -> Iterable[ObjectKey]:
    return {key for key in map(_config_of, _both(change)) if key is not None}


def _running(pod: JSON | None) -> bool:
    """A broker that makes its Services wanted (services.py): Running, not being deleted."""
    if pod is None:
        return False
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return (pod.get("status") or {}).get("phase") == "Running" and not deleting


def _has_services(caches: Caches, config: ObjectKey) -> bool:
    """Any Service of this Configuration cached (instance Services name it too)."""
    return bool(caches.services.keys_for("config", label_key(config.namespace, config.name)))


def _pod_to_services(caches: Caches, config_of: Mapper) -> Mapper:
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


def _instance_to_services(caches: Caches) -> Mapper:
    """An Instance's change matters to its Configuration's Services when some exist, or when
    a broker of it already runs (it needs its Service now); otherwise not (an Instance made or
    edited before its brokers run)."""

    def mapper(change: Change) -> Iterable[ObjectKey]:
        keys = set()
        for key in _instance_to_configuration(change):
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


def _never(change: Change) -> Iterable[ObjectKey]:
    """For a store a reconciler reads but whose changes it does not react to: the runner
    still waits for its first list."""
    return ()


# --- the tree --------------------------------------------------------------------------------


def _measured(
    name: str, reconcile: Callable[[ObjectKey], Awaitable[Requeue | None]], m: ControllerMetrics
) -> Callable[[ObjectKey], Awaitable[Requeue | None]]:
    async def measured(key: ObjectKey) -> Requeue | None:
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await reconcile(key)
            outcome = "ok" if result is None else "requeue"
            return result
        finally:
            m.reconciles.labels(reconciler=name, outcome=outcome).inc()
            m.reconcile_duration.labels(reconciler=name).observe(time.perf_counter() - started)

    return measured


async def reconcile_while_leading(
    api: Client, settings: ControllerSettings, running: RunningController
) -> None:
    """Watch, cache and reconcile until cancelled (leadership lost, or shutdown)."""
    dra_mode = settings.allocation == "dra"
    caches = make_caches(dra=dra_mode)
    metrics = running.metrics
    recorder = EventRecorder(api, "akri-controller")
    reconcilers = Reconcilers(
        api, caches, metrics, recorder=recorder, node_lost_grace=settings.node_lost_grace
    )
    ns = settings.namespace
    ours = f"{naming.LABEL_CONTROLLER}={naming.CONTROLLER_VALUE}"
    watches: list[tuple[Resource, Store, str | None]] = [
        (INSTANCES, caches.instances, None),
        (CONFIGURATIONS, caches.configurations, None),
        (PODS, caches.pods, naming.LABEL_CONFIGURATION),
        (JOBS, caches.jobs, naming.LABEL_CONFIGURATION),
        (SERVICES, caches.services, ours),
    ]
    instance_of = _through(caches.instances, "label", _labelled(naming.LABEL_INSTANCE))
    config_of = _through(caches.configurations, "label", _labelled(naming.LABEL_CONFIGURATION))
    # No drain: a deposed leader must stop writing at once; every reconcile is cancel-safe
    # (deterministic names, AlreadyExists / NotFound tolerated), the next leader redoes it.
    controllers = {
        "instance": Controller(
            _measured("instance", reconcilers.instance, metrics),
            caches.instances,
            workers=settings.workers,
            drain=0,
        )
        .watches(caches.pods, _when_changed(instance_of))
        .watches(caches.jobs, _when_changed(instance_of))
        .watches(caches.configurations, _configuration_to_instances(caches.instances)),
        "services": Controller(
            _measured("services", reconcilers.services, metrics),
            caches.configurations,
            workers=max(1, settings.workers // 2),
            drain=0,
        )
        .watches(caches.pods, _pod_to_services(caches, config_of))
        .watches(caches.services, _when_changed(_service_to_configurations(caches)))
        .watches(caches.instances, _instance_to_services(caches)),
        "node": Controller(
            _measured("node", reconcilers.node, metrics), caches.nodes, workers=2, drain=0
        )
        .watches(caches.instances, _never)
        .watches(caches.configurations, _never),
    }
    if dra_mode:
        controllers.update(await _dra_controllers(api, settings, caches, reconcilers, watches))
    try:
        async with trio.open_nursery() as nursery:
            for res, store, selector in watches:
                nursery.start_soon(
                    functools.partial(
                        reflect,
                        api,
                        res,
                        store,
                        namespace=ns if res.namespaced else None,
                        label_selector=selector,
                    )
                )
            nursery.start_soon(reflect, api, NODES, caches.nodes)
            nursery.start_soon(recorder.run)
            running.caches, running.reconcilers = caches, reconcilers
            metrics.broker_pods = lambda: caches.pods.snapshot().values()
            # No deadline on the first lists: with the API server away this waits (and /readyz
            # says so) until it is back or leadership ends.
            for name, controller in controllers.items():
                await nursery.start(controller.run)
                metrics.queue_depth.labels(controller=name).set_function(
                    functools.partial(len, controller.queue)
                )
            for key in reconcilers.lost_while_away():
                controllers["node"].queue.enqueue(key)
            running.synced = True
            log.info("controller synced: %d Instances cached", len(caches.instances))
    finally:
        running.synced = False
        running.caches = running.reconcilers = None
        metrics.broker_pods = lambda: ()
        for name in controllers:
            metrics.queue_depth.remove(name)


async def _dra_controllers(
    api: Client,
    settings: ControllerSettings,
    caches: Caches,
    reconcilers: Reconcilers,
    watches: list[tuple[Resource, Store, str | None]],
) -> dict[str, Controller]:
    """DRA mode's stores (added to `watches`), reconcilers and controllers."""
    consumable = await probe_consumable_capacity(api)
    log.info(
        "DRA mode: shared pools as %s",
        "one device per Instance with consumable capacity"
        if consumable
        else "one device per slot (no consumable capacity)",
    )
    dra_caches = DraCaches()
    dra = DraReconcilers(
        api,
        configurations=caches.configurations,
        instances=caches.instances,
        nodes=caches.nodes,
        c=dra_caches,
        metrics=reconcilers.metrics,
        consumable=consumable,
        read_instance=reconcilers.read_instance,
    )
    reconcilers.dra = dra
    ns = settings.namespace
    # Cluster-scoped, watched in no namespace: the label selectors scope them instead.
    watches.append((DEVICE_CLASSES, dra_caches.classes, class_selector(ns)))
    watches.append((RESOURCE_SLICES, dra_caches.slices, slice_selector(ns)))
    metrics = reconcilers.metrics
    return {
        "deviceclass": Controller(
            _measured("deviceclass", dra.device_class, metrics), dra_caches.classes, drain=0
        ).watches(caches.configurations, keys(class_key)),
        "pool": Controller(
            _measured("pool", dra.shared_pool, metrics),
            dra_caches.slices,
            workers=max(1, settings.workers // 2),
            drain=0,
            mapper=keys(pool_key),
        )
        .watches(caches.instances, _when_changed(keys(shared_pool_key)))
        .watches(caches.nodes, _never),
    }


def _ready_checks(running: RunningController) -> list[tuple[str, Callable[[], bool]]]:
    checks: list[tuple[str, Callable[[], bool]]] = [
        ("caches-synced", lambda: running.synced or not running.leading)
    ]
    elector = running.elector
    if elector is not None:

        def lease_reachable() -> bool:
            last = elector.last_contact
            return last is not None and trio.current_time() - last < 2 * elector.duration

        checks.append(("lease-reachable", lease_reachable))
    return checks


async def run_controller(
    settings: ControllerSettings,
    *,
    api: Client | None = None,
    task_status: trio.TaskStatus[RunningController] = trio.TASK_STATUS_IGNORED,
) -> None:
    if api is None:
        async with Client.open(load_config(settings.kubeconfig)) as owned:
            await run_controller(settings, api=owned, task_status=task_status)
        return
    metrics = ControllerMetrics()
    running = RunningController(settings, metrics)
    work = functools.partial(reconcile_while_leading, api, settings, running)
    if settings.leader_elect:
        lease_api = ClientLeaseApi(api, settings.lease_name, settings.lease_namespace)
        running.elector = LeaderElector(
            lease_api,
            settings.identity,
            name=settings.lease_name,
            namespace=settings.lease_namespace,
            on_change=lambda leading: metrics.leader.set(1 if leading else 0),
        )
    async with trio.open_nursery() as root:
        if settings.metrics_port is not None:
            running.port = await root.start(
                functools.partial(
                    serve_observe,
                    settings.metrics_host,
                    settings.metrics_port,
                    registry=metrics.registry,
                    ready=_ready_checks(running),
                    max_connections=settings.metrics_max_connections,
                )
            )
        if running.elector is not None:
            root.start_soon(running.elector.run, work)
        else:
            metrics.leader.set(1)
            root.start_soon(work)
        log.info("controller %s started", settings.identity)
        task_status.started(running)
