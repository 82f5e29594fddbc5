"""`run_agent`: the agent's ONE nursery tree, readable from here.

    run_agent
    ├── event recorder                                       Events on Configurations, Instances
    ├── event-loop lag monitor                               /healthz fails when the loop crawls
    ├── health / metrics server
    ├── discovery-handler registration server (UDS, 0600)   handlers register here
    ├── watches: Configurations, Instances -> stores        one watch each, shared by all below
    ├── discovery nursery
    │   └── per Configuration: Discover stream per handler endpoint
    ├── brokerInfo copier (with --broker-info-dir)           workload files -> Instances
    ├── Configuration reconcile queue                        discovery -> Instances + status;
    │                                                        tells the view of Instance changes
    ├── device-plugin mode (the default):
    │   ├── kubelet watch                                    restarts -> plugins re-register
    │   ├── plugin nursery (PluginManager)
    │   │   └── per plugin: socket server + ListAndWatch streams + registration
    │   └── slot reclaimer                                   PodResources -> free unused slots
    └── or DRA mode (DraNode): node pool reconciler (Instances -> ResourceSlices, a queue
        keyed by pool) and the kubelet DRA plugin (claims -> CDI specs); /readyz waits for
        its registration

Cancelling `run_agent` (SIGTERM/SIGINT in the CLI) tears all of it down; each task removes what
it created (sockets) on the way out. Nothing is kept in memory that the cluster does not also
hold: a restarted agent rebuilds its state from the Instances (claims included) and the
discovery handlers re-register. In DRA mode what the kubelet plugin prepared is also in its
checkpoint file (the kubelet may ask to unprepare a claim the API server no longer has).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from akri_trio.agent.brokerinfo import DEFAULT_PERIOD_S as BROKER_INFO_PERIOD_S
from akri_trio.agent.brokerinfo import BrokerInfo, Limits
from akri_trio.agent.configurations import (
    CONFIG_INDEXES,
    ConfigurationLimits,
    ConfigurationReconciler,
)
from akri_trio.agent.events import AgentEvents
from akri_trio.agent.metrics import AgentMetrics
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.plugins.kubelet import POLL_S as KUBELET_POLL_S
from akri_trio.agent.plugins.kubelet import KubeletWatch
from akri_trio.agent.plugins.manager import PluginManager
from akri_trio.agent.reclaimer import DEFAULT_PERIOD_S, Reclaimer
from akri_trio.agent.triggers import configuration_changed, instance_changed
from akri_trio.agent.view import NodeView
from akri_trio.discovery.handlers import load_handler
from akri_trio.discovery.handlers.debug_echo import DEFAULT_POLL_S as DEBUG_ECHO_POLL_S
from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.discovery.interface import AnyHandler
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
    ObjectRef,
    Store,
    drop_managed_fields,
    load_config,
    reflect,
)
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES, Instance
from akri_trio.observe.endpoints import serve_observe
from akri_trio.observe.lag import LAG_THRESHOLD_S, SAMPLE_PERIOD_S, LagMonitor
from akri_trio.runtime.http import DEFAULT_MAX_CONNECTIONS

if TYPE_CHECKING:
    from akri_trio.agent.dra.node import DraNode

log = logging.getLogger(__name__)

REGISTRATION_SOCKET = "agent-registration.sock"


@attrs.frozen
class AgentSettings:
    node: str
    discovery_handlers_directory: Path = Path("/var/lib/akri")
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    kubeconfig: Path | None = None
    namespace: str | None = None  # watch Configurations/Instances in this namespace only
    configuration_selector: str | None = None  # watch only the Configurations it selects
    handler_group: int | None = None  # discovery handlers of this group may register (non-root)
    embedded_handlers: tuple[str, ...] = ()  # built-in handlers to run in-process, by name
    # Handler objects to run in-process (programmatic embedding: custom handlers, tests).
    handlers: tuple[AnyHandler, ...] = ()
    enable_debug_echo: bool = False
    debug_echo_shared: bool = False
    debug_echo_availability: Path | None = None
    debug_echo_poll_period: float = DEBUG_ECHO_POLL_S
    # Seconds between two looks for a kubelet restart (akri_trio.agent.plugins.kubelet).
    kubelet_poll_period: float = KUBELET_POLL_S
    metrics_port: int | None = 8080
    metrics_host: str = "0.0.0.0"
    metrics_max_connections: int = DEFAULT_MAX_CONNECTIONS
    # /healthz fails while the event loop runs this many seconds late (akri_trio.observe.lag).
    lag_threshold: float = LAG_THRESHOLD_S
    lag_period: float = SAMPLE_PERIOD_S
    reclaim_period: float = DEFAULT_PERIOD_S
    reclaim_grace: float | None = None
    # What one Configuration may cost this node.
    limits: ConfigurationLimits = attrs.field(factory=ConfigurationLimits)
    broker_info_dir: Path | None = None  # brokerInfo off when None
    broker_info_limits: Limits = attrs.field(factory=Limits)
    broker_info_period: float = BROKER_INFO_PERIOD_S
    allocation: str = "device-plugin"  # or "dra": ResourceSlices + a DRA kubelet plugin
    kubelet_root_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    # DRA capacity: None asks the API server (consumable capacity where it is served); False
    # publishes slot devices anyway (tests of slot mode on a cluster that has both).
    dra_consumable_capacity: bool | None = None


@attrs.define
class Agent:
    """Handles to the running agent's parts (for tests and the health endpoint)."""

    settings: AgentSettings
    view: NodeView
    registry: Registry
    configs: Store
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


def _instance_ref(view: NodeView, key: ObjectKey) -> ObjectRef | None:
    inst = view.instance(key)
    if inst is None:
        return None
    meta = inst.metadata
    return ObjectRef(inst.api_version, inst.kind, meta.namespace, meta.name, meta.uid)


def _broker_info(inst: Instance | None) -> Mapping[str, str] | None:
    return None if inst is None else inst.spec.broker_info


def _field(obj: Mapping[str, Any] | None, *path: str) -> Any:
    for name in path:
        obj = (obj or {}).get(name)
    return obj


def embedded_handlers(settings: AgentSettings) -> list[AnyHandler]:
    """The handlers this agent runs in-process. A built-in handler's module, and so its
    libraries, is imported here, only when the settings enable it."""
    handlers: list[AnyHandler] = []
    if settings.enable_debug_echo:
        echo = DebugEcho(
            shared=settings.debug_echo_shared, poll_interval=settings.debug_echo_poll_period
        )
        if settings.debug_echo_availability is not None:
            echo = attrs.evolve(echo, availability_path=settings.debug_echo_availability)
        handlers.append(echo)
    handlers.extend(load_handler(name, os.environ) for name in settings.embedded_handlers)
    handlers.extend(settings.handlers)
    return handlers


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
    metrics = AgentMetrics()
    registry.subscribe(lambda _: metrics.update_handlers(registry))
    metrics.update_handlers(registry)
    configs = Store(transform=drop_managed_fields, indexes=CONFIG_INDEXES)
    instances = view.store  # the one typed cache of Instances, which the view reads
    claims = Claims(api, view)
    recorder = EventRecorder(api, "akri-agent", settings.node)
    events = AgentEvents(
        recorder,
        settings.node,
        configuration=configs.get,
        instance=lambda key: _instance_ref(view, key),
    )
    controller: Controller
    broker_info = None
    if settings.broker_info_dir is not None:
        broker_info = BrokerInfo(
            api,
            view,
            settings.broker_info_dir,
            limits=settings.broker_info_limits,
            generation=lambda k: _field(configs.get(k), "metadata", "generation"),
            current=lambda k: _broker_info(instances.get(k)),
            known=lambda: instances.snapshot().keys(),
            namespace=settings.namespace,
            period=settings.broker_info_period,
            on_problems=lambda k: controller.queue.enqueue(k),
        )
    watch = KubeletWatch(settings.device_plugin_dir, settings.kubelet_poll_period)
    plugins = PluginManager(
        view,
        claims,
        watch,
        metrics.observe_allocate,
        metrics.plugin_registrations.inc,
        events.allocate_refused,
        workloads=broker_info,
    )
    metrics.plugins_registered.set_function(lambda: float(len(plugins.registered)))
    metrics.watch_slots(view.instances)
    reclaimer = Reclaimer(
        view,
        claims,
        settings.pod_resources_socket,
        period=settings.reclaim_period,
        grace=settings.reclaim_grace,
        on_freed=metrics.slots_reclaimed.inc,
        on_slots_freed=events.slots_reclaimed,
    )
    dra = None
    ready = [
        ("configurations-synced", lambda: configs.synced),
        ("instances-synced", lambda: instances.synced),
    ]
    if settings.allocation == "dra":  # no device plugins, nothing to reclaim
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
        )
        ready.append(("dra-plugin-registered", dra.ready))
    settings.discovery_handlers_directory.mkdir(parents=True, exist_ok=True)
    if settings.handler_group is not None:
        share_with_group(settings.discovery_handlers_directory, settings.handler_group)
    lag = LagMonitor(
        settings.lag_threshold, metrics.event_loop_lag.observe, period=settings.lag_period
    )
    async with trio.open_nursery() as root:
        root.start_soon(recorder.run)
        root.start_soon(lag.run)
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
                )
            )
        await root.start(
            functools.partial(
                serve_registration,
                mode=SOCKET_MODE if settings.handler_group is None else GROUP_SOCKET_MODE,
            ),
            registry,
            settings.discovery_handlers_directory / REGISTRATION_SOCKET,
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
            )
        )
        root.start_soon(functools.partial(reflect, api, INSTANCES, instances, namespace=ns))
        with trio.fail_after(60):
            await configs.wait_synced()
            await instances.wait_synced()
        discovery_nursery: trio.Nursery = await root.start(_child_nursery)
        reconciler = ConfigurationReconciler(
            api,
            view,
            registry,
            configs,
            discovery_nursery,
            lambda key: controller.queue.enqueue(key),
            metrics,
            settings.limits,
            events=events,
            broker_info_problems=None if broker_info is None else broker_info.problems,
        )
        # No drain: the reconcile is cancel-safe (a restarted agent redoes every write), and
        # what it would go on doing needs the discovery nursery, which closes at shutdown.
        controller = Controller(
            reconciler.reconcile,
            configs,
            workers=4,
            drain=0,
            mapper=configuration_changed(settings.node),
        ).watches(instances, instance_changed(view))
        metrics.queue_depth.labels(controller="configurations").set_function(
            lambda: float(len(controller.queue))
        )
        if broker_info is not None:
            root.start_soon(broker_info.run)
        await root.start(controller.run)
        if dra is not None:
            await root.start(dra.run)
        else:
            await root.start(watch.run)
            await root.start(plugins.run)
            root.start_soon(reclaimer.run)
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
