"""Allocate latency of the agent's device plugins vs a floor measured in the same run.

    .venv/bin/python -m bench.allocate_latency [--seq 300] [--callers 50] [--per-caller 6]

The agent runs as its own process (`python -m bench._agent_proc`: the `akri-trio agent` CLI with
the embedded debugEcho handler registered as `benchEcho`, see _common.py) and serves a grpcio
kubelet stand-in (this process) in a short tmp dir. Every Allocate claims a fresh
slot, so it includes the agent's deviceUsage write to the API server.

The floor is what any claim must cost at least: a bare grpcio unary call to the same plugin
socket (GetDevicePluginOptions: the purerpc/trio server, no work) plus one PATCH of an Instance
to the same API server. It is measured interleaved with the Allocates (floor step, Allocate,
floor step, ...), so load on this shared machine hits both alike, and on a floor Instance of the
same shape that holds as many deviceUsage keys as the agent's at that moment: the API server's
cost of a write grows with the object (a 1-key object would flatter the floor late in a run).
Two floors, both reported:
  SSA     one server-side-apply PATCH changing one key (the issue's definition)
  merge   one JSON merge patch adding one key with a resourceVersion precondition: exactly
          the request the agent sends for a claim, i.e. the agent's cost minus the agent
Concurrent phases compare against the same calls made concurrently by as many callers: bare
grpc + one merge patch (no precondition: the API server serializes them itself) of a fresh key
on one shared floor Instance (one-Instance phase) or on one floor Instance per caller (spread).
Rounds alternate: a floor round, an agent round, ...

Phases (each on its own Configuration):
  seq     instance-level, one caller, `--seq` calls on one Instance (it ends holding them all)
  small   instance-level, one caller, `--seq` calls over Instances of capacity 4, freed as the
          kubelet would (pod deleted -> reclaimer; here a direct free) — the common shape
  conc    instance-level, `--callers` at once x `--per-caller` rounds, one Instance
  spread  the same, each caller on its own Instance
  vdev    configuration-level, one caller, `--vdev` calls, one fresh vdev each
Afterwards every claimed slot is checked against the API server: held exactly once, by us.
"""

from __future__ import annotations

import argparse
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import trio

from akri_trio.agent.plugins.claims import USAGE_FIELD_MANAGER
from akri_trio.kube.client import JSON, Client
from akri_trio.model.resources import CONFIGURATIONS as CONFIGS
from akri_trio.model.resources import INSTANCES
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from bench._agent_proc import agent_process, requests_of
from bench._common import (
    BENCH_NS,
    bench_api,
    cluster_env,
    echo_config,
    machine,
    ms,
    now,
    prepare_namespace,
    purge_namespace,
    record_run,
    summary,
    table,
)
from tests.support.kubelet_standin import KubeletStandin

NODE = "bench-node"
FLOOR_NODE = "floor-node"
FLOOR_NS = "akri-bench-floor"  # the agent watches BENCH_NS only: no events of floor writes
WARMUP = 20
SMALL_CAPACITY = 4
Call = Callable[[], Any]


def timed(fn: Call) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        fn()
        return time.perf_counter() - t0, None
    except grpc.RpcError as exc:
        return time.perf_counter() - t0, f"{exc.code().name}: {exc.details()}"


def concurrent(jobs: Sequence[Call]) -> tuple[list[float], list[str]]:
    """One thread per job, released together (a barrier); each job's latency."""
    barrier = threading.Barrier(len(jobs))
    results: queue.SimpleQueue[tuple[float, str | None]] = queue.SimpleQueue()

    def run(job: Call) -> None:
        barrier.wait()
        results.put(timed(job))

    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(run, jobs))
    samples, errors = [], []
    while not results.empty():
        dt, err = results.get()
        (errors.append(err) if err else samples.append(dt))
    return samples, errors


class Floor:
    """Mirror Instances: for each agent Instance a copy (same spec and finalizer, a node name
    of the same length) in a namespace the agent does not watch, kept holding the same
    deviceUsage keys as the agent's, on which the floor writes run. The one difference: no
    ownerReference (it cannot point across namespaces), ~150 bytes less than the agent's."""

    def __init__(self, api: Client) -> None:
        self.api = api
        self.rv: dict[str, str] = {}

    @staticmethod
    def mirror_name(instance: str) -> str:
        return f"floor-{instance}"

    async def create_mirrors(self, names: Sequence[str]) -> None:
        for name in names:
            obj = await self.api.get(INSTANCES, name, namespace=BENCH_NS)  # the agent's
            meta = obj["metadata"]
            body: JSON = {
                "apiVersion": "akri.sh/v0",
                "kind": "Instance",
                "metadata": {
                    "name": self.mirror_name(name),
                    "namespace": FLOOR_NS,
                    "finalizers": [FLOOR_NODE if f == NODE else f for f in meta["finalizers"]],
                },
                "spec": {k: v for k, v in obj["spec"].items() if k != "deviceUsage"}
                | {"nodes": [FLOOR_NODE]},
            }
            made = await self.api.apply(INSTANCES, body, field_manager=FLOOR_NODE, force=True)
            self.rv[self.mirror_name(name)] = made["metadata"]["resourceVersion"]

    async def merge(self, instance: str, key: str, value: str, *, precondition: bool) -> float:
        """The agent's claim, on the mirror: one patch of one key (on the version known, with
        `precondition`: the agent's JSON patch `test`s it, this merge patch states it)."""
        name = self.mirror_name(instance)
        body: JSON = {"spec": {"deviceUsage": {key: value}}}
        if precondition:
            body["metadata"] = {"resourceVersion": self.rv[name]}
        t0 = time.perf_counter()
        obj = await self.api.merge_patch(
            INSTANCES, name, body, field_manager=USAGE_FIELD_MANAGER, namespace=FLOOR_NS
        )
        dt = time.perf_counter() - t0
        self.rv[name] = obj["metadata"]["resourceVersion"]
        return dt

    async def ssa(self, instance: str, i: int) -> float:
        """One server-side apply changing one key of the mirror (its own field manager)."""
        name = self.mirror_name(instance)
        body: JSON = {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "metadata": {"name": name, "namespace": FLOOR_NS},
            "spec": {"deviceUsage": {"floor-ssa": f"n{i % 2}"}},
        }
        t0 = time.perf_counter()
        obj = await self.api.apply(INSTANCES, body, field_manager="bench-floor-ssa", force=True)
        dt = time.perf_counter() - t0
        self.rv[name] = obj["metadata"]["resourceVersion"]
        return dt


class Samples:
    def __init__(self) -> None:
        self.agent: list[float] = []
        self.floor_ssa: list[float] = []
        self.floor_merge: list[float] = []
        self.errors: list[str] = []


Step = tuple[str, str, str, Call]  # (agent instance, deviceUsage key, value, the Allocate call)


def interleaved(floor: Floor, options: Call, steps: Sequence[Step], warmup: int) -> Samples:
    """In a worker thread: for each step a floor step (grpc + both PATCHes on the mirror),
    then the Allocate. The mirror then holds what the agent's Instance holds."""
    out = Samples()
    for n, (instance, key, value, call) in enumerate(steps):
        g, _ = timed(options)
        s = trio.from_thread.run(floor.ssa, instance, n)
        m = trio.from_thread.run(partial(floor.merge, instance, key, value, precondition=True))
        dt, err = timed(call)
        if n < warmup:
            continue
        out.floor_ssa.append(g + s)
        out.floor_merge.append(g + m)
        (out.errors.append(err) if err else out.agent.append(dt))
    return out


async def concurrent_rounds(
    floor: Floor, options: Call, rounds: Sequence[Sequence[Step]]
) -> Samples:
    """Per round: every caller's floor call at once (grpc, then a merge patch of a fresh key
    on its mirror, no precondition), then every caller's Allocate at once."""
    out = Samples()
    limiter = trio.CapacityLimiter(max(len(r) for r in rounds))
    for steps in rounds:

        async def floor_call(instance: str, key: str, value: str) -> None:
            g, _ = await trio.to_thread.run_sync(timed, options, limiter=limiter)
            out.floor_merge.append(g + await floor.merge(instance, key, value, precondition=False))

        async with trio.open_nursery() as nursery:
            for instance, key, value, _ in steps:
                nursery.start_soon(floor_call, instance, key, value)
        samples, errors = await trio.to_thread.run_sync(concurrent, [s[3] for s in steps])
        out.agent += samples
        out.errors += errors
    return out


async def wait_kubelet(kubelet: KubeletStandin, pred: Callable[[KubeletStandin], bool]) -> None:
    await trio.to_thread.run_sync(kubelet.wait_for, pred, 60.0)


def instance_resources(kubelet: KubeletStandin, config: str) -> list[str]:
    with kubelet._cond:
        return sorted(r for r in kubelet.registrations if r.startswith(f"akri.sh/{config}-"))


async def check_claims(
    api: Client, expected: dict[str, set[str]], vdev_config: str, vdevs: set[str]
) -> tuple[int, list[str]]:
    """(double claims, problems): every slot we were granted is held exactly once, by us, and
    nothing else is held by us. `expected`: instance name -> slots granted."""
    problems: list[str] = []
    listed = {
        o["metadata"]["name"]: o for o in (await api.list(INSTANCES, namespace=BENCH_NS)).items
    }
    seen_vdevs: list[str] = []
    for name, obj in listed.items():
        usage: dict[str, str] = (obj.get("spec") or {}).get("deviceUsage") or {}
        if obj["spec"]["configurationName"] == vdev_config:
            seen_vdevs += [v.split(":")[1] for v in usage.values() if v.startswith("C:")]
            continue
        ours = {k for k, v in usage.items() if v == NODE}
        want = expected.get(name, set())
        if ours != want:
            problems.append(f"{name}: held {len(ours)} granted {len(want)}")
    doubles = len(seen_vdevs) - len(set(seen_vdevs))
    if set(seen_vdevs) != vdevs:
        problems.append(f"vdevs: held {len(set(seen_vdevs))} granted {len(vdevs)}")
    return doubles, problems


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def row_for(label: str, s: Samples, part: slice = slice(None)) -> list[str]:
    """label, n, agent p50/p99, then for each floor (merge, SSA): its p50/p99 and the ratios."""
    agent = summary(s.agent[part])
    out = [label, str(int(agent["n"])), ms(agent["p50"]), ms(agent["p99"])]
    for floor in (s.floor_merge, s.floor_ssa):
        if not floor:  # the concurrent phases have no SSA floor
            out += ["", "", "", ""]
            continue
        f = summary(floor[part])
        out += [
            ms(f["p50"]),
            ms(f["p99"]),
            ratio(agent["p50"], f["p50"]),
            ratio(agent["p99"], f["p99"]),
        ]
    return out


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    async with bench_api(env["KUBECONFIG"]) as api:
        await prepare_namespace(api)
        await prepare_namespace(api, FLOOR_NS)
        with tempfile.TemporaryDirectory(prefix="akb", dir="/tmp") as tmp:
            root = Path(tmp)
            kubelet = KubeletStandin(root / "dp").start()
            try:
                async with agent_process(root, env["KUBECONFIG"], NODE, "--reclaim-period", "3600"):
                    report = await _measure(args, api, kubelet, root)
            finally:
                kubelet.stop()
        await purge_namespace(api)
        await purge_namespace(api, FLOOR_NS)
    return report


async def _measure(
    args: argparse.Namespace, api: Client, kubelet: KubeletStandin, root: Path
) -> str:
    started = time.monotonic()
    seq, callers, per = args.seq, args.callers, args.per_caller
    n_small = max(1, (WARMUP + seq) // SMALL_CAPACITY)
    await api.create(CONFIGS, echo_config("seq", ["s0"], WARMUP + seq))
    await api.create(
        CONFIGS, echo_config("small", [f"m{i}" for i in range(n_small)], SMALL_CAPACITY)
    )
    await api.create(CONFIGS, echo_config("conc", ["c0"], callers * per))
    await api.create(CONFIGS, echo_config("spread", [f"p{i}" for i in range(callers)], per))
    await api.create(CONFIGS, echo_config("vdev", ["v0"], WARMUP + args.vdev))
    expect = {"seq": 1, "small": n_small, "conc": 1, "spread": callers}
    await wait_kubelet(
        kubelet,
        lambda k: (
            all(len(instance_resources(k, c)) == n for c, n in expect.items())
            and len(k.healthy("akri.sh/vdev")) >= 1
            and all(len(k.healthy(r)) == per for r in instance_resources(k, "spread"))
        ),
    )
    print(f"agent ready, {time.monotonic() - started:.1f}s after the Configurations")
    names = {c: [r.split("/", 1)[1] for r in instance_resources(kubelet, c)] for c in expect}
    vdev_inst = [
        o["metadata"]["name"]
        for o in (await api.list(INSTANCES, namespace=BENCH_NS)).items
        if o["spec"]["configurationName"] == "vdev"
    ]
    floor = Floor(api)
    await floor.create_mirrors([n for ns in names.values() for n in ns] + vdev_inst)
    granted: dict[str, set[str]] = {}

    def alloc(inst: str, slot: str) -> Step:
        def call() -> Any:
            kubelet.allocate(f"akri.sh/{inst}", [[slot]])
            granted.setdefault(inst, set()).add(slot)  # one add per slot: GIL-atomic enough

        return inst, slot, NODE, call

    opts_stub = kubelet._stub(f"akri.sh/{names['seq'][0]}")

    def options() -> Any:
        return opts_stub.GetDevicePluginOptions(dp.Empty(), timeout=30)

    run = trio.to_thread.run_sync
    await run(lambda: [options() for _ in range(100)])  # warm the grpc channel
    seq_inst = names["seq"][0]
    s_seq = await run(
        interleaved,
        floor,
        options,
        [alloc(seq_inst, f"{seq_inst}-{i}") for i in range(WARMUP + seq)],
        WARMUP,
    )
    small_steps = [
        alloc(names["small"][i % n_small], f"{names['small'][i % n_small]}-{i // n_small}")
        for i in range(WARMUP + seq)
    ]
    s_small = await run(interleaved, floor, options, small_steps, WARMUP)
    conc_inst = names["conc"][0]
    s_conc = await concurrent_rounds(
        floor,
        options,
        [
            [alloc(conc_inst, f"{conc_inst}-{r * callers + c}") for c in range(callers)]
            for r in range(per)
        ],
    )
    s_spread = await concurrent_rounds(
        floor, options, [[alloc(n, f"{n}-{r}") for n in names["spread"]] for r in range(per)]
    )
    # Configuration level: one fresh vdev per call; the mirror gets the key the agent wrote.
    vdevs: set[str] = set()
    v_inst = vdev_inst[0]

    def vstep(i: int) -> Step:
        def call() -> Any:
            kubelet.allocate("akri.sh/vdev", [[f"vdev-{i}"]])
            vdevs.add(f"vdev-{i}")

        return v_inst, f"{v_inst}-{i}", f"C:vdev-{i}:{NODE}", call

    s_vdev = await run(
        interleaved, floor, options, [vstep(i) for i in range(WARMUP + args.vdev)], WARMUP
    )

    doubles, problems = await check_claims(api, granted, "vdev", vdevs)
    purged = len((await api.list(CONFIGS, namespace=BENCH_NS)).items) != 5
    fifth = max(1, seq // 5)
    heads = [
        "path",
        "n",
        "p50 ms",
        "p99 ms",
        "floor merge p50",
        "floor merge p99",
        "p50/merge",
        "p99/merge",
        "floor SSA p50",
        "floor SSA p99",
        "p50/SSA",
        "p99/SSA",
    ]
    rows = [
        row_for("instance-level, sequential, one Instance", s_seq),
        row_for(f"  first {fifth} (0-{fifth} keys held)", s_seq, slice(None, fifth)),
        row_for(f"  last {fifth} ({seq - fifth}-{seq} keys held)", s_seq, slice(-fifth, None)),
        row_for(
            f"instance-level, sequential, {n_small} Instances of capacity {SMALL_CAPACITY}", s_small
        ),
        row_for(f"instance-level, {callers} callers at once x {per}, one Instance", s_conc),
        row_for(f"instance-level, {callers} callers at once x {per}, one Instance each", s_spread),
        row_for("configuration-level (1 vdev), sequential", s_vdev),
    ]
    errors = s_seq.errors + s_small.errors + s_conc.errors + s_spread.errors + s_vdev.errors

    def meets(label: str, s: Samples) -> str:
        """`label: vs <floor> p50 PASS (1.23x), p99 ...` for each floor measured (the concurrent
        phases have only their concurrent merge floor)."""
        a = summary(s.agent)
        floors = [("SSA floor", s.floor_ssa)] if s.floor_ssa else []
        floors.append(("merge floor" if s.floor_ssa else "concurrent floor", s.floor_merge))
        parts = []
        for name, samples in floors:
            f = summary(samples)
            r50, r99 = a["p50"] / f["p50"], a["p99"] / f["p99"]
            parts.append(
                f"vs {name} p50 {'PASS' if r50 <= 1.5 else 'FAIL'} ({r50:.2f}x), "
                f"p99 {'PASS' if r99 <= 3 else 'FAIL'} ({r99:.2f}x)"
            )
        return f"- {label}: " + "; ".join(parts)

    requests = requests_of(root)
    out = [
        f"### allocate_latency run {now()}",
        "",
        f"machine: {machine()}",
        f"command: .venv/bin/python -m bench.allocate_latency --seq {seq} --callers {callers} "
        f"--per-caller {per} --vdev {args.vdev}",
        "",
        table(heads, rows),
        "",
        f"errors: {len(errors)} {sorted(set(errors))[:3]}",
        f"double claims: {doubles}; claim check problems: {problems or 'none'}; "
        f"purged by someone else: {purged}",
        # a 409 is a claim that lost a race (its resourceVersion precondition failed)
        "the agent's Instance requests: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(requests.items()) if " instances " in k),
        "targets (p50 <= 1.5x floor, p99 <= 3x floor):",
        meets("sequential, one Instance", s_seq),
        meets(f"sequential, capacity {SMALL_CAPACITY}", s_small),
        meets(f"{callers} at once, one Instance", s_conc),
        meets(f"{callers} at once, one Instance each", s_spread),
        meets("configuration level", s_vdev),
        f"- 0 double claims: {'PASS' if doubles == 0 and not problems else 'FAIL'}",
        f"wall time {time.monotonic() - started:.0f} s",
    ]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=300)
    p.add_argument("--callers", type=int, default=50)
    p.add_argument("--per-caller", type=int, default=6)
    p.add_argument("--vdev", type=int, default=150)
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    record_run("allocate_latency", report, write=not args.no_write)


if __name__ == "__main__":
    main()
