"""Fleet: N nodes sharing M network devices — what each change costs the API server.

    .venv/bin/python -m bench.fleet N M [--idle 60] [--limit 300] [--no-write] [--verbose]

N agents run as separate processes (`python -m bench._agent_proc`, the agent CLI with the
benchmark isolation, watching only the namespace `akri-fleet`), each with its own grpcio
kubelet stand-in (in this process) and its own debugEcho availability file, all discovering
the same M shared devices (capacity N). The API server's own metrics are read before and after
each phase:
  create    the Configuration is created; until every Instance lists all N nodes
  idle      nothing changes for `--idle` s
  one off   node 0 loses the devices; until every Instance lists N-1 nodes
  one on    node 0 gets them back; until every Instance lists N nodes again
  storm     every node asks its kubelet for one slot of the same Instance at the same moment
            (GetPreferredAllocation, then Allocate); granted / refused / double claims, and
            Allocate p50 against the p50 of five nodes' Allocates one at a time on another
            Instance, measured just before
  all off   every node loses the devices; until no Instance is left
Per phase: seconds to converge; what the agents sent (each agent counts its own requests, see
bench._agent_proc, so other sessions on the shared cluster do not add to these): Instance
writes (apply/patch/create/update/delete, answered), Configuration writes (the create is the
bench's; the nodes' status entries), 409s, 5xx, requests given up (sent, never answered:
cancelled or timed out on the agent's side), LISTs. Then the API server's own cluster-wide
counters (another session's traffic adds to them): the etcd writes the Instance writes took
(the API server retries a write that lost a race on one object inside the request, each retry
a full server-side apply: etcd writes / Instance writes is that amplification), requests it saw
abandoned by their client or finishing after its own timeout, watch events sent for Instances
(to every watcher) and their MB, the p99 of Instance write latency (upper bound of its
histogram bucket). Last: Instances created again after their deletion (a watch of the
namespace), the agents' CPU seconds and largest RSS, the API server's and etcd's CPU seconds
(theirs: another session's traffic adds to them too). The ideal Instance write counts are N*M
(create), M (one node off or on), N (the storm) and N*M + M (all off: a leave each, a delete
each).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc
import trio

from akri_trio.kube.client import JSON, Client
from akri_trio.kube.watch import Apply, Delete, InitApply, open_watch
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._agent_proc import agent_process, requests_of
from bench._common import (
    bench_api,
    cluster_env,
    echo_config,
    machine,
    ms,
    now,
    percentile,
    prepare_namespace,
    purge_namespace,
    record_run,
    table,
)
from bench.scale import cpu_seconds, rss_mb
from tests.support.kubelet_standin import KubeletStandin

CONFIG = "fleet"
# Its own namespace: the other benchmarks share `akri-bench`, and a fleet of agents watching it
# would serve their Configurations too.
FLEET_NS = "akri-fleet"
SOLO_SAMPLES = 5
# One Allocate: (slot, seconds, error or None)
Grant = tuple[str, float, str | None]
WRITE_VERBS = {"APPLY", "PATCH", "POST", "PUT", "CREATE", "UPDATE", "DELETE"}


Labels = tuple[tuple[str, str], ...]
Metrics = dict[tuple[str, Labels], float]
SCRAPED = (
    "apiserver_request_total",
    "apiserver_request_duration_seconds_bucket",
    "apiserver_request_aborts_total",
    "apiserver_request_post_timeout_total",
    "etcd_requests_total",
    "apiserver_watch_events_total",
    "apiserver_watch_events_sizes_sum",
)


def parse_metrics(text: str) -> Metrics:
    """The counters this bench reads from the API server's /metrics, by (name, labels)."""
    out: Metrics = defaultdict(float)
    for line in text.splitlines():
        name, brace, rest = line.partition("{")
        if not brace or name not in SCRAPED:
            continue
        body, _, value = rest.rpartition("} ")
        labels = []
        for part in body.split('",'):
            key, _, val = part.partition("=")
            labels.append((key.strip(","), val.strip('"')))
        out[(name, tuple(sorted(labels)))] += float(value)
    return out


async def scrape(api: Client) -> Metrics:
    return parse_metrics((await api.http.get("/metrics")).text)


def since(after: Metrics, before: Metrics) -> Metrics:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


Match = dict[str, str | set[str]]


def _fits(labels: Labels, match: Match) -> bool:
    d = dict(labels)
    return all(d.get(k) in v if isinstance(v, set) else d.get(k) == v for k, v in match.items())


def total(metrics: Metrics, name: str, **match: str | set[str]) -> float:
    """Sum of `name` over the label sets matching `match` (a value, or a set of values)."""
    return sum(v for (n, labels), v in metrics.items() if n == name and _fits(labels, match))


def latency_quantile(metrics: Metrics, q: float, **match: str | set[str]) -> float:
    """Upper bound of the apiserver_request_duration_seconds bucket holding quantile `q`."""
    buckets: defaultdict[float, float] = defaultdict(float)
    for (name, labels), v in metrics.items():
        if name == "apiserver_request_duration_seconds_bucket" and _fits(labels, match):
            buckets[float(dict(labels)["le"])] += v
    count = buckets.get(math.inf, 0.0)
    if not count:
        return 0.0
    return next(le for le in sorted(buckets) if buckets[le] >= q * count)


def server_cpu(env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds the API server and etcd have used so far (their pid files in the cluster's
    run directory: "pid start-time")."""
    pids = Path(env["AKRI_TRIO_CLUSTER_DIR"]) / "pids"
    apiserver, etcd = (
        cpu_seconds(int((pids / f"{name}.pid").read_text().split()[0]))
        for name in ("kube-apiserver", "etcd")
    )
    return apiserver, etcd


def answered(
    sent: Counter[str],
    verbs: Iterable[str] | None = None,
    resources: Iterable[str] | None = None,
    codes: tuple[str, ...] = ("",),
) -> int:
    """The agents' requests answered with a code starting with one of `codes`, of `verbs` on
    `resources` (None: any)."""
    out = 0
    for key, count in sent.items():
        verb, resource, code = key.split(" ")
        if code == "gave-up" or not code.startswith(codes):
            continue
        if (verbs is None or verb in verbs) and (resources is None or resource in resources):
            out += count
    return out


def gave_up(sent: Counter[str]) -> int:
    """Requests the agents sent and got no answer to (they gave up or were cancelled)."""
    return sum(c for k, c in sent.items() if k.endswith(" gave-up"))


class Recreations:
    """Watches the namespace's Instances: a name ADDED again after it was deleted."""

    def __init__(self) -> None:
        self.deleted: set[str] = set()
        self.count = 0

    async def run(self, api: Client) -> None:
        async with open_watch(api, INSTANCES, namespace=FLEET_NS) as events:
            async for event in events:
                if isinstance(event, Delete):
                    self.deleted.add(event.obj["metadata"]["name"])
                elif isinstance(event, Apply | InitApply):
                    name = event.obj["metadata"]["name"]
                    if name in self.deleted:
                        self.deleted.discard(name)
                        self.count += 1
                        managers = [
                            (f.get("manager"), f.get("operation"))
                            for f in event.obj["metadata"].get("managedFields") or []
                        ]
                        print(f"  {name} created again by {managers}", flush=True)


class Fleet:
    def __init__(self, api: Client, root: Path, n: int) -> None:
        self.api, self.root, self.n = api, root, n
        self.names = [f"fleet-{i:03d}" for i in range(n)]
        self.kubelets: list[KubeletStandin] = []
        self.pids: list[int] = []

    def avail(self, i: int) -> Path:
        return self.root / self.names[i] / "avail"

    @asynccontextmanager
    async def running(self, kubeconfig: str) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for name in self.names:
                home = self.root / name
                home.mkdir()
                (home / "avail").write_text("")
                self.kubelets.append(KubeletStandin(home / "dp").start())
                stack.callback(self.kubelets[-1].stop)
                proc = await stack.enter_async_context(
                    agent_process(
                        home, kubeconfig, name, "--debug-echo-shared", "--namespace", FLEET_NS
                    )
                )
                self.pids.append(proc.pid)
            yield

    def requests(self) -> Counter[str]:
        return sum((requests_of(self.root / name) for name in self.names), Counter())

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def rss(self) -> float:
        return max(rss_mb(pid)[0] for pid in self.pids)

    async def alone(self, resource: str, storm_resource: str) -> list[float]:
        """Allocate latencies of SOLO_SAMPLES nodes one at a time on `resource`, once every
        kubelet shows all N slots of both Instances healthy."""
        for kubelet in self.kubelets:
            for res in (resource, storm_resource):
                await trio.to_thread.run_sync(
                    kubelet.wait_for, lambda k, r=res: len(k.healthy(r)) == self.n, 60.0
                )
        return [
            (await trio.to_thread.run_sync(allocate, kubelet, resource))[1]
            for kubelet in self.kubelets[:SOLO_SAMPLES]
        ]

    async def storm(self, resource: str) -> list[Grant]:
        """Every node asks its kubelet for one slot of `resource` at the same moment."""
        results: list[Grant] = []

        async def one(kubelet: KubeletStandin) -> None:
            results.append(
                await trio.to_thread.run_sync(
                    allocate, kubelet, resource, limiter=trio.CapacityLimiter(self.n)
                )
            )

        async with trio.open_nursery() as nursery:
            for kubelet in self.kubelets:
                nursery.start_soon(one, kubelet)
        return results

    async def nodes_per_instance(self) -> list[int]:
        items = (await self.api.list(INSTANCES, namespace=FLEET_NS)).items
        return [len(o["spec"].get("nodes") or []) for o in items]


async def until(check: Callable[[], Awaitable[bool]], limit_s: float) -> float:
    t0 = time.monotonic()
    with trio.fail_after(limit_s):
        while not await check():  # noqa: ASYNC110 (polls the API server)
            await trio.sleep(0.25)
    return time.monotonic() - t0


def allocate(kubelet: KubeletStandin, resource: str) -> Grant:
    """What a kubelet does for one container asking for one slot: preferred, then Allocate."""
    free = kubelet.healthy(resource)
    t0 = time.perf_counter()
    (slot,) = kubelet.preferred(resource, free, 1)
    try:
        kubelet.allocate(resource, [[slot]])
        return slot, time.perf_counter() - t0, None
    except grpc.RpcError as exc:
        return slot, time.perf_counter() - t0, f"{exc.code().name}: {exc.details()}"


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    n, m = args.nodes, args.devices
    rows: list[list[str]] = []
    notes: list[str] = []
    async with bench_api(env["KUBECONFIG"]) as api, trio.open_nursery() as nursery:
        await prepare_namespace(api, FLEET_NS)
        recreations = Recreations()
        nursery.start_soon(recreations.run, api)
        with tempfile.TemporaryDirectory(prefix="akf", dir="/tmp") as tmp:
            fleet = Fleet(api, Path(tmp), n)
            async with fleet.running(env["KUBECONFIG"]):
                await trio.sleep(5 + n / 10)  # every agent listed its watches

                async def phase(
                    name: str,
                    ideal: str,
                    act: Callable[[], Awaitable[None]],
                    done: Callable[[], Awaitable[bool]],
                ) -> None:
                    before, cpu0, again0 = await scrape(api), fleet.cpu(), recreations.count
                    server0 = server_cpu(env)
                    sent0 = fleet.requests()
                    t0 = time.monotonic()
                    await act()
                    took = time.monotonic() - t0 + await until(done, args.limit)
                    await trio.sleep(1)  # late writes of this phase still count here
                    delta = since(await scrape(api), before)
                    server1 = server_cpu(env)
                    apiserver_s, etcd_s = server1[0] - server0[0], server1[1] - server0[1]
                    sent = fleet.requests() - sent0
                    if args.verbose:
                        print(f"  {name}: the agents' requests {dict(sorted(sent.items()))}")
                    instances = {"resource": "instances"}
                    storage = total(
                        delta,
                        "etcd_requests_total",
                        resource="instances",
                        operation={"create", "update", "delete"},
                    )
                    abandoned = total(delta, "apiserver_request_aborts_total") + total(
                        delta, "apiserver_request_post_timeout_total"
                    )
                    watch_mb = total(delta, "apiserver_watch_events_sizes_sum", **instances) / 1e6
                    p99 = latency_quantile(delta, 0.99, resource="instances", verb=WRITE_VERBS)
                    rows.append(
                        [
                            name, f"{took:.1f}",
                            str(answered(sent, WRITE_VERBS, {"instances"})), ideal,
                            f"{storage:.0f}",
                            str(answered(sent, WRITE_VERBS, {"configurations"})),
                            str(answered(sent, codes=("409",))),
                            str(answered(sent, codes=("5",))),
                            str(gave_up(sent)),
                            f"{abandoned:.0f}",
                            str(answered(sent, {"LIST"})),
                            f"{total(delta, 'apiserver_watch_events_total', **instances):.0f}",
                            f"{watch_mb:.1f}",
                            f"{p99:g}",
                            str(recreations.count - again0),
                            f"{fleet.cpu() - cpu0:.1f}", f"{fleet.rss():.0f}",
                            f"{apiserver_s:.1f}", f"{etcd_s:.1f}",
                        ]
                    )  # fmt: skip
                    print("  " + " | ".join(rows[-1]), flush=True)

                async def nothing() -> None:
                    pass

                async def all_nodes(k: int) -> bool:
                    """Every Instance lists k nodes, and every node's status entry says how
                    many it serves (the last status writes belong to the change too)."""
                    per = await fleet.nodes_per_instance()
                    if len(per) != m or any(x != k for x in per):
                        return False
                    config = await api.get(CONFIGURATIONS, CONFIG, namespace=FLEET_NS)
                    served = sorted(e.get("instances", 0) for e in config["status"]["nodes"])
                    return served == [0] * (n - k) + [m] * k

                created: JSON = {}

                async def create() -> None:
                    body = echo_config(CONFIG, [f"d{j}" for j in range(m)], n)
                    body["metadata"]["namespace"] = FLEET_NS
                    created.update(await api.create(CONFIGURATIONS, body))

                await phase("create", str(n * m), create, lambda: all_nodes(n))

                async def idle() -> None:
                    await trio.sleep(args.idle)

                await phase(f"idle {args.idle:.0f} s", "0", idle, lambda: all_nodes(n))

                async def set_avail(nodes: range, text: str) -> None:
                    for i in nodes:
                        fleet.avail(i).write_text(text)

                await phase(
                    "one off",
                    str(m),
                    lambda: set_avail(range(1), "OFFLINE"),
                    lambda: all_nodes(n - 1),
                )
                await phase("one on", str(m), lambda: set_avail(range(1), ""), lambda: all_nodes(n))

                # the storm: one Instance, every node at once; the baseline: one node alone, on
                # another Instance, measured just before
                items = sorted(
                    (await api.list(INSTANCES, namespace=FLEET_NS)).items,
                    key=lambda o: o["metadata"]["name"],
                )
                storm_res, solo_res = (f"akri.sh/{o['metadata']['name']}" for o in items[:2])
                solo = await fleet.alone(solo_res, storm_res)
                solo_p50 = percentile(solo, 50)
                results: list[Grant] = []

                async def storm() -> None:
                    results.extend(await fleet.storm(storm_res))

                await phase("storm", str(n), storm, _true)
                usage = (
                    next(
                        o
                        for o in (await api.list(INSTANCES, namespace=FLEET_NS)).items
                        if f"akri.sh/{o['metadata']['name']}" == storm_res
                    )["spec"].get("deviceUsage")
                    or {}
                )
                granted = [r for r in results if r[2] is None]
                doubles = len(granted) - len({slot for slot, _, _ in granted})
                latencies = [r[1] for r in results]
                p50 = percentile(latencies, 50)
                notes.append(
                    f"storm: {len(granted)} granted, {len(results) - len(granted)} refused, "
                    f"{doubles} double claims ({len(usage)} slots held by "
                    f"{len(set(usage.values()))} nodes); Allocate p50 {ms(p50)}, p99 "
                    f"{ms(percentile(latencies, 99))}; one node alone p50 {ms(solo_p50)} of "
                    f"{len(solo)} (ratio {p50 / solo_p50:.2f})"
                )
                for slot, _, error in results:
                    if error:
                        notes.append(f"refused {slot}: {error}")
                config = await api.get(CONFIGURATIONS, CONFIG, namespace=FLEET_NS)
                purged = config["metadata"]["uid"] != created["metadata"]["uid"]
                notes.append(f"purged by someone else: {purged}")
                await phase(
                    "all off",
                    f"{n * m + m}",
                    lambda: set_avail(range(n), "OFFLINE"),
                    lambda: _no_instances(api),
                )
        nursery.cancel_scope.cancel()
    await purge_after(env)
    header = [
        "phase", "s", "Instance writes", "ideal", "etcd writes", "Configuration writes", "409",
        "5xx", "given up", "abandoned (server)", "LISTs", "watch events", "watch MB",
        "write p99 s", "re-created", "agents CPU s", "max RSS MB", "apiserver CPU s",
        "etcd CPU s",
    ]  # fmt: skip
    return "\n".join(
        [
            f"### fleet N={n} M={m} ({now()}, {machine()})",
            "",
            table(header, rows),
            "",
            *(f"- {note}" for note in notes),
            "",
        ]
    )


async def _true() -> bool:
    return True


async def _no_instances(api: Client) -> bool:
    return not (await api.list(INSTANCES, namespace=FLEET_NS)).items


async def purge_after(env: dict[str, str]) -> None:
    async with bench_api(env["KUBECONFIG"]) as api:
        await purge_namespace(api, FLEET_NS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("nodes", type=int)
    p.add_argument("devices", type=int)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--limit", type=float, default=300.0, help="bound on each phase, s")
    p.add_argument(
        "--no-write",
        "--no-record",
        dest="no_record",
        action="store_true",
        help="print, do not append to RESULTS.md",
    )
    p.add_argument("--verbose", action="store_true", help="print each phase's requests by kind")
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    record_run("fleet", report, write=not args.no_record)


if __name__ == "__main__":
    main()
