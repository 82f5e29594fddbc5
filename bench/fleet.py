"""Fleet: N nodes sharing M network devices — what each change costs the API server.

    .venv/bin/python -m bench.fleet N M [--idle 60]

N agents run as separate processes (`python -m bench._agent_proc`, the agent CLI with the
benchmark isolation), each with its own grpcio kubelet stand-in (in this process) and its own
debugEcho availability file, all discovering the same M shared devices (capacity N). The API
server's own `apiserver_request_total` is read before and after each phase:
  create    the Configuration is created; until every Instance lists all N nodes
  idle      nothing changes for `--idle` s
  one off   node 0 loses the devices; until every Instance lists N-1 nodes
  one on    node 0 gets them back; until every Instance lists N nodes again
  storm     every node asks its kubelet for one slot of the same Instance at the same moment
            (GetPreferredAllocation, then Allocate); granted / refused / double claims, and
            Allocate p50 against one node's Allocate on another Instance alone in this run
  all off   every node loses the devices; until no Instance is left
Per phase: seconds to converge, writes (apply/patch/create/update/delete) of Instances, and of
Configurations (the create and the nodes' status entries), 409s, 5xx, LISTs, Instances created
again after their deletion (a watch of the namespace), and the agents' CPU seconds and largest
RSS. The ideal Instance write counts are N*M (create), M (one node off or on), N (the storm)
and N*M + M (all off: a leave each, a delete each).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc
import trio

from akri_trio.kube.client import Client
from akri_trio.kube.watch import Apply, Delete, InitApply, open_watch
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._agent_proc import agent_process
from bench._common import (
    BENCH_NS,
    bench_api,
    cluster_env,
    echo_config,
    machine,
    ms,
    now,
    percentile,
    prepare_namespace,
    purge_namespace,
    table,
    write_run,
)
from bench.scale import cpu_seconds, rss_mb
from tests.support.kubelet_standin import KubeletStandin

CONFIG = "fleet"
WRITE_VERBS = {"APPLY", "PATCH", "POST", "PUT", "CREATE", "UPDATE", "DELETE"}


async def request_counts(api: Client) -> Counter[tuple[str, str, str]]:
    """apiserver_request_total by (resource, verb, code)."""
    text = (await api.http.get("/metrics")).text
    out: Counter[tuple[str, str, str]] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = {}
        for part in line[line.index("{") + 1 : line.rindex("}")].split('",'):
            key, _, value = part.partition("=")
            labels[key.strip(",")] = value.strip('"')
        out[(labels.get("resource", ""), labels.get("verb", ""), labels.get("code", ""))] += int(
            float(line.rsplit(" ", 1)[1])
        )
    return out


class Recreations:
    """Watches the namespace's Instances: a name ADDED again after it was deleted."""

    def __init__(self) -> None:
        self.deleted: set[str] = set()
        self.count = 0

    async def run(self, api: Client) -> None:
        async with open_watch(api, INSTANCES, namespace=BENCH_NS) as events:
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
                    agent_process(home, kubeconfig, name, "--debug-echo-shared")
                )
                self.pids.append(proc.pid)
            yield

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def rss(self) -> float:
        return max(rss_mb(pid)[0] for pid in self.pids)

    async def nodes_per_instance(self) -> list[int]:
        items = (await self.api.list(INSTANCES, namespace=BENCH_NS)).items
        return [len(o["spec"].get("nodes") or []) for o in items]


async def until(check: Callable[[], Awaitable[bool]], limit_s: float) -> float:
    t0 = time.monotonic()
    with trio.fail_after(limit_s):
        while not await check():  # noqa: ASYNC110 (polls the API server)
            await trio.sleep(0.25)
    return time.monotonic() - t0


def allocate(kubelet: KubeletStandin, resource: str) -> tuple[str, float, str | None]:
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
        await prepare_namespace(api)
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
                    before, cpu0, again0 = await request_counts(api), fleet.cpu(), recreations.count
                    t0 = time.monotonic()
                    await act()
                    took = time.monotonic() - t0 + await until(done, args.limit)
                    await trio.sleep(1)  # late writes of this phase still count here
                    delta = await request_counts(api) - before
                    ours = {"instances", "configurations"}

                    def writes_of(resource: str) -> int:
                        return sum(
                            c
                            for (r, v, _), c in delta.items()
                            if r == resource and v in WRITE_VERBS
                        )

                    conflicts = sum(
                        c for (r, _, code), c in delta.items() if r in ours and code == "409"
                    )
                    errors = sum(c for (_, _, code), c in delta.items() if code.startswith("5"))
                    lists = sum(c for (_, v, _), c in delta.items() if v == "LIST")
                    rows.append(
                        [
                            name, f"{took:.1f}", str(writes_of("instances")), ideal,
                            str(writes_of("configurations")), str(conflicts), str(errors),
                            str(lists), str(recreations.count - again0),
                            f"{fleet.cpu() - cpu0:.1f}", f"{fleet.rss():.0f}",
                        ]
                    )  # fmt: skip
                    print("  " + " | ".join(rows[-1]), flush=True)

                async def nothing() -> None:
                    pass

                async def all_nodes(k: int) -> bool:
                    per = await fleet.nodes_per_instance()
                    return len(per) == m and all(x == k for x in per)

                async def create() -> None:
                    await api.create(
                        CONFIGURATIONS, echo_config(CONFIG, [f"d{j}" for j in range(m)], n)
                    )

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
                    (await api.list(INSTANCES, namespace=BENCH_NS)).items,
                    key=lambda o: o["metadata"]["name"],
                )
                storm_res, solo_res = (f"akri.sh/{o['metadata']['name']}" for o in items[:2])
                for kubelet in fleet.kubelets:
                    await trio.to_thread.run_sync(
                        kubelet.wait_for, lambda k: len(k.healthy(storm_res)) == n, 60.0
                    )
                solo = [(await trio.to_thread.run_sync(allocate, fleet.kubelets[0], solo_res))[1]]
                results: list[tuple[str, float, str | None]] = []

                async def storm() -> None:
                    async def one(kubelet: KubeletStandin) -> None:
                        results.append(
                            await trio.to_thread.run_sync(
                                allocate, kubelet, storm_res, limiter=trio.CapacityLimiter(n)
                            )
                        )

                    async with trio.open_nursery() as inner:
                        for kubelet in fleet.kubelets:
                            inner.start_soon(one, kubelet)

                await phase("storm", str(n), storm, _true)
                usage = (
                    next(
                        o
                        for o in (await api.list(INSTANCES, namespace=BENCH_NS)).items
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
                    f"{ms(percentile(latencies, 99))}; one node alone {ms(solo[0])} "
                    f"(ratio {p50 / solo[0]:.2f})"
                )
                for slot, _, error in results:
                    if error:
                        notes.append(f"refused {slot}: {error}")
                await phase(
                    "all off",
                    f"{n * m + m}",
                    lambda: set_avail(range(n), "OFFLINE"),
                    lambda: _no_instances(api),
                )
        nursery.cancel_scope.cancel()
    await purge_after(env)
    header = [
        "phase", "s", "Instance writes", "ideal", "Configuration writes", "409", "5xx",
        "LISTs", "re-created", "agents CPU s", "max RSS MB",
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
    return not (await api.list(INSTANCES, namespace=BENCH_NS)).items


async def purge_after(env: dict[str, str]) -> None:
    async with bench_api(env["KUBECONFIG"]) as api:
        await purge_namespace(api)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("nodes", type=int)
    p.add_argument("devices", type=int)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--limit", type=float, default=300.0, help="bound on each phase, s")
    p.add_argument("--no-record", action="store_true", help="print, do not append to RESULTS.md")
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    if not args.no_record:
        write_run("fleet", report)


if __name__ == "__main__":
    main()
