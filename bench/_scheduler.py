"""A kube-scheduler of the bench's own, beside the shared cluster's, and what its metrics say.

The cluster's scheduler is shared with other sessions' tests and runs with the default client
limits; its /metrics refuses the test cluster's tokens. A storm bench needs to vary the limits
(`clientConnection.qps` / `burst` of a KubeSchedulerConfiguration) and read where the time went,
without restarting anyone's control plane. So `own_scheduler` starts the same binary as a second
scheduler: one profile (`SCHEDULER_NAME`, which the bench's Pods name in `spec.schedulerName`,
so the cluster's scheduler leaves them alone and this one touches nothing else), leader election
off, the cluster's scheduler identity (its kubeconfig and RBAC), and /metrics open to anonymous
reads on its own loopback port. It is stopped on exit (SIGTERM, SIGKILL after a bound).
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import attrs
import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from akri_trio_dev.cluster.layout import Layout
from bench._agent_proc import child_process

SCHEDULER_NAME = "akri-bench-storm"
# kube-scheduler's defaults (component-base's ClientConnectionConfiguration for the scheduler)
DEFAULT_LIMITS = "50/100"

Sample = tuple[str, frozenset[tuple[str, str]]]


@attrs.frozen
class Limits:
    """The scheduler client's `clientConnection.qps` and `burst`, written `qps/burst`."""

    qps: int
    burst: int

    @classmethod
    def parse(cls, text: str) -> Limits:
        qps, burst = text.split("/")
        return cls(int(qps), int(burst))

    def __str__(self) -> str:
        return f"{self.qps}/{self.burst}"


def scheduler_config(kubeconfig: Path, limits: Limits) -> str:
    """The KubeSchedulerConfiguration (JSON is YAML) of the bench's scheduler."""
    return json.dumps(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": str(kubeconfig),
                "qps": limits.qps,
                "burst": limits.burst,
            },
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": SCHEDULER_NAME}],
        }
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@attrs.frozen
class Scheduler:
    url: str
    http: httpx.AsyncClient

    async def metrics(self) -> dict[Sample, float]:
        """Every sample of /metrics, keyed by name and labels."""
        reply = await self.http.get(f"{self.url}/metrics")
        reply.raise_for_status()
        return parse_metrics(reply.text)


@asynccontextmanager
async def own_scheduler(
    k8s_version: str, limits: Limits, workdir: Path, limit_s: float = 60
) -> AsyncIterator[Scheduler]:
    """The bench's kube-scheduler (see the module docstring), ready (/readyz: its informers
    synced) when this yields; its log in `workdir/kube-scheduler.log`."""
    lay = Layout.default(k8s_version)
    config = workdir / "kube-scheduler.json"
    config.write_text(scheduler_config(lay.kubeconfig("scheduler"), limits))
    port = free_port()
    cmd = [
        str(lay.binary("kube-scheduler")),
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'certs'}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        "--v=1",
    ]
    url = f"https://127.0.0.1:{port}"
    async with (
        child_process(cmd, workdir / "kube-scheduler.log") as proc,
        httpx.AsyncClient(verify=False, timeout=10) as http,  # its self-signed serving cert
    ):
        with trio.fail_after(limit_s):
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"kube-scheduler exited: {workdir / 'kube-scheduler.log'}")
                with suppress(httpx.TransportError):
                    if (await http.get(f"{url}/readyz")).status_code == 200:
                        break
                await trio.sleep(0.2)
        yield Scheduler(url, http)


# --- reading the metrics ----------------------------------------------------------------------


def parse_metrics(text: str) -> dict[Sample, float]:
    """Every sample of a Prometheus text exposition, keyed by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def since(before: Mapping[Sample, float], after: Mapping[Sample, float]) -> dict[Sample, float]:
    """What counters and histograms gained between two scrapes."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def total(samples: Mapping[Sample, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def label_values(samples: Iterable[Sample], name: str, label: str) -> list[str]:
    return sorted({dict(ls)[label] for n, ls in samples if n == name and label in dict(ls)})


EXTENSION_POINTS = ("PreFilter", "Filter", "Reserve", "PreBind", "Bind")
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


@attrs.frozen
class Cost:
    """What one phase of a bench (`pods` Pods) cost the bench's scheduler, from its metrics."""

    pods: int
    attempts: dict[str, float]  # scheduling attempts by result
    algorithm_s: float  # filtering and scoring: the one queue's part, one Pod at a time
    attempt_s: float  # whole attempts (scheduling and binding cycles), all attempts
    points_s: dict[str, float]  # seconds in each extension point, all attempts
    limiter_s: float  # seconds the client's requests waited in its rate limiters, all together
    limited: float  # requests that went through the rate limiters
    writes: float  # the scheduler's writes (its events' included)

    @classmethod
    def of(cls, pods: int, d: Mapping[Sample, float]) -> Cost:
        attempts = "scheduler_schedule_attempts_total"
        points = "scheduler_framework_extension_point_duration_seconds_sum"
        limiter = "rest_client_rate_limiter_duration_seconds"
        return cls(
            pods=pods,
            attempts={r: total(d, attempts, result=r) for r in label_values(d, attempts, "result")},
            algorithm_s=total(d, "scheduler_scheduling_algorithm_duration_seconds_sum"),
            attempt_s=total(d, "scheduler_scheduling_attempt_duration_seconds_sum"),
            points_s={p: total(d, points, extension_point=p) for p in EXTENSION_POINTS},
            limiter_s=total(d, f"{limiter}_sum"),
            limited=total(d, f"{limiter}_count"),
            writes=sum(total(d, "rest_client_requests_total", method=m) for m in WRITE_METHODS),
        )

    def line(self) -> str:
        n = self.pods
        tried = ", ".join(f"{r} {int(k)}" for r, k in self.attempts.items() if k)
        points = ", ".join(f"{p} {s / n * 1e3:.1f}" for p, s in self.points_s.items())
        return (
            f"attempts: {tried}; ms per Pod: attempts {self.attempt_s / n * 1e3:.0f}, "
            f"algorithm {self.algorithm_s / n * 1e3:.1f}, {points}; rate limiter: "
            f"{self.limiter_s:.2f} s summed over {int(self.limited)} requests "
            f"({self.limiter_s / n * 1e3:.0f} ms per Pod); scheduler writes per Pod "
            f"{self.writes / n:.1f}"
        )
