"""Prometheus metrics on `prometheus_client`, with upstream Akri's names and labels.

Dashboards and alerts written for upstream Akri query `akri_instance_count`,
`akri_discovery_response_time`, `akri_discovery_response_result` and `akri_broker_pod_count`
with upstream's label names and values; they must work against us unchanged. Upstream declares
these in its agent and controller; the agent's live here (`agent_families`), the controller's
beside it (controller/metrics.py), on the same helpers.

`prometheus_client` does the bookkeeping and the text format. Two things it does differently
from upstream's Rust client, handled here:
- It names a counter's sample `<name>_total`. Upstream's `akri_discovery_response_result` has
  no suffix, so a query for it would find nothing. `SuffixlessCounter` exports it under the
  bare name, as an untyped family (the text format cannot say "counter" for a name without
  `_total` through this client); PromQL sees the same series either way.
- It adds a `_created` series per counter and histogram. Upstream has none and they double the
  series count, so they are switched off for the process (`disable_created_metrics`).

A labelled child lives until removed: a deleted Configuration must not report a stale gauge
forever. `remove_matching` drops every child whose labels include a partial set, and
`GaugeSnapshot` replaces a gauge's whole set of children with the current one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = [
    "ALLOCATE_BUCKETS",
    "CONTENT_TYPE",
    "DISCOVERY_BUCKETS",
    "LAG_BUCKETS",
    "GaugeSnapshot",
    "Registry",
    "SuffixlessCounter",
    "UpstreamFamilies",
    "agent_families",
    "event_loop_lag",
    "new_registry",
    "reconcile_queue_depth",
    "remove_matching",
    "render",
]

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

Registry = CollectorRegistry

# The classic text format: every Prometheus since 2.0 reads it, and its escaping is the one
# generate_latest writes by default (underscores for names outside the legacy charset).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# upstream's akri_discovery_response_time buckets, in seconds
DISCOVERY_BUCKETS: tuple[float, ...] = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 60.0)
# Allocate is one gRPC answer plus one PATCH: sub-millisecond to a second.
ALLOCATE_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
)  # fmt: skip


# How late the event loop wakes a sleeping task: a healthy loop is well under a millisecond.
LAG_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


def event_loop_lag(registry: CollectorRegistry) -> Histogram:
    """`akri_event_loop_lag_seconds`: each sample of akri_trio.observe.lag.LagMonitor."""
    return Histogram(
        "akri_event_loop_lag_seconds",
        "How much later than asked the event loop woke a task sleeping a fixed period",
        buckets=LAG_BUCKETS,
        registry=registry,
    )


def new_registry(*, process: bool = True) -> CollectorRegistry:
    """A registry of its own per component (tests run several agents in one process), with the
    standard `process_*` metrics upstream's Rust client also exports."""
    registry = CollectorRegistry(auto_describe=True)
    if process:
        ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The /metrics body. Collectors run here; an exception in one propagates."""
    return prometheus_client.generate_latest(registry)


def remove_matching(metric: Counter | Gauge | Histogram, **partial: str) -> None:
    """Forget every child whose labels include `partial` (a Configuration is gone: all its
    `{configuration=..., ...}` children go with it). An empty `partial` is refused: it would
    match everything, which is never what a caller that forgot a label meant."""
    if not partial:
        raise ValueError("remove_matching needs at least one label")
    metric.remove_by_labels(dict(partial))


class GaugeSnapshot:
    """A labelled gauge whose whole set of children is replaced at once: `replace(values)` sets
    every given label set and removes those it set before and no longer gets."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._set: set[tuple[str, ...]] = set()

    def replace(self, values: Mapping[tuple[str, ...], float]) -> None:
        """`values` maps label values, in the gauge's label order, to the value to show."""
        for labels, value in values.items():
            self.gauge.labels(*labels).set(value)
        for gone in self._set - values.keys():
            self.gauge.remove(*gone)
        self._set = set(values)


class SuffixlessCounter(Collector):
    """A labelled counter exported under its bare name, as upstream's Rust client does (see the
    module docstring). Register it like any collector; count with `.labels(...).inc()`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self._counter = Counter(name, documentation, labelnames, registry=None)
        self._documentation = documentation
        if registry is not None:
            registry.register(self)

    def labels(self, **labels: str) -> Counter:
        return self._counter.labels(**labels)

    def remove_matching(self, **partial: str) -> None:
        remove_matching(self._counter, **partial)

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self._documentation, "unknown")]

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self._documentation, "unknown")
        for counted in self._counter.collect():
            for sample in counted.samples:
                if sample.name == f"{self.name}_total":
                    family.add_sample(self.name, sample.labels, sample.value)
        yield family


class UpstreamFamilies:
    """Upstream's agent metrics, with upstream's label names and values:

    - `akri_instance_count{configuration, is_shared, namespace}`: Instances this node serves,
      by Configuration *name* (upstream's value) and "true"/"false"; `namespace` is ours, added
      because names repeat across namespaces (a query on the other two labels still matches);
    - `akri_discovery_response_time{configuration}`: seconds from a Configuration's discovery
      start to its first answer, in upstream's buckets;
    - `akri_discovery_response_result{discovery_handler_name, result}`: "Success" for each
      answer from a handler, "Fail" for each failed attempt (untyped, see SuffixlessCounter).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.instance_count = Gauge(
            "akri_instance_count",
            "Akri Instance Count: Instances this node serves, by Configuration and sharing",
            ("configuration", "is_shared", "namespace"),
            registry=registry,
        )
        self.discovery_response_time = Histogram(
            "akri_discovery_response_time",
            "Akri Discovery Response Time: seconds from starting discovery to the first answer",
            ("configuration",),
            buckets=DISCOVERY_BUCKETS,
            registry=registry,
        )
        self.discovery_response_result = SuffixlessCounter(
            "akri_discovery_response_result",
            "Akri Discovery Response Result: answers (Success) and failed attempts (Fail)",
            ("discovery_handler_name", "result"),
            registry=registry,
        )

    def set_instance_count(self, namespace: str, configuration: str, shared: bool, n: int) -> None:
        self.instance_count.labels(
            configuration=configuration, is_shared=str(shared).lower(), namespace=namespace
        ).set(n)

    def forget_configuration(self, namespace: str, configuration: str) -> None:
        """The Configuration is gone: drop its instance counts (its latency history stays)."""
        remove_matching(self.instance_count, namespace=namespace, configuration=configuration)

    def discovery_result(self, handler: str, ok: bool) -> None:
        self.discovery_response_result.labels(
            discovery_handler_name=handler, result="Success" if ok else "Fail"
        ).inc()


def agent_families(registry: CollectorRegistry) -> UpstreamFamilies:
    return UpstreamFamilies(registry)


def reconcile_queue_depth(registry: CollectorRegistry) -> Gauge:
    """`akri_reconcile_queue_depth{controller}`: keys waiting in a controller's reconcile queue
    (ready, dirty or delayed); drive a child with `set_function(lambda: len(queue))`."""
    return Gauge(
        "akri_reconcile_queue_depth",
        "Keys waiting in a reconcile queue (ready, dirty or delayed)",
        ("controller",),
        registry=registry,
    )
