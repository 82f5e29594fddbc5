"""The controller: Instance -> broker Pod latency against a floor measured in the same run, and
what 1,000 Instances cost it.

    .venv/bin/python -m bench.controller_latency [--samples 200] [--instances 1000] [--idle 60]

The controller runs as its own process (`akri-trio controller --namespace <ours>
--no-leader-elect`), watching only this benchmark's namespace. Brokers have a nodeSelector no
node matches, so Pods stay Pending and nothing runs; the Configuration names a discovery
handler no agent has, so other people's agents make no Instances for it. The Instances name a
Node object of the bench's own (no kubelet, tainted NoSchedule, its node Lease renewed so it
stays Ready): the controller would clean up after a node that does not exist.

Phases:
  latency   `--samples` times, alternating: the floor — one bare POST of the same Pod body the
            controller would make (in another namespace) — then one Instance created, timed from
            its POST's answer until its broker Pod shows up in a watch of this process
  scale     `--instances` Instances created (20 at a time); time until every broker exists;
            the controller's RSS; its reconcile p99 (from its /metrics histogram, for the
            latency phase's one-at-a-time reconciles and for this burst apart); API
            requests per new Instance; then one change to each Instance that changes no broker
            (a brokerProperties edit) and the requests that cost
  idle      `--idle` s with nothing changing: requests sent (target 0)
Requests are counted two ways: the controller's own `akri_controller_writes_total`, and the API
server's `apiserver_request_total` for pods, services and jobs (mutating verbs and GETs, not
the status subresource), whose
delta includes any other client writing those kinds meanwhile on this shared cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from akri_trio.controller.reconcilers import PODS
from akri_trio.kube import JSON, Client, NotFound, ObjectKey, Resource, Store, reflect
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._common import (
    REPO,
    bench_api,
    cluster_env,
    machine,
    ms,
    now,
    record_run,
    summary,
    table,
)
from tests.controller.support import fake_nodes
from tests.support.akri_cluster import NAMESPACES, ensure_namespace, install_crds

NS = "akri-bench-controller"
FLOOR_NS = "akri-bench-controller-floor"
CONFIG = "bcfg"
NOWHERE = {"akri-trio-bench/nowhere": "true"}
WARMUP = 10
SERVICE_ACCOUNTS = Resource.core("serviceaccounts", "ServiceAccount")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def configuration() -> JSON:
    container = {
        "name": "broker",
        "image": "docker.io/library/busybox:latest",
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
    }
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": CONFIG, "namespace": NS},
        "spec": {
            "discoveryHandler": {"name": "benchNoHandler", "discoveryDetails": ""},
            "capacity": 1,
            "brokerSpec": {"brokerPodSpec": {"containers": [container], "nodeSelector": NOWHERE}},
        },
    }


def instance(config: JSON, name: str, node: str) -> JSON:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {
            "name": name,
            "namespace": NS,
            "ownerReferences": [
                {
                    "apiVersion": "akri.sh/v0",
                    "kind": "Configuration",
                    "name": CONFIG,
                    "uid": config["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "configurationName": CONFIG,
            "cdiName": f"akri.sh/{CONFIG}={name}",
            "capacity": 1,
            "shared": False,
            "nodes": [node],
            "brokerProperties": {},
        },
    }


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


_SAMPLE = re.compile(r"^([a-zA-Z_:]+)\{([^}]*)\} (\S+)$")


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append((labels, float(m.group(3))))
    return out


async def apiserver_requests(api: Client) -> float:
    """apiserver_request_total for pods/services/jobs themselves (not their status or binding
    subresources, which the scheduler writes), mutating verbs and GET."""
    text = (await api.http.get("/metrics")).text
    total = 0.0
    for labels, value in samples(text, "apiserver_request_total"):
        if labels.get("subresource"):
            continue
        if labels.get("resource") in ("pods", "services", "jobs") and labels.get("verb") in (
            "POST",
            "PUT",
            "PATCH",
            "DELETE",
            "GET",
            "APPLY",
        ):
            total += value
    return total


def controller_writes(text: str) -> float:
    return sum(v for _, v in samples(text, "akri_controller_writes_total"))


def _buckets(text: str, reconciler: str) -> dict[float, float]:
    return {
        float(labels["le"]): v
        for labels, v in samples(text, "akri_controller_reconcile_duration_seconds_bucket")
        if labels.get("reconciler") == reconciler
    }


def reconcile_p99(text: str, before: str = "", reconciler: str = "instance") -> float:
    """The upper bound of the histogram bucket holding the 99th percentile of the reconciles
    observed between the scrapes `before` (none: since start) and `text`."""
    old = _buckets(before, reconciler)
    buckets = sorted((le, v - old.get(le, 0.0)) for le, v in _buckets(text, reconciler).items())
    if not buckets or buckets[-1][1] <= 0:
        return float("nan")
    total = buckets[-1][1]
    return next(le for le, count in buckets if count >= 0.99 * total)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@asynccontextmanager
async def controller_process(kubeconfig: str, port: int, log: Path) -> AsyncIterator[int]:
    cmd = [
        sys.executable, "-m", "akri_trio", "controller",
        "--kubeconfig", kubeconfig,
        "--namespace", NS,
        "--no-leader-elect",
        "--metrics-port", str(port),
        "--log-level", "WARNING",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = await trio.lowlevel.open_process(cmd, cwd=REPO, stdout=out, stderr=out)
        try:
            yield proc.pid
        finally:
            with trio.CancelScope(shield=True):
                proc.terminate()
                with trio.move_on_after(20):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


async def fresh_namespace(api: Client, name: str) -> None:
    """`name` recreated empty (a previous run's leftovers deleted), with its ServiceAccount."""
    with contextlib.suppress(NotFound):
        await api.delete(NAMESPACES, name)
    with trio.fail_after(180):
        while True:  # polling the API server: a namespace's deletion has no watchable end here
            try:
                await api.get(NAMESPACES, name)
            except NotFound:
                break
            await trio.sleep(0.5)
    await ensure_namespace(api, name)
    with trio.fail_after(30):
        while True:
            try:
                await api.get(SERVICE_ACCOUNTS, "default", namespace=name)
                return
            except NotFound:
                await trio.sleep(0.2)


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    started = time.monotonic()
    async with bench_api(env["KUBECONFIG"]) as api:
        await install_crds(api)
        await fresh_namespace(api, NS)
        await fresh_namespace(api, FLOOR_NS)
        config = await api.create(CONFIGURATIONS, configuration())
        # The Instances' node must exist: the controller cleans up after a node that does not.
        async with fake_nodes(api) as (node,):
            port = _port()
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            with tempfile.TemporaryDirectory(prefix="akc") as tmp:
                async with controller_process(env["KUBECONFIG"], port, Path(tmp) / "c.log") as pid:
                    pods = Store()
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(
                            lambda: reflect(
                                api,
                                PODS,
                                pods,
                                namespace=NS,
                                label_selector=naming.LABEL_CONFIGURATION,
                            )
                        )
                        await pods.wait_synced()
                        with trio.fail_after(60):
                            while True:
                                try:
                                    if "akri_controller_reconcile" in scrape(metrics_url):
                                        break
                                except OSError:
                                    pass
                                await trio.sleep(0.2)
                        report = await _measure(args, api, config, node, pods, pid, metrics_url)
                        nursery.cancel_scope.cancel()
                    try:
                        left = await api.get(CONFIGURATIONS, CONFIG, namespace=NS)
                        purged = left["metadata"]["uid"] != config["metadata"]["uid"]
                    except NotFound:
                        purged = True
                    if purged:
                        report += "\npurged by someone else: True"
        for ns in (NS, FLOOR_NS):
            await api.delete(NAMESPACES, ns)
    return report + f"\nwall time {time.monotonic() - started:.0f} s"


async def _measure(
    args: argparse.Namespace,
    api: Client,
    config: JSON,
    node: str,
    pods: Store,
    pid: int,
    metrics_url: str,
) -> str:
    # --- latency vs the floor ---
    floor: list[float] = []
    latency: list[float] = []
    body_seen: dict[str, Any] | None = None
    for i in range(WARMUP + args.samples):
        name = f"{CONFIG}-l{i:05d}"
        if body_seen is not None:
            bare = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"floor-{i:05d}",
                    "namespace": FLOOR_NS,
                    "labels": body_seen["metadata"]["labels"],
                },
                "spec": body_seen["spec"],
            }
            t0 = time.perf_counter()
            await api.create(PODS, bare)
            bare_post = time.perf_counter() - t0
        await api.create(INSTANCES, instance(config, name, node))
        t0 = time.perf_counter()
        with trio.fail_after(30):
            await pods.wait_for(ObjectKey(NS, f"{name}-pod"))
        dt = time.perf_counter() - t0
        if body_seen is None:
            body_seen = await api.get(PODS, f"{name}-pod", namespace=NS)
            body_seen["spec"].pop("nodeName", None)
            continue
        if i >= WARMUP:
            floor.append(bare_post)
            latency.append(dt)

    # --- scale ---
    n = args.instances
    text0 = scrape(metrics_url)
    api0 = await apiserver_requests(api)
    w0 = controller_writes(text0)
    limit = trio.Semaphore(20)
    t_scale = time.perf_counter()

    async def one(i: int) -> None:
        async with limit:
            await api.create(INSTANCES, instance(config, f"{CONFIG}-s{i:05d}", node))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    created_at = time.perf_counter() - t_scale
    expected = n + WARMUP + args.samples
    with trio.fail_after(300), pods.subscribe() as changes:
        while len(pods) < expected:
            await changes.next_change()
    all_at = time.perf_counter() - t_scale
    await trio.sleep(3)
    text1 = scrape(metrics_url)
    api1 = await apiserver_requests(api)
    w1 = controller_writes(text1)
    rss = rss_mb(pid)
    p99_alone = reconcile_p99(text0)
    p99_burst = reconcile_p99(text1, text0)
    services_burst = reconcile_p99(text1, text0, reconciler="services")

    # --- one change per Instance that changes no broker ---
    async def touch(i: int) -> None:
        async with limit:
            await api.merge_patch(
                INSTANCES,
                f"{CONFIG}-s{i:05d}",
                {"spec": {"brokerProperties": {"TOUCHED": "1"}}},
                namespace=NS,
            )

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(touch, i)
    await trio.sleep(5)
    text2 = scrape(metrics_url)
    api2 = await apiserver_requests(api)
    w2 = controller_writes(text2)

    # --- idle ---
    await trio.sleep(args.idle)
    text3 = scrape(metrics_url)
    api3 = await apiserver_requests(api)
    w3 = controller_writes(text3)
    rss_idle = rss_mb(pid)

    s, f = summary(latency), summary(floor)
    rows = [
        [
            "Instance created -> broker Pod in the API",
            str(int(s["n"])),
            ms(s["p50"]),
            ms(s["p99"]),
            ms(f["p50"]),
            ms(f["p99"]),
            f"{s['p50'] / f['p50']:.2f}x",
            f"{s['p99'] / f['p99']:.2f}x",
        ]
    ]
    head = ["path", "n", "p50 ms", "p99 ms", "floor p50", "floor p99", "p50/floor", "p99/floor"]
    scale_rows = [
        ["Instances created (20 at a time)", f"{n} in {created_at:.1f} s"],
        ["every broker Pod exists", f"{all_at:.1f} s after the first create"],
        ["controller RSS, settled", f"{rss:.1f} MB"],
        ["controller RSS, after idle", f"{rss_idle:.1f} MB"],
        [
            "instance reconcile p99, one Instance at a time (histogram bucket)",
            f"<= {p99_alone * 1e3:.0f} ms (target < 100 ms)",
        ],
        [
            f"instance reconcile p99, {n:,} created 20 at a time (histogram bucket)",
            f"<= {p99_burst * 1e3:.0f} ms (target < 100 ms)",
        ],
        [
            "services reconcile p99 (one Configuration, all its Instances), same burst",
            f"<= {services_burst * 1e3:.0f} ms",
        ],
        ["controller writes per new Instance", f"{(w1 - w0) / n:.3f}"],
        ["API server requests per new Instance (pods/services/jobs)", f"{(api1 - api0) / n:.3f}"],
        ["controller writes per Instance change (no broker change)", f"{(w2 - w1) / n:.3f}"],
        ["API server requests per Instance change", f"{(api2 - api1) / n:.3f}"],
        [f"controller writes while idle {args.idle:.0f} s", f"{w3 - w2:.0f} (target 0)"],
        [f"API server requests while idle {args.idle:.0f} s", f"{api3 - api2:.0f}"],
    ]
    cmd = " ".join(sys.argv[1:])
    return "\n".join(
        [
            f"### controller_latency run {now()}",
            "",
            f"machine: {machine()}",
            f"command: .venv/bin/python -m bench.controller_latency {cmd}".rstrip(),
            "",
            table(head, rows),
            "",
            table([f"{n:,} Instances", "value"], scale_rows),
            "",
            "floor: one POST of the same Pod body (another namespace), interleaved with the "
            "samples; latency is from the Instance POST's answer to the Pod's ADDED event in "
            "this process's watch (so it includes one watch delivery the floor does not).",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--instances", type=int, default=1000)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    record_run("controller_latency", report, write=not args.no_write)


if __name__ == "__main__":
    main()
