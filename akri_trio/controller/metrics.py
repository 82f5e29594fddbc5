"""The controller's Prometheus metrics: upstream's broker gauge plus how reconciling goes.

`akri_broker_pod_count{configuration,node}` is computed at scrape time from the broker Pods the
controller already caches (a callable gives them), so no bookkeeping can drift from the
cluster. Reconcile outcomes and durations are per reconciler (`instance`, `services`, `node`);
queue depths (`akri_reconcile_queue_depth{controller}`) are read from the queues when scraped.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from akri_trio.model import naming
from akri_trio.observe.metrics import new_registry, reconcile_queue_depth

# Fine around 100 ms (the reconcile p99 target): a p99 below it falls in a bucket that says so,
# one above it says by how much.
RECONCILE_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.06,
    0.07,
    0.08,
    0.09,
    0.1,
    0.125,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)
BROKER_POD_COUNT = "akri_broker_pod_count"


def broker_pod_counts(pods: Iterable[Mapping[str, Any]]) -> Tally[tuple[str, str]]:
    """Instance-owned broker Pods not being deleted, by (Configuration, node)."""
    counts: Tally[tuple[str, str]] = Tally()
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        node = labels.get(naming.LABEL_TARGET_NODE)
        if node is None:
            continue  # a Job's Pod: not placed on a node by the controller
        counts[(labels.get(naming.LABEL_CONFIGURATION, ""), node)] += 1
    return counts


class BrokerPodCount(Collector):
    """Upstream's gauge, from the cached broker Pods at each scrape."""

    def __init__(self, pods: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._pods = pods

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(BROKER_POD_COUNT, "", labels=["configuration", "node"])]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            BROKER_POD_COUNT,
            "Akri Broker Pod Count: broker Pods by Configuration and node",
            labels=["configuration", "node"],
        )
        for (config, node), n in sorted(broker_pod_counts(self._pods()).items()):
            family.add_metric([config, node], float(n))
        yield family


class ControllerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        broker_pods: Callable[[], Iterable[Mapping[str, Any]]] = tuple,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        """`broker_pods()`: the broker Pods cached (none while standing by); `leading()`:
        whether this replica leads. Both are read when scraped."""
        self.registry = registry if registry is not None else new_registry()
        r = self.registry
        r.register(BrokerPodCount(broker_pods))
        self.reconciles = Counter(
            "akri_controller_reconcile",
            "Reconciles by reconciler and outcome (ok, requeue, error)",
            ("reconciler", "outcome"),
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "akri_controller_reconcile_duration_seconds",
            "Seconds per reconcile, API requests included",
            ("reconciler",),
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.queue_depth = reconcile_queue_depth(r)
        self.leader = Gauge("akri_controller_leader", "1 while this replica leads", registry=r)
        self.leader.set_function(lambda: 1.0 if leading() else 0.0)
        self.writes = Counter(
            "akri_controller_writes",
            "API writes by kind of object and verb",
            ("kind", "verb"),
            registry=r,
        )
