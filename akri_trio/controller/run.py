"""`run_controller`: the controller's ONE nursery tree, readable from here.

    run_controller
    ├── health / metrics server                       /healthz, /readyz, /metrics
    └── leader election                       only the leader runs the rest (leader_elector.py)
        └── reconcile_while_leading
            ├── watch instances, watch configurations, watch nodes          -> stores
            ├── watch pods, watch jobs, watch services   only ours, by label  -> stores
            ├── event recorder      Events on Instances and Configurations
            ├── instance queue      Instance key       broker Pods and Job   (reconcilers.instance)
            ├── services queue      Configuration key  its Services          (reconcilers.services)
            ├── node queue          Node key           lost-node cleanup     (reconcilers.node)
            │   in DRA mode (`--allocation dra`) also, from our classes, slices and Pods refused:
            ├── watch deviceclasses, watch resourceslices                    -> stores
            ├── watch unscheduled pods                                       -> store
            ├── deviceclass queue   DeviceClass name   a Configuration's or Instance's class
            ├── pool queue          pool name          a shared Instance's pool (dra/reconcilers.py)
            └── requeue queue       Pod key            a Pod refused a device (dra/requeue.py)

Each name on a branch is the name its task is started with (test_run_tree compares the two);
what the caches keep and which change wakes which queue are triggers.py's.

The standby keeps no watches: becoming leader lists everything afresh, so a new leader never
acts on a cache the old one filled. Once the first lists are in, the node queue also gets the
nodes that Instances or Configuration statuses still name but that no longer exist: nodes
deleted while no controller led are cleaned as a live deletion is (nodeloss.py says what a
fresh controller can know about NotReady ones). Losing the Lease cancels the whole subtree.
Nothing needs a timer: each queue is woken by cache changes, and by the `wake_at` a plan
returns (a Pending deadline, a broker's backoff), the end of a NotReady node's grace or a
refused Pod's next nudge, so with nothing changing the controller sends no request.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import attrs
import trio

from akri_trio.controller.dra.plan import class_selector, slice_selector
from akri_trio.controller.dra.reconcilers import DraCaches, DraReconcilers, remove_leftovers
from akri_trio.controller.dra.requeue import UNSCHEDULED
from akri_trio.controller.leader_elector import ClientLeaseApi, LeaderElector
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.controller.reconcilers import (
    JOBS,
    NODES,
    PODS,
    SERVICES,
    Caches,
    Reconcilers,
)
from akri_trio.controller.settings import ControllerSettings
from akri_trio.controller.triggers import (
    configuration_to_class,
    configuration_to_instances,
    instance_class_keys,
    instance_to_services,
    instance_to_shared_pool,
    keys,
    labelled,
    make_caches,
    never,
    pod_to_services,
    service_to_configurations,
    through,
    when_changed,
)
from akri_trio.dra import DEVICE_CLASSES, RESOURCE_SLICES, pool_key
from akri_trio.dra.edge import probe_consumable_capacity
from akri_trio.kube import (
    Client,
    Controller,
    EventRecorder,
    ObjectKey,
    Requeue,
    Resource,
    Store,
    load_config,
    reflect,
)
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.observe.endpoints import serve_observe

__all__ = ["ControllerSettings", "RunningController", "reconcile_while_leading", "run_controller"]

log = logging.getLogger(__name__)

LEFTOVERS_S = 30.0  # the bound on deleting what DRA mode left, as a leadership starts


@attrs.frozen
class Watch:
    """One watch of the tree: what it keeps in which store, its selectors, its task's name
    (default "watch <plural>")."""

    res: Resource
    store: Store[Any]
    labels: str | None = None
    fields: str | None = None
    name: str | None = None


@attrs.define
class RunningController:
    """Handles to the running controller (tests, the health endpoint)."""

    settings: ControllerSettings
    elector: LeaderElector | None = None  # None: leads alone (no --leader-elect)
    port: int | None = None
    caches: Caches | None = None  # while leading
    reconcilers: Reconcilers | None = None
    synced: bool = False
    # Scraped from the above: the broker Pods in the caches, whether this replica leads.
    metrics: ControllerMetrics = attrs.field(
        init=False,
        default=attrs.Factory(
            lambda self: ControllerMetrics(
                broker_pods=self.broker_pods, leading=lambda: self.leading
            ),
            takes_self=True,
        ),
    )

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    def broker_pods(self) -> Iterable[Mapping[str, Any]]:
        """The broker Pods cached while leading (none while standing by)."""
        return () if self.caches is None else self.caches.pods.snapshot().values()


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
    dra = await _dra_reconcilers(api, caches, metrics) if dra_mode else None
    reconcilers = Reconcilers(
        api,
        caches,
        metrics,
        recorder=recorder,
        node_lost_grace=settings.node_lost_grace,
        namespace=settings.namespace,
        dra=dra,
    )
    ns = settings.namespace
    ours = f"{naming.LABEL_CONTROLLER}={naming.CONTROLLER_VALUE}"
    watches = [
        Watch(INSTANCES, caches.instances),
        Watch(CONFIGURATIONS, caches.configurations),
        Watch(PODS, caches.pods, naming.LABEL_CONFIGURATION),
        Watch(JOBS, caches.jobs, naming.LABEL_CONFIGURATION),
        Watch(SERVICES, caches.services, ours),
    ]
    instance_of = through(caches.instances, "label", labelled(naming.LABEL_INSTANCE))
    config_of = through(caches.configurations, "label", labelled(naming.LABEL_CONFIGURATION))
    # No drain: a deposed leader must stop writing at once; every reconcile is cancel-safe
    # (deterministic names, AlreadyExists / NotFound tolerated), the next leader redoes it.
    controllers = {
        "instance": Controller(
            _measured("instance", reconcilers.instance, metrics),
            caches.instances,
            workers=settings.workers,
            drain=0,
        )
        .watches(caches.pods, when_changed(instance_of))
        .watches(caches.jobs, when_changed(instance_of))
        .watches(caches.configurations, configuration_to_instances(caches.instances)),
        "services": Controller(
            _measured("services", reconcilers.services, metrics),
            caches.configurations,
            workers=max(1, settings.workers // 2),
            drain=0,
        )
        .watches(caches.pods, pod_to_services(caches, config_of))
        .watches(caches.services, when_changed(service_to_configurations(caches)))
        .watches(caches.instances, instance_to_services(caches)),
        "node": Controller(
            _measured("node", reconcilers.node, metrics), caches.nodes, workers=2, drain=0
        )
        .watches(caches.instances, never)
        .watches(caches.configurations, never),
    }
    if dra is not None:
        controllers.update(_dra_controllers(settings, caches, dra, watches))
    if not dra_mode:  # what DRA mode left would let the scheduler allocate through DRA
        with trio.move_on_after(LEFTOVERS_S):
            await remove_leftovers(api, ns)
    try:
        async with trio.open_nursery() as nursery:
            for watch in watches:
                nursery.start_soon(
                    functools.partial(
                        reflect,
                        api,
                        watch.res,
                        watch.store,
                        namespace=ns if watch.res.namespaced else None,
                        label_selector=watch.labels,
                        field_selector=watch.fields,
                    ),
                    name=watch.name or f"watch {watch.res.plural}",
                )
            nursery.start_soon(reflect, api, NODES, caches.nodes, name="watch nodes")
            nursery.start_soon(recorder.run, name="event recorder")
            running.caches, running.reconcilers = caches, reconcilers
            # No deadline on the first lists: with the API server away this waits (and /readyz
            # says so) until it is back or leadership ends.
            for name, controller in controllers.items():
                await nursery.start(controller.run, name=f"{name} queue")
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
        for name in controllers:
            metrics.queue_depth.remove(name)


async def _dra_reconcilers(
    api: Client, caches: Caches, metrics: ControllerMetrics
) -> DraReconcilers:
    """DRA mode's reconcilers, as the API server serves DRA."""
    consumable = await probe_consumable_capacity(api)
    log.info(
        "DRA mode: shared pools as %s",
        "one device per Instance with consumable capacity"
        if consumable
        else "one device per slot (no consumable capacity)",
    )
    return DraReconcilers(
        api,
        configurations=caches.configurations,
        instances=caches.instances,
        nodes=caches.nodes,
        c=DraCaches(),
        metrics=metrics,
        consumable=consumable,
    )


def _dra_controllers(
    settings: ControllerSettings,
    caches: Caches,
    dra: DraReconcilers,
    watches: list[Watch],
) -> dict[str, Controller]:
    """DRA mode's stores (added to `watches`) and controllers."""
    dra_caches = dra.c
    ns = settings.namespace
    # Cluster-scoped, watched in no namespace: the label selectors scope them instead.
    watches.append(Watch(DEVICE_CLASSES, dra_caches.classes, class_selector(ns)))
    watches.append(Watch(RESOURCE_SLICES, dra_caches.slices, slice_selector(ns)))
    watches.append(
        Watch(PODS, dra_caches.unscheduled, fields=UNSCHEDULED, name="watch unscheduled pods")
    )
    metrics = dra.metrics
    return {
        "deviceclass": Controller(
            _measured("deviceclass", dra.device_class, metrics), dra_caches.classes, drain=0
        )
        .watches(caches.configurations, configuration_to_class)
        .watches(caches.instances, instance_class_keys),
        "pool": Controller(
            _measured("pool", dra.shared_pool, metrics),
            dra_caches.slices,
            workers=max(1, settings.workers // 2),
            drain=0,
            mapper=keys(pool_key),
        )
        .watches(caches.instances, instance_to_shared_pool)
        .watches(caches.nodes, never),
        # One worker: Requeuer's once-per-class gap is checked and kept around its write.
        "requeue": Controller(
            _measured("requeue", dra.requeue.pod, metrics),
            dra_caches.unscheduled,
            workers=1,
            drain=0,
        ).watches(dra_caches.classes, never),
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
    elector = None
    if settings.leader_elect:
        lease_api = ClientLeaseApi(api, settings.lease_name, settings.lease_namespace)
        elector = LeaderElector(
            lease_api,
            settings.identity,
            name=settings.lease_name,
            namespace=settings.lease_namespace,
        )
    running = RunningController(settings, elector)
    work = functools.partial(reconcile_while_leading, api, settings, running)
    async with trio.open_nursery() as root:
        if settings.metrics_port is not None:
            running.port = await root.start(
                functools.partial(
                    serve_observe,
                    settings.metrics_host,
                    settings.metrics_port,
                    registry=running.metrics.registry,
                    ready=_ready_checks(running),
                    max_connections=settings.metrics_max_connections,
                ),
                name="health / metrics server",
            )
        if elector is not None:
            root.start_soon(elector.run, work, name="leader election")
        else:
            root.start_soon(work, name="reconcile_while_leading")
        log.info("controller %s started", settings.identity)
        task_status.started(running)
