"""Scale: 1,000 Instances on one agent — RSS and idle CPU of the agent process.

    .venv/bin/python -m bench.scale [--instances 1000] [--kubelet | --no-kubelet] [--idle 30]

The agent runs as its own process (`python -m bench._agent_proc`, i.e. the `akri-trio agent`
CLI with the benchmark isolation; `--metrics-port -1`, sockets in a tmp dir). Phases:
  empty     agent synced, no Configuration: RSS and CPU over `--idle-empty` s (the baseline)
  ramp      one debugEcho Configuration with `--instances` descriptions (capacity 1) is
            created; time until the API server holds them all (and, with the kubelet stand-in,
            until every instance-level plugin is registered and healthy in ListAndWatch)
  settled   `--settle` s later: RSS, then CPU over `--idle` s (target RSS < 200 MB, CPU < 2 %)
  teardown  the Configuration is deleted; time until every Instance is gone
With `--kubelet` the grpcio stand-in (in this process, not counted) registers the 1,001
plugins, dials each back and keeps a ListAndWatch stream open to each: the realistic case.
CPU % is of one core: (utime + stime) / wall, from /proc/<pid>/stat.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from akri_trio.kube.client import Client
from akri_trio.kube.errors import NotFound
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._agent_proc import agent_process
from bench._common import (
    BENCH_NS,
    bench_api,
    cluster_env,
    echo_config,
    machine,
    now,
    prepare_namespace,
    purge_namespace,
    table,
    write_run,
)
from tests.support.kubelet_standin import KubeletStandin

NODE = "bench-scale-node"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    rest = stat.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def counts(pid: int) -> tuple[int, int]:
    """(threads, open fds)."""
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


async def cpu_percent(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    await trio.sleep(seconds)
    return 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


async def count_instances(api: Client) -> int:
    return len((await api.list(INSTANCES, namespace=BENCH_NS)).items)


async def until(check: Callable[[], Awaitable[bool]], limit_s: float, every: float = 0.5) -> float:
    """Poll `await check()` (the API server) until true; seconds taken."""
    t0 = time.monotonic()
    with trio.fail_after(limit_s):
        while True:
            if await check():
                return time.monotonic() - t0
            await trio.sleep(every)


class Keeper:
    """Re-creates our Configuration when someone else's test fixture purges it (the shared
    cluster's tests delete every akri object), and counts how often that happened."""

    def __init__(self, api: Client, body: dict[str, object]) -> None:
        self.api, self.body = api, body
        self.recreated = 0
        self.active = True

    async def run(self) -> None:
        while True:
            await trio.sleep(1.0)
            if not self.active:
                continue
            try:
                await self.api.get(CONFIGURATIONS, "scale", namespace=BENCH_NS)
            except NotFound:
                self.recreated += 1
                print(f"  our Configuration was purged; re-creating (#{self.recreated})")
                await self.api.create(CONFIGURATIONS, self.body)


async def clean_windows(
    api: Client, pid: int, keeper: Keeper, n: int, total: float, window: float
) -> list[float]:
    """CPU % over consecutive windows, keeping only those during which nothing was purged
    (Instance count n at both ends, no re-creation)."""
    out: list[float] = []
    end = time.monotonic() + total
    while time.monotonic() < end:
        before = keeper.recreated
        ok = await count_instances(api) == n
        cpu = await cpu_percent(pid, window)
        if ok and keeper.recreated == before and await count_instances(api) == n:
            out.append(cpu)
    return out


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    n: int = args.instances
    lines: list[list[str]] = []
    notes: list[str] = []
    async with bench_api(env["KUBECONFIG"]) as api, trio.open_nursery() as nursery:
        await prepare_namespace(api)
        with tempfile.TemporaryDirectory(prefix="aks", dir="/tmp") as tmp:
            root = Path(tmp)
            kubelet = KubeletStandin(root / "dp").start() if args.kubelet else None
            async with agent_process(root, env["KUBECONFIG"], NODE) as proc:
                pid = proc.pid
                try:
                    await trio.sleep(args.settle)  # import, sync (nothing to do)
                    rss, _ = rss_mb(pid)
                    cpu = await cpu_percent(pid, args.idle_empty)
                    th, fds = counts(pid)
                    lines.append(["empty (synced, 0 Instances)", f"{rss:.1f}", "", f"{cpu:.2f}",
                                  str(th), str(fds), ""])  # fmt: skip
                    c0 = cpu_seconds(pid)
                    t0 = time.monotonic()
                    descr = [f"scale-{i:04d}" for i in range(n)]
                    body = echo_config("scale", descr, 1)
                    await api.create(CONFIGURATIONS, body)
                    keeper = Keeper(api, body)
                    nursery.start_soon(keeper.run)

                    async def all_there() -> bool:
                        have = await count_instances(api)
                        if time.monotonic() - progress[0] > 10:
                            progress[0] = time.monotonic()
                            exists = bool(
                                (await api.list(CONFIGURATIONS, namespace=BENCH_NS)).items
                            )
                            gone = "" if exists else " (our Configuration is GONE: purged?)"
                            print(f"  {time.monotonic() - t0:.0f} s: {have} Instances{gone}")
                        return have == n

                    progress = [time.monotonic()]

                    t_api = await until(all_there, args.limit)
                    t_plugins = None
                    if kubelet is not None:

                        def registered(k: KubeletStandin) -> bool:
                            return (
                                len(k.registrations) == n + 1
                                and sum(1 for r in k.devices if k.healthy(r)) == n + 1
                            )

                        left = max(1.0, args.limit - (time.monotonic() - t0))
                        await trio.to_thread.run_sync(kubelet.wait_for, registered, left)
                        t_plugins = time.monotonic() - t0
                    ramp_cpu = cpu_seconds(pid) - c0
                    await trio.sleep(args.settle)
                    rss, hwm = rss_mb(pid)
                    windows = await clean_windows(api, pid, keeper, n, args.idle, args.window)
                    th, fds = counts(pid)
                    rss2, hwm = rss_mb(pid)
                    rss = max(rss, rss2)
                    if not windows:
                        notes.append("VOID: no idle window free of purges")
                        windows = [float("nan")]
                    cpu = sorted(windows)[len(windows) // 2]
                    notes.append(
                        f"idle CPU: median of {len(windows)} clean {args.window:g} s windows "
                        f"(min {min(windows):.2f}, max {max(windows):.2f} %); "
                        f"Configuration re-created after purges: {keeper.recreated}"
                    )
                    print(f"  settled: RSS {rss:.1f} MB, CPU {cpu:.2f} %", flush=True)
                    lines.append([f"settled, {n} Instances", f"{rss:.1f}", f"{hwm:.1f}",
                                  f"{cpu:.2f}", str(th), str(fds),
                                  "PASS" if rss < 200 and cpu < 2 else "FAIL"])  # fmt: skip
                    plugins = (
                        ""
                        if t_plugins is None
                        else f", all plugins registered+healthy after {t_plugins:.1f} s"
                    )
                    print(f"  ramp: {t_api:.1f} s, plugins {t_plugins}", flush=True)
                    notes.append(
                        f"ramp: {n} Instances in the API server after {t_api:.1f} s{plugins}; "
                        f"agent CPU during ramp {ramp_cpu:.1f} s"
                    )
                    t0 = time.monotonic()
                    keeper.active = False
                    try:
                        await api.delete(CONFIGURATIONS, "scale", namespace=BENCH_NS)
                    except NotFound:
                        notes.append("teardown: our Configuration had already been purged")

                    async def gone() -> bool:
                        return await count_instances(api) == 0

                    t_gone = await until(gone, args.limit)
                    rss, hwm = rss_mb(pid)
                    notes.append(
                        f"teardown: Configuration deleted -> 0 Instances after {t_gone:.1f} s; "
                        f"agent RSS after {rss:.1f} MB (peak {hwm:.1f} MB)"
                    )
                finally:
                    if kubelet is not None:
                        kubelet.stop()
                    text = (root / "agent.log").read_text()
                    await trio.Path("/tmp/bench-scale-agent.log").write_text(text)
                    tail = text.splitlines()[-5:]
                    if tail:
                        notes.append("agent log tail: " + " / ".join(tail)[:600])
        await purge_namespace(api, limit_s=args.limit)
        nursery.cancel_scope.cancel()
    heads = ["phase", "RSS MB", "peak MB", "CPU % (1 core)", "threads", "fds", "target"]
    mode = "--kubelet" if args.kubelet else "--no-kubelet"
    return "\n".join(
        [
            f"### scale run {now()} ({mode})",
            "",
            f"machine: {machine()}",
            f"command: .venv/bin/python -m bench.scale --instances {n} {mode} --idle {args.idle}",
            "",
            table(heads, lines),
            "",
            *notes,
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=1000)
    p.add_argument("--kubelet", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--idle", type=float, default=30.0, help="CPU sampling window, settled")
    p.add_argument("--window", type=float, default=5.0, help="CPU window (purge-free ones count)")
    p.add_argument("--idle-empty", type=float, default=10.0)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--limit", type=float, default=150.0, help="give up on a phase after this")
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    if "VOID" in report:
        print("VOID run (our objects were deleted underneath us): not written")
    elif not args.no_write:
        write_run("scale", report)


if __name__ == "__main__":
    main()
