"""The controller's Prometheus metrics: upstream's broker gauge plus how reconciling goes.

`akri_broker_pod_count{configuration,node}` is computed at scrape time from the broker Pods the
controller already caches (a callable gives them), so no bookkeeping can drift from the
cluster. Reconcile outcomes and durations are per reconciler (`instance`, `services`, `node`);
queue depths are read from the queues when scraped.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from akri_trio.model import naming
from akri_trio.observe.metrics import (
    MetricFamily,
    ProcessCollector,
    Registry,
    Sample,
)

RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class BrokerPodCount:
    """A collector: Instance-owned broker Pods not being deleted, by Configuration and node."""

    NAME = "akri_broker_pod_count"

    def __init__(self, pods: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._pods = pods

    def names(self) -> Iterable[str]:
        return (self.NAME,)

    def collect(self) -> Iterable[MetricFamily]:
        counts: Tally[tuple[str, str]] = Tally()
        for pod in self._pods():
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            labels = meta.get("labels") or {}
            node = labels.get(naming.LABEL_TARGET_NODE)
            if node is None:
                continue  # a Job's Pod: not placed on a node by the controller
            counts[(labels.get(naming.LABEL_CONFIGURATION, ""), node)] += 1
        samples = tuple(
            Sample(self.NAME, (("configuration", config), ("node", node)), float(n))
            for (config, node), n in sorted(counts.items())
        )
        return (MetricFamily(self.NAME, "Broker Pods the controller runs", "gauge", samples),)


class ControllerMetrics:
    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        # The broker Pods cached while leading (none while standing by).
        self.broker_pods: Callable[[], Iterable[Mapping[str, Any]]] = lambda: ()
        r = self.registry
        r.register(ProcessCollector())
        r.register(BrokerPodCount(lambda: self.broker_pods()))
        self.reconciles = r.counter(
            "akri_controller_reconcile_total",
            "Reconciles by reconciler and outcome (ok, requeue, error)",
            ("reconciler", "outcome"),
        )
        self.reconcile_duration = r.histogram(
            "akri_controller_reconcile_duration_seconds",
            "Seconds per reconcile, API requests included",
            ("reconciler",),
            buckets=RECONCILE_BUCKETS,
        )
        self.queue_depth = r.gauge(
            "akri_controller_queue_depth", "Keys waiting to be reconciled", ("reconciler",)
        )
        self.leader = r.gauge("akri_controller_leader", "1 while this replica leads")
        self.writes = r.counter(
            "akri_controller_writes_total",
            "API writes by kind of object and verb",
            ("kind", "verb"),
        )
