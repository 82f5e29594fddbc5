"""The agent's Prometheus metrics: upstream's names (which upstream declares but never
exports), plus what an operator needs to see Allocate and discovery at work."""

from __future__ import annotations

from akri_trio.discovery.registry import Active, Offline, Registry, Waiting
from akri_trio.observe.metrics import ProcessCollector
from akri_trio.observe.metrics import Registry as MetricsRegistry

DISCOVERY_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # upstream's range
ALLOCATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class AgentMetrics:
    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry if registry is not None else MetricsRegistry()
        r = self.registry
        r.register(ProcessCollector())
        self.instance_count = r.gauge(
            "akri_instance_count", "Instances this node serves", ("configuration", "is_shared")
        )
        self.discovery_response_time = r.histogram(
            "akri_discovery_response_time",
            "Seconds from starting discovery for a Configuration to its first result",
            ("configuration",),
            buckets=DISCOVERY_BUCKETS,
        )
        self.discovery_response_result = r.counter(
            "akri_discovery_response_result",
            "Discovery results received, by handler and whether they carried a problem",
            ("discovery_handler_name", "result"),
        )
        self.allocate_duration = r.histogram(
            "akri_allocate_duration_seconds",
            "Allocate calls from the kubelet, including the deviceUsage write",
            ("plugin", "outcome"),
            buckets=ALLOCATE_BUCKETS,
        )
        self.handler_endpoints = r.gauge(
            "akri_discovery_handler_endpoints",
            "Registered discovery handler endpoints",
            ("discovery_handler_name", "state"),
        )
        self.plugins_registered = r.gauge(
            "akri_device_plugins_registered", "Device plugins registered with the kubelet"
        )
        self.plugin_registrations = r.counter(
            "akri_device_plugin_registrations_total",
            "Successful Register calls to the kubelet (re-registrations after its restarts too)",
        )
        self.slots_reclaimed = r.counter(
            "akri_slots_reclaimed_total", "Slots and virtual devices freed by the reclaimer"
        )

    def observe_allocate(self, plugin: str, outcome: str, seconds: float) -> None:
        self.allocate_duration.labels(plugin=plugin, outcome=outcome).observe(seconds)

    def update_handlers(self, registry: Registry) -> None:
        """Recount registered endpoints by state (call on every registry event)."""
        self.handler_endpoints.clear()
        for name in registry.names():
            states = list(registry.get(name).values())
            for label, kind in (("Waiting", Waiting), ("Active", Active), ("Offline", Offline)):
                count = sum(isinstance(s, kind) for s in states)
                self.handler_endpoints.labels(discovery_handler_name=name, state=label).set(count)
