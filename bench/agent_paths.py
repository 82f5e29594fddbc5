"""The agent's own cost on the two paths of issue 25 items 3 and 4, without upstream's side:
a Configuration of `--devices` debugEcho devices until a watch has seen all its Instances (and
until all its plugins offer the kubelet stand-in their devices), and
`--allocs` sequential Allocates (each a fresh slot, after 20 not counted). For each, the wall
time and the agent process's CPU seconds (utime + stime), so a change to either path can be
measured in a minute instead of `bench.upstream`'s six.

    .venv/bin/python -m bench.agent_paths [--devices 200] [--allocs 200] [--rounds 2]
        [--write-concurrency N] [--profile /tmp/agent.samples]
    .venv/bin/python -m bench.agent_paths --show /tmp/agent.samples

The agent runs as its own process (`bench._agent_proc`, the kubelet being the grpcio
stand-in in this process); with `--profile` its main thread's stack is sampled during the
measured phases (see PROFILED), and `--show` prints the functions seen most, inclusive and
exclusive. Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import trio

from akri_trio.kube.client import JSON, Client
from akri_trio.kube.errors import NotFound
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._agent_proc import (
    REQUESTS_ENV,
    REQUESTS_PERIOD_S,
    agent_args,
    child_process,
    requests_of,
)
from bench._common import (
    bench_api,
    cluster_env,
    echo_config,
    machine,
    percentile,
    prepare_namespace,
    purge_namespace,
)
from bench.scale import cpu_seconds
from tests.support.kubelet_standin import KubeletStandin

NODE = "bench-paths-node"
# Its own namespace: other sessions' benchmarks use akri-bench at the same time.
NAMESPACE = "akri-bench-paths"
# `python -c PROFILED <file> <agent flags>`: the agent (with BENCH_WRITE_CONCURRENCY, that many
# Instance writes in flight); with a file, its main thread's stack sampled every
# half millisecond between SIGUSR1 and SIGUSR2 (cProfile's per-call cost distorts the picture:
# it made purerpc's per-server setup look 10x what it is), the counts of each stack pickled at
# exit (`python -m bench.agent_paths --show <file>` prints them).
PROFILED = """
import collections, os, pickle, signal, sys, threading, time
from akri_trio.agent import configurations
from bench._agent_proc import main
out = sys.argv.pop(1)
if os.environ.get("BENCH_WRITE_CONCURRENCY"):
    configurations.WRITE_CONCURRENCY = int(os.environ["BENCH_WRITE_CONCURRENCY"])
if not out:
    sys.exit(main(sys.argv[1:]))
main_id = threading.get_ident()
samples = collections.Counter()
on = threading.Event()
def sample():
    while True:
        on.wait()
        frame = sys._current_frames().get(main_id)
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, code.co_firstlineno, code.co_name))
            frame = frame.f_back
        samples[tuple(stack)] += 1
        time.sleep(0.0005)
signal.signal(signal.SIGUSR1, lambda *_: on.set())
signal.signal(signal.SIGUSR2, lambda *_: on.clear())
sys.setswitchinterval(0.0005)
threading.Thread(target=sample, daemon=True).start()
try:
    main(sys.argv[1:])
finally:
    on.clear()
    with open(out, "wb") as f:
        pickle.dump(dict(samples), f)
"""
WARMUP = 20


PROFILING: set[int] = set()  # the pids of agents run under PROFILED


def profile(pid: int, *, on: bool) -> None:
    """Start or stop the profile of a profiled agent."""
    if pid in PROFILING:
        os.kill(pid, signal.SIGUSR1 if on else signal.SIGUSR2)


def configuration(name: str, descriptions: list[str], capacity: int) -> JSON:
    body = echo_config(name, descriptions, capacity)
    body["metadata"]["namespace"] = NAMESPACE
    return body


async def instances_seen(api: Client, config: str, n: int) -> None:
    """Until a watch from before the create has seen `n` Instances of `config`."""
    listed = await api.list(INSTANCES, namespace=NAMESPACE)
    names = {
        o["metadata"]["name"] for o in listed.items if o["spec"]["configurationName"] == config
    }
    if len(names) >= n:
        return
    rv = listed.resource_version
    async with api.watch_stream(INSTANCES, namespace=NAMESPACE, resource_version=rv) as events:
        async for event in events:
            obj = event.get("object") or {}
            if (obj.get("spec") or {}).get("configurationName") != config:
                continue
            if event.get("type") in ("ADDED", "MODIFIED"):
                names.add(obj["metadata"]["name"])
            if len(names) >= n:
                return


async def gone(api: Client, config: str) -> None:
    with contextlib.suppress(NotFound):
        await api.delete(CONFIGURATIONS, config, namespace=NAMESPACE)

    async def left() -> bool:
        listed = await api.list(INSTANCES, namespace=NAMESPACE)
        return any(o["spec"]["configurationName"] == config for o in listed.items)

    while await left():  # noqa: ASYNC110 (the API server, polled: no event to wait on)
        await trio.sleep(0.2)


def plugins_serving(kubelet: KubeletStandin, config: str) -> int:
    """How many of `config`'s plugins (its Instances' and its own) offer the kubelet stand-in a
    healthy device."""
    prefix = f"akri.sh/{config}"
    return sum(
        1
        for resource, devices in list(kubelet.devices.items())
        if resource.startswith(prefix) and any(h == "Healthy" for _, h in devices)
    )


async def ramp(
    api: Client, kubelet: KubeletStandin, pid: int, config: str, n: int
) -> tuple[float, float, float]:
    """(wall s, agent CPU s) from the create of `config` to its `n` Instances seen, and the
    wall s from the create to all `n` + 1 of its plugins serving the kubelet stand-in."""
    body = configuration(config, [f"{config}-{i:04d}" for i in range(n)], 1)
    async with trio.open_nursery() as nursery:
        seen = trio.Event()

        async def watch() -> None:
            await instances_seen(api, config, n)
            seen.set()

        nursery.start_soon(watch)
        await trio.sleep(0.5)  # the watch is open
        profile(pid, on=True)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        await api.create(CONFIGURATIONS, body)
        await seen.wait()
        wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - c0
        profile(pid, on=False)
    await trio.to_thread.run_sync(
        kubelet.wait_for, lambda k: plugins_serving(k, config) >= n + 1, 120.0
    )
    return wall, cpu, time.monotonic() - t0


async def allocates(
    api: Client, kubelet: KubeletStandin, pid: int, config: str, n: int
) -> tuple[list[float], float]:
    """(latencies s of `n` sequential Allocates, agent CPU s over them)."""
    await api.create(CONFIGURATIONS, configuration(config, [f"{config}-0"], n + WARMUP))

    def ready(k: KubeletStandin) -> bool:
        return any(
            r.startswith(f"akri.sh/{config}-") and len(k.healthy(r)) == n + WARMUP
            for r in list(k.registrations)
        )

    await trio.to_thread.run_sync(kubelet.wait_for, ready, 120.0)
    resource = next(r for r in list(kubelet.registrations) if r.startswith(f"akri.sh/{config}-"))
    slots = kubelet.healthy(resource)

    def run() -> tuple[list[float], float]:
        out: list[float] = []
        c0 = 0.0
        for i, slot in enumerate(slots):
            if i == WARMUP:
                profile(pid, on=True)
                c0 = cpu_seconds(pid)
            t0 = time.perf_counter()
            kubelet.allocate(resource, [[slot]])
            if i >= WARMUP:
                out.append(time.perf_counter() - t0)
        cpu = cpu_seconds(pid) - c0
        profile(pid, on=False)
        return out, cpu

    return await trio.to_thread.run_sync(run)


async def bench(args: argparse.Namespace) -> None:
    env = cluster_env()
    async with bench_api(env["KUBECONFIG"]) as api:
        await prepare_namespace(api, NAMESPACE)
        with tempfile.TemporaryDirectory(prefix="akp", dir="/tmp") as tmp:
            root = Path(tmp)
            (root / "dp").mkdir()
            kubelet = KubeletStandin(root / "dp").start()
            py = [sys.executable, "-c", PROFILED, args.profile]
            cmd = [*py, *agent_args(root, env["KUBECONFIG"], NODE), "--namespace", NAMESPACE]
            # as bench.upstream runs it: `--log-level WARNING` (which _agent_proc reads here)
            agent_env = {
                **os.environ,
                "AKRI_LOG_LEVEL": "WARNING",
                REQUESTS_ENV: str(root / "requests.json"),
            }
            try:
                async with child_process(cmd, root / "agent.log", agent_env) as proc:
                    if args.profile:
                        PROFILING.add(proc.pid)
                    await trio.sleep(args.settle)
                    for r in range(args.rounds):
                        if args.devices:
                            before = requests_of(root)
                            wall, cpu, plugins = await ramp(
                                api, kubelet, proc.pid, f"ramp{r}", args.devices
                            )
                            await trio.sleep(REQUESTS_PERIOD_S * 2)
                            sent = requests_of(root) - before
                            print(
                                f"round {r}: {args.devices} Instances in {wall:.2f} s, "
                                f"agent CPU {cpu:.2f} s, all plugins serving in {plugins:.2f} s; "
                                f"requests {dict(sent)}",
                                flush=True,
                            )
                            before = requests_of(root)
                            await gone(api, f"ramp{r}")
                            await trio.sleep(REQUESTS_PERIOD_S * 2)
                            print(f"  deleted: requests {dict(requests_of(root) - before)}")
                        if args.allocs:
                            lat, cpu = await allocates(
                                api, kubelet, proc.pid, f"al{r}", args.allocs
                            )
                            print(
                                f"round {r}: {len(lat)} Allocates p50 "
                                f"{percentile(lat, 50) * 1e3:.2f} ms p99 "
                                f"{percentile(lat, 99) * 1e3:.2f} ms, agent CPU "
                                f"{cpu / len(lat) * 1e3:.2f} ms each",
                                flush=True,
                            )
                            await gone(api, f"al{r}")
            finally:
                kubelet.stop()
                print((root / "agent.log").read_text()[-2000:])
        await purge_namespace(api, NAMESPACE)
    print(machine())


def show(path: Path, top: int = 40) -> None:
    """The functions in most samples: inclusive (on the stack) and exclusive (running)."""
    samples: dict[tuple[tuple[str, int, str], ...], int] = pickle.loads(path.read_bytes())
    total = sum(samples.values())
    inclusive: Counter[tuple[str, int, str]] = Counter()
    exclusive: Counter[tuple[str, int, str]] = Counter()
    for stack, n in samples.items():
        for frame in set(stack):
            inclusive[frame] += n
        if stack:
            exclusive[stack[0]] += n
    print(f"{total} samples")
    for title, counts in (("inclusive", inclusive), ("exclusive", exclusive)):
        print(f"--- {title}")
        for (file, line, name), n in counts.most_common(top):
            short = file.split("site-packages/")[-1].split("/instances/")[-1]
            print(f"{100 * n / total:5.1f} %  {name}  {short}:{line}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=200)
    p.add_argument("--allocs", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--profile", default="", help="sample the agent's stacks, the counts here")
    p.add_argument(
        "--write-concurrency", type=int, default=0, help="the agent's Instance writes in flight"
    )
    p.add_argument("--show", default="", help="print the samples of this file and exit")
    args = p.parse_args()
    if args.show:
        show(Path(args.show))
    else:
        trio.run(bench, args)


if __name__ == "__main__":
    main()
