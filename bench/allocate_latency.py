"""Allocate latency of the agent's device plugins vs a floor measured in the same run.

    .venv/bin/python -m bench.allocate_latency [--seq 300] [--callers 50] [--per-caller 6]

An in-process agent (`run_agent`) with the embedded debugEcho handler (as `benchEcho`, see
_common.py) serves a grpcio kubelet stand-in in a short tmp dir. Each Allocate claims a fresh
slot, so it includes the one server-side-apply PATCH of `Instance.spec.deviceUsage`.

Phases (each on its own Configuration, one device, capacity = the calls of that phase):
  seq     instance-level Allocate, one caller, `--seq` calls
  conc    instance-level Allocate, `--callers` threads x `--per-caller` calls, one Instance
  spread  the same callers, each on its own Instance (one Configuration, `--callers` devices)
  vdev    configuration-level Allocate of one fresh vdev, one caller, `--vdev` calls
Floor (alone, sequential): grpcio GetDevicePluginOptions on the same agent plugin socket (the
purerpc/trio server, no work) + one SSA PATCH of a one-key deviceUsage on an Instance of our own
(`floor-inst`, another field manager, resourceVersion precondition, through the same Client).
A ConfigMap SSA is reported too. floor = grpc p50 + SSA p50 (p99 likewise).
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
from pathlib import Path
from typing import Any

import grpc
import trio

from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.kube.client import Client, Resource
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from bench._common import (
    BENCH_NS,
    INSTANCES,
    bench_api,
    bench_echo,
    cluster_env,
    echo_config,
    machine,
    ms,
    now,
    prepare_namespace,
    purge_namespace,
    summary,
    table,
    write_run,
)
from bench._common import CONFIGURATIONS as CONFIGS
from tests.support.kubelet_standin import KubeletStandin

NODE = "bench-node"
CONFIG_MAPS = Resource.core("configmaps", "ConfigMap")
WARMUP = 20


def _timed(fn: Callable[[], Any]) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        fn()
        return time.perf_counter() - t0, None
    except grpc.RpcError as exc:
        return time.perf_counter() - t0, f"{exc.code().name}: {exc.details()}"


def sequential(calls: Sequence[Callable[[], Any]]) -> tuple[list[float], list[str]]:
    samples, errors = [], []
    for call in calls:
        dt, err = _timed(call)
        (errors.append(err) if err else samples.append(dt))
    return samples, errors


def concurrent(
    callers: int, jobs: Sequence[Sequence[Callable[[], Any]]]
) -> tuple[list[float], list[str]]:
    """`callers` threads; thread i runs jobs[i] back to back. Started together (a barrier)."""
    barrier = threading.Barrier(callers)
    results: queue.SimpleQueue[tuple[float, str | None]] = queue.SimpleQueue()

    def run(mine: Sequence[Callable[[], Any]]) -> None:
        barrier.wait()
        for call in mine:
            results.put(_timed(call))

    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(run, jobs))
    samples, errors = [], []
    while not results.empty():
        dt, err = results.get()
        (errors.append(err) if err else samples.append(dt))
    return samples, errors


async def wait_kubelet(kubelet: KubeletStandin, pred: Callable[[KubeletStandin], bool]) -> None:
    await trio.to_thread.run_sync(kubelet.wait_for, pred, 60.0)


def instance_resources(kubelet: KubeletStandin, config: str) -> list[str]:
    with kubelet._cond:
        return sorted(r for r in kubelet.registrations if r.startswith(f"akri.sh/{config}-"))


async def floor_ssa(api: Client, n: int) -> tuple[list[float], list[float]]:
    """SSA PATCH latency: a one-key deviceUsage change on our own Instance, and a ConfigMap."""
    name = "floor-inst"
    inst = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": name, "namespace": BENCH_NS},
        "spec": {"configurationName": "floor", "cdiName": "akri.sh/floor=0", "capacity": 2},
    }
    obj = await api.apply(INSTANCES, inst, field_manager="bench-floor-owner", force=True)
    inst_samples, cm_samples = [], []
    for i in range(n + WARMUP):
        body = {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "metadata": {
                "name": name,
                "namespace": BENCH_NS,
                "resourceVersion": obj["metadata"]["resourceVersion"],
            },
            "spec": {"deviceUsage": {f"floor-{i % 2}": NODE}},
        }
        t0 = time.perf_counter()
        obj = await api.apply(INSTANCES, body, field_manager=f"dp-{NODE}-floor")
        dt = time.perf_counter() - t0
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "floor-cm", "namespace": BENCH_NS},
            "data": {"k": str(i)},
        }
        t0 = time.perf_counter()
        await api.apply(CONFIG_MAPS, cm, field_manager="bench-floor")
        dt_cm = time.perf_counter() - t0
        if i >= WARMUP:
            inst_samples.append(dt)
            cm_samples.append(dt_cm)
    await api.delete(INSTANCES, name, namespace=BENCH_NS)
    await api.delete(CONFIG_MAPS, "floor-cm", namespace=BENCH_NS)
    return inst_samples, cm_samples


async def check_claims(
    api: Client, expected: dict[str, set[str]], vdev_config: str, vdevs: set[str]
) -> tuple[int, list[str]]:
    """(double claims, problems): every slot we were granted is held exactly once, by us, and
    nothing else is held by us. `expected`: instance name -> slots granted."""
    problems: list[str] = []
    doubles = 0
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
    doubles += len(seen_vdevs) - len(set(seen_vdevs))
    if set(seen_vdevs) != vdevs:
        problems.append(f"vdevs: held {len(set(seen_vdevs))} granted {len(vdevs)}")
    return doubles, problems


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def row(label: str, s: dict[str, float], floor: dict[str, float] | None) -> list[str]:
    ratio50 = f"{s['p50'] / floor['p50']:.2f}x" if floor else ""
    ratio99 = f"{s['p99'] / floor['p99']:.2f}x" if floor else ""
    return [
        label,
        str(int(s["n"])),
        ms(s["p50"]),
        ms(s["p90"]),
        ms(s["p99"]),
        ms(s["max"]),
        ratio50,
        ratio99,
    ]


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    seq, callers, per = args.seq, args.callers, args.per_caller
    n_conc = callers * per
    async with bench_api(env["KUBECONFIG"]) as api:
        await prepare_namespace(api)
        with tempfile.TemporaryDirectory(prefix="akb", dir="/tmp") as tmp:
            root = Path(tmp)
            kubelet = KubeletStandin(root / "dp").start()
            settings = AgentSettings(
                node=NODE,
                discovery_handlers_directory=root / "akri",
                device_plugin_dir=root / "dp",
                pod_resources_socket=root / "pr.sock",
                namespace=BENCH_NS,
                handlers=(bench_echo(root / "avail"),),
                metrics_port=None,
                reclaim_period=3600.0,
            )
            try:
                async with trio.open_nursery() as nursery:
                    agent: Agent = await nursery.start(
                        lambda **kw: run_agent(settings, api=api, **kw)
                    )
                    report = await _measure(args, api, kubelet, agent, seq, callers, per, n_conc)
                    nursery.cancel_scope.cancel()
            finally:
                kubelet.stop()
        await purge_namespace(api)
    return report


async def _measure(
    args: argparse.Namespace,
    api: Client,
    kubelet: KubeletStandin,
    agent: Agent,
    seq: int,
    callers: int,
    per: int,
    n_conc: int,
) -> str:
    started = time.monotonic()
    await api.create(CONFIGS, echo_config("seq", ["s0"], WARMUP + seq))
    await api.create(CONFIGS, echo_config("conc", ["c0"], n_conc))
    await api.create(CONFIGS, echo_config("spread", [f"p{i}" for i in range(callers)], per))
    await api.create(CONFIGS, echo_config("vdev", ["v0"], args.vdev))
    await wait_kubelet(
        kubelet,
        lambda k: (
            len(instance_resources(k, "seq")) == 1
            and len(instance_resources(k, "conc")) == 1
            and len(instance_resources(k, "spread")) == callers
            and len(k.healthy("akri.sh/vdev")) == 1
            and all(len(k.healthy(r)) == per for r in instance_resources(k, "spread"))
        ),
    )
    print(f"agent ready, {time.monotonic() - started:.1f}s after the Configurations")
    seq_res = instance_resources(kubelet, "seq")[0]
    conc_res = instance_resources(kubelet, "conc")[0]
    spread_res = instance_resources(kubelet, "spread")
    granted: dict[str, set[str]] = {}

    def alloc(resource: str, slot: str) -> Callable[[], Any]:
        inst = resource.split("/", 1)[1]

        def call() -> Any:
            kubelet.allocate(resource, [[slot]])
            granted.setdefault(inst, set()).add(slot)  # GIL-atomic enough: one add per slot

        return call

    seq_inst = seq_res.split("/", 1)[1]
    calls = [alloc(seq_res, f"{seq_inst}-{i}") for i in range(WARMUP + seq)]
    opts_stub = kubelet._stub(seq_res)

    def options() -> Any:
        return opts_stub.GetDevicePluginOptions(dp.Empty(), timeout=30)

    # Floor 1: grpc round trip on the same plugin socket (purerpc/trio servicer, no work).
    await trio.to_thread.run_sync(sequential, [options] * 100)
    grpc_floor, _ = await trio.to_thread.run_sync(sequential, [options] * seq)
    # Floor 2: one SSA PATCH (alone).
    ssa_inst, ssa_cm = await floor_ssa(api, seq)

    # Instance level, sequential.
    await trio.to_thread.run_sync(sequential, calls[:WARMUP])
    seq_samples, seq_err = await trio.to_thread.run_sync(sequential, calls[WARMUP:])
    # Instance level, concurrent on one Instance.
    conc_inst = conc_res.split("/", 1)[1]
    slots = iter(range(n_conc))
    jobs = [
        [alloc(conc_res, f"{conc_inst}-{next(slots)}") for _ in range(per)] for _ in range(callers)
    ]
    conc_samples, conc_err = await trio.to_thread.run_sync(concurrent, callers, jobs)
    # Instance level, concurrent, each caller on its own Instance.
    jobs = [[alloc(r, f"{r.split('/', 1)[1]}-{j}") for j in range(per)] for r in spread_res]
    spread_samples, spread_err = await trio.to_thread.run_sync(concurrent, callers, jobs)
    # Configuration level: one fresh vdev per call.
    vdevs: set[str] = set()

    def vcall(i: int) -> Callable[[], Any]:
        def call() -> Any:
            kubelet.allocate("akri.sh/vdev", [[f"vdev-{i}"]])
            vdevs.add(f"vdev-{i}")

        return call

    vdev_samples, vdev_err = await trio.to_thread.run_sync(
        sequential, [vcall(i) for i in range(args.vdev)]
    )
    vdev_samples = vdev_samples[min(WARMUP, len(vdev_samples) // 4) :]

    doubles, problems = await check_claims(api, granted, "vdev", vdevs)
    purged = len((await api.list(CONFIGS, namespace=BENCH_NS)).items) != 4

    g, si, sc = summary(grpc_floor), summary(ssa_inst), summary(ssa_cm)
    floor = {k: g[k] + si[k] for k in ("p50", "p90", "p99", "max", "mean")} | {"n": g["n"]}
    floor_cm = {k: g[k] + sc[k] for k in ("p50", "p90", "p99", "max", "mean")} | {"n": g["n"]}
    heads = ["path", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "p50/floor", "p99/floor"]
    s_seq, s_conc, s_spread, s_vdev = (
        summary(seq_samples),
        summary(conc_samples),
        summary(spread_samples),
        summary(vdev_samples),
    )
    early, late = summary(seq_samples[: seq // 5]), summary(seq_samples[-seq // 5 :])
    rows = [
        row("floor: grpcio GetDevicePluginOptions (agent plugin)", g, None),
        row("floor: SSA PATCH Instance deviceUsage (1 key)", si, None),
        row("(info) SSA PATCH ConfigMap", sc, None),
        row("FLOOR = grpc + SSA Instance", floor, None),
        row("Allocate instance-level, sequential", s_seq, floor),
        row(f"  first {seq // 5} of those", early, floor),
        row(f"  last {seq // 5} of those", late, floor),
        row(f"Allocate instance-level, {callers} callers x {per}, 1 Instance", s_conc, floor),
        row(
            f"Allocate instance-level, {callers} callers x {per}, 1 Instance each", s_spread, floor
        ),
        row("Allocate configuration-level (1 vdev), sequential", s_vdev, floor),
    ]
    errors = seq_err + conc_err + spread_err + vdev_err
    out = [
        f"### allocate_latency run {now()}",
        "",
        f"machine: {machine()}",
        f"command: .venv/bin/python -m bench.allocate_latency --seq {seq} --callers {callers} "
        f"--per-caller {per} --vdev {args.vdev}",
        "",
        table(heads, rows),
        "",
        f"(info) floor with ConfigMap SSA instead: p50 {ms(floor_cm['p50'])} ms, "
        f"p99 {ms(floor_cm['p99'])} ms",
        f"errors: {len(errors)} {sorted(set(errors))[:3]}",
        f"double claims: {doubles}; claim check problems: {problems or 'none'}; "
        f"purged by someone else: {purged}",
        f"targets: seq p50 <= 1.5x floor: {verdict(s_seq['p50'] <= 1.5 * floor['p50'])}; "
        f"seq p99 <= 3x floor: {verdict(s_seq['p99'] <= 3 * floor['p99'])}; "
        f"conc p50 <= 1.5x floor: {verdict(s_conc['p50'] <= 1.5 * floor['p50'])}; "
        f"0 double claims: {verdict(doubles == 0 and not problems)}",
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
    if "purged by someone else: True" in report:
        print("VOID run (our objects were deleted underneath us): not written")
    elif not args.no_write:
        write_run("allocate_latency", report)


if __name__ == "__main__":
    main()
