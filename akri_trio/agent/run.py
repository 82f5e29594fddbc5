"""`run_agent`: the agent's ONE nursery tree, readable from here.

    run_agent
    ├── event recorder            Events on Configurations and Instances
    ├── lag monitor               /healthz fails while the event loop runs late
    ├── health / metrics server   /healthz, /readyz, /metrics (with a metrics port)
    ├── registration server       discovery handlers register here (a socket, 0600 or 0660)
    ├── watch configurations, watch instances                      -> stores
    ├── discovery nursery         per Configuration its discovery, a Discover stream per
    │                             handler endpoint (the reconciler's TaskSet starts them)
    ├── brokerInfo copier         with --broker-info-dir: workload files -> Instances (in DRA
    │                             mode the prepared claims' files; started after the DRA node)
    ├── configuration queue       Configuration key  discovery -> Instances + status
    ├── slot reclaimer            PodResources -> free the slots no container holds (in DRA
    │                             mode the ones Pods of device plugins hold after a switch)
    ├── DRA claims left           claims prepared in DRA mode before a switch back: their slots
    │                             recorded in deviceUsage, their unprepare served, till they
    │                             end (agent/dra/holdings.py); the plugins start after it
    ├── kubelet watch             a kubelet restart -> the plugins register again
    ├── plugin manager            per Instance a device plugin: socket, ListAndWatch streams,
    │                             registration with the kubelet
    │   in DRA mode (`--allocation dra`) instead of the three above:
    └── DRA node                  the node pool reconciler (Instances -> ResourceSlices, a queue
                                  keyed by pool) and the kubelet DRA plugin (agent/dra/node.py)

Each name on a branch is the name its task is started with (tests/agent/test_run_tree.py
compares the two). The discovery nursery and the queue start once both watches have their
first list. The queue is woken by Configuration changes and by Instance changes, which its
mapper first folds into the node view (triggers.py), and by the keys the reconciler's
discoveries and the brokerInfo copier send it. /readyz waits for the first lists, and in DRA
mode for the kubelet plugin's registration.

Cancelling `run_agent` (SIGTERM/SIGINT in the CLI) tears all of it down; each task removes what
it created (sockets) on the way out. Nothing is kept in memory that the cluster does not also
hold: a restarted agent rebuilds its state from the Instances (claims included) and the
discovery handlers re-register. In DRA mode what the kubelet plugin prepared is also in its
checkpoint file (the kubelet may ask to unprepare a claim the API server no longer has).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import trio

from akri_trio.agent.brokerinfo import BrokerInfo, WorkloadDirs
from akri_trio.agent.configurations import ConfigurationReconciler, configuration_store
from akri_trio.agent.dra.holdings import DraHoldings
from akri_trio.agent.events import AgentEvents, instance_ref
from akri_trio.agent.metrics import AgentMetrics
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.plugins.kubelet import KubeletWatch
from akri_trio.agent.plugins.manager import PluginManager
from akri_trio.agent.reclaimer import Reclaimer
from akri_trio.agent.settings import REGISTRATION_SOCKET, AgentSettings, embedded_handlers
from akri_trio.agent.triggers import configuration_changed, instance_changed
from akri_trio.agent.view import NodeView
from akri_trio.discovery.registration import (
    GROUP_SOCKET_MODE,
    SOCKET_MODE,
    serve_registration,
    share_with_group,
)
from akri_trio.discovery.registry import Registry, embedded
from akri_trio.kube import (
    Client,
    Controller,
    EventRecorder,
    ObjectKey,
    Store,
    load_config,
    reflect,
)
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES, Configuration, Instance
from akri_trio.observe.endpoints import serve_observe
from akri_trio.observe.lag import LagMonitor

if TYPE_CHECKING:
    from akri_trio.agent.dra.node import DraNode

__all__ = ["REGISTRATION_SOCKET", "Agent", "AgentSettings", "embedded_handlers", "run_agent"]

log = logging.getLogger(__name__)


@attrs.define
class Agent:
    """Handles to the running agent's parts (for tests and the health endpoint)."""

    settings: AgentSettings
    view: NodeView
    registry: Registry
    configs: Store[Configuration]
    instances: Store[Instance]
    plugins: PluginManager
    reclaimer: Reclaimer
    metrics: AgentMetrics
    metrics_port: int | None = None
    dra: DraNode | None = None
    lag: LagMonitor | None = None


async def _child_nursery(*, task_status: trio.TaskStatus[trio.Nursery]) -> None:
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


def _broker_info(inst: Instance | None) -> Mapping[str, str] | None:
    return None if inst is None else inst.spec.broker_info


def _generation(config: Configuration | None) -> int | None:
    return None if config is None else config.metadata.generation


async def run_agent(
    settings: AgentSettings,
    *,
    api: Client | None = None,
    task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED,
) -> None:
    if api is None:
        async with Client.open(load_config(settings.kubeconfig)) as owned:
            await run_agent(settings, api=owned, task_status=task_status)
        return
    view = NodeView(settings.node, max_capacity=settings.limits.max_capacity)
    registry = Registry(clock=trio.current_time)
    for handler in embedded_handlers(settings):
        registry.register(embedded(handler))
    metrics = AgentMetrics(handlers=registry, slots=view.instances)
    configs = configuration_store()
    instances = view.store  # the one typed cache of Instances, which the view reads
    claims = Claims(api, view)
    recorder = EventRecorder(api, "akri-agent", settings.node)
    events = AgentEvents(
        recorder,
        settings.node,
        configuration=configs.get,
        instance=lambda key: instance_ref(view.instance(key)),
    )
    # What the reconcile's own parts (discovery, brokerInfo) ask the queue to reconcile.
    wake, woken = trio.open_memory_channel[ObjectKey](math.inf)
    # brokerInfo's workload directories, built first: the plugins' Allocate (in DRA mode the
    # DraNode's Prepare) makes and mounts them, and the copier, built after the DraNode whose
    # prepared claims it reads, copies what brokers write there.
    dirs = None
    if settings.broker_info_dir is not None:
        dirs = WorkloadDirs(
            settings.broker_info_dir,
            generation=lambda k: _generation(configs.get(k)),
        )
    watch = KubeletWatch(settings.device_plugin_dir, settings.kubelet_poll_period)
    plugins = PluginManager(
        view,
        claims,
        watch,
        metrics.observe_allocate,
        metrics.plugin_registrations.inc,
        events.allocate_refused,
        workloads=dirs,
        grpc=settings.grpc,
    )
    metrics.plugins_registered.set_function(lambda: float(len(plugins.registered)))
    reclaimer = Reclaimer(
        view,
        claims,
        settings.pod_resources_socket,
        period=settings.reclaim_period,
        grace=settings.reclaim_grace,
        on_freed=metrics.slots_reclaimed.inc,
        on_slots_freed=events.slots_reclaimed,
    )
    ready = [
        ("configurations-synced", lambda: configs.synced),
        ("instances-synced", lambda: instances.synced),
    ]
    dra: DraNode | None = None
    if settings.allocation == "dra":  # no device plugins
        # Imported here: DRA's gRPC services and protobufs cost a device-plugin agent memory.
        from akri_trio.agent.dra.node import DraNode

        dra = DraNode(
            api,
            view,
            instances,
            # All of its namespace(s)' Configurations, unless a selector leaves some out.
            configurations=None if settings.configuration_selector else configs,
            namespace=settings.namespace,
            kubelet_root_dir=settings.kubelet_root_dir,
            cdi_dir=settings.cdi_dir,
            consumable=settings.dra_consumable_capacity,
            workloads=dirs,
            grpc=settings.grpc,
        )
        ready.append(("dra-plugin-registered", dra.ready))
    broker_info = None
    if dirs is not None:
        broker_info = BrokerInfo(
            api,
            view,
            dirs,
            limits=settings.broker_info_limits,
            current=lambda k: _broker_info(instances.get(k)),
            known=lambda: instances.snapshot().keys(),
            namespace=settings.namespace,
            period=settings.broker_info_period,
            on_problems=wake.send_nowait,
            # DRA mode: its workloads are the claims the kubelet plugin prepared.
            held=None if dra is None else dra.held,
            reports=None if dra is None else dra.report,
        )
    settings.discovery_handlers_directory.mkdir(parents=True, exist_ok=True)
    if settings.handler_group is not None:
        share_with_group(settings.discovery_handlers_directory, settings.handler_group)
    lag = LagMonitor(
        settings.lag_threshold, metrics.event_loop_lag.observe, period=settings.lag_period
    )
    async with trio.open_nursery() as root:
        root.start_soon(recorder.run, name="event recorder")
        root.start_soon(lag.run, name="lag monitor")
        port = None
        if settings.metrics_port is not None:
            port = await root.start(
                functools.partial(
                    serve_observe,
                    settings.metrics_host,
                    settings.metrics_port,
                    registry=metrics.registry,
                    ready=ready,
                    live=lag.check,
                    max_connections=settings.metrics_max_connections,
                ),
                name="health / metrics server",
            )
        await root.start(
            functools.partial(
                serve_registration,
                mode=SOCKET_MODE if settings.handler_group is None else GROUP_SOCKET_MODE,
                limits=settings.grpc,
            ),
            registry,
            settings.discovery_handlers_directory / REGISTRATION_SOCKET,
            name="registration server",
        )
        ns = settings.namespace
        root.start_soon(
            functools.partial(
                reflect,
                api,
                CONFIGURATIONS,
                configs,
                namespace=ns,
                label_selector=settings.configuration_selector,
            ),
            name="watch configurations",
        )
        root.start_soon(
            functools.partial(reflect, api, INSTANCES, instances, namespace=ns),
            name="watch instances",
        )
        with trio.fail_after(60):
            await configs.wait_synced()
            await instances.wait_synced()
        discovery_nursery: trio.Nursery = await root.start(_child_nursery, name="discovery nursery")
        reconciler = ConfigurationReconciler(
            api,
            view,
            registry,
            configs,
            discovery_nursery,
            wake.send_nowait,
            metrics,
            settings.limits,
            events=events,
            broker_info_problems=None if broker_info is None else broker_info.problems,
        )
        # No drain: the reconcile is cancel-safe (a restarted agent redoes every write), and
        # what it would go on doing needs the discovery nursery, which closes at shutdown.
        controller = (
            Controller(
                reconciler.reconcile,
                configs,
                workers=4,
                drain=0,
                mapper=configuration_changed(settings.node),
            )
            .watches(instances, instance_changed(view))
            .reconciles_on(woken)
        )
        metrics.queue_depth.labels(controller="configurations").set_function(
            functools.partial(len, controller.queue)
        )
        await root.start(controller.run, name="configuration queue")
        root.start_soon(reclaimer.run, name="slot reclaimer")
        if dra is not None:
            await root.start(dra.run, name="DRA node")
        else:
            holdings = DraHoldings(
                view,
                claims,
                kubelet_root_dir=settings.kubelet_root_dir,
                cdi_dir=settings.cdi_dir,
                grpc=settings.grpc,
            )
            await root.start(holdings.run, name="DRA claims left")
            await root.start(watch.run, name="kubelet watch")
            await root.start(plugins.run, name="plugin manager")
        if broker_info is not None:  # in DRA mode its workloads are the claims prepared above
            root.start_soon(broker_info.run, name="brokerInfo copier")
        log.info("agent for node %s is running", settings.node)
        task_status.started(
            Agent(
                settings,
                view,
                registry,
                configs,
                instances,
                plugins,
                reclaimer,
                metrics,
                port,
                dra,
                lag,
            )
        )
