"""The agent's Prometheus metrics: upstream's families (akri_trio.observe.metrics, with
upstream's names and labels), plus what an operator needs to see Allocate, slots and discovery
at work. One registry per agent, so tests can run several agents in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.slots import held_slots
from akri_trio.discovery.registry import Active, Offline, Registry, Waiting
from akri_trio.model.resources import Instance
from akri_trio.observe.metrics import (
    ALLOCATE_BUCKETS,
    GaugeSnapshot,
    agent_families,
    event_loop_lag,
    new_registry,
    reconcile_queue_depth,
)


def slot_counts(inst: Instance) -> tuple[int, int]:
    """(used, free) slots of an Instance: held entries of its deviceUsage (orphans beyond a
    lowered capacity count as used), and what is left of its capacity."""
    used = len(held_slots(inst.metadata.name, inst.spec.device_usage))
    return used, max(inst.spec.capacity - used, 0)


class SlotsCollector(Collector):
    """`akri_instance_slots{namespace, configuration, instance, state=used|free}`, read from the
    agent's view at scrape time: never stale, nothing to remove when an Instance goes."""

    def __init__(self, instances: Callable[[], Iterable[Instance]]) -> None:
        self._instances = instances

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for inst in self._instances():
            meta = inst.metadata
            used, free = slot_counts(inst)
            labels = [meta.namespace, inst.spec.configuration_name, meta.name]
            family.add_metric([*labels, "used"], used)
            family.add_metric([*labels, "free"], free)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "akri_instance_slots",
            "Slots of each Instance this agent knows, used (held in deviceUsage) or free",
            labels=("namespace", "configuration", "instance", "state"),
        )


class AgentMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        handlers: Registry | None = None,
        slots: Callable[[], Iterable[Instance]] = tuple,
    ) -> None:
        """`handlers`: the discovery handler registry, recounted on each of its changes;
        `slots()`: the Instances whose slots are counted when scraped."""
        self.registry = registry if registry is not None else new_registry()
        r = self.registry
        self.upstream = agent_families(r)
        self.queue_depth = reconcile_queue_depth(r)
        self.allocate_duration = Histogram(
            "akri_allocate_duration_seconds",
            "Allocate calls from the kubelet, including the deviceUsage write, by outcome",
            ("plugin", "outcome"),
            buckets=ALLOCATE_BUCKETS,
            registry=r,
        )
        self.handler_endpoints = GaugeSnapshot(
            Gauge(
                "akri_discovery_handler_endpoints",
                "Registered discovery handler endpoints",
                ("discovery_handler_name", "state"),
                registry=r,
            )
        )
        self.plugins_registered = Gauge(
            "akri_device_plugins_registered",
            "Device plugins registered with the kubelet",
            registry=r,
        )
        self.plugin_registrations = Counter(
            "akri_device_plugin_registrations_total",
            "Successful Register calls to the kubelet (re-registrations after its restarts too)",
            registry=r,
        )
        self.event_loop_lag = event_loop_lag(r)
        self.slots_reclaimed = Counter(
            "akri_slots_reclaimed_total",
            "Slots and virtual devices freed by the reclaimer",
            registry=r,
        )
        r.register(SlotsCollector(slots))
        if handlers is not None:
            handlers.subscribe(lambda _: self.update_handlers(handlers))
            self.update_handlers(handlers)

    # --- discovery and Instances (upstream's families) ----------------------------------------

    def first_response(self, key: ObjectKey, seconds: float) -> None:
        self.upstream.discovery_response_time.labels(configuration=key.name).observe(seconds)

    def discovery_result(self, handler: str, ok: bool) -> None:
        self.upstream.discovery_result(handler, ok)

    def set_instance_count(self, key: ObjectKey, shared: bool, n: int) -> None:
        self.upstream.set_instance_count(key.namespace, key.name, shared, n)

    def forget_configuration(self, key: ObjectKey) -> None:
        self.upstream.forget_configuration(key.namespace, key.name)

    # --- ours ----------------------------------------------------------------------------------

    def observe_allocate(self, plugin: str, outcome: str, seconds: float) -> None:
        self.allocate_duration.labels(plugin=plugin, outcome=outcome).observe(seconds)

    def update_handlers(self, registry: Registry) -> None:
        """Recount registered endpoints by state (call on every registry event)."""
        counts: dict[tuple[str, ...], float] = {}
        for name in registry.names():
            states = list(registry.get(name).values())
            for label, kind in (("Waiting", Waiting), ("Active", Active), ("Offline", Offline)):
                counts[(name, label)] = sum(isinstance(s, kind) for s in states)
        self.handler_endpoints.replace(counts)
