"""Discovery latency: a device appears at the handler -> the kubelet stand-in sees it.

    .venv/bin/python -m bench.discovery_latency [--rounds 10] [--polls 0.2,0.05]

An in-process agent (`run_agent`, embedded debugEcho as `benchEcho`) and a grpcio kubelet
stand-in, for each debugEcho poll interval given (the handler stats its availability file once
per interval; 0.2 s is the shipped value, 0.05 s shows the pipeline's own latency). Two ways
for devices to appear, `--devices` of them each time:
  toggle   the availability file goes OFFLINE (wait: the stand-in shows no healthy device),
           then ONLINE at t0 (a random phase against the poll); t = the stand-in's ListAndWatch
           shows every instance-level resource healthy (all slots) and the configuration-level
           resource healthy.
           This includes: handler poll, reconcile, Instance creation in the API server, plugin
           socket + Register, the stand-in dialling back, the first ListAndWatch answer.
  create   a new Configuration is created at t0 (no poll wait: the handler sends at once).
"first" is when the first instance-level resource is healthy, "all" when all of them are.
Floor: none is meaningful beyond the API write, which is shown for scale: one Instance create
(POST) p50 measured in the same run.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import trio

from akri_trio.agent.run import AgentSettings, run_agent
from akri_trio.kube.client import Client
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._common import (
    BENCH_NS,
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
from tests.support.kubelet_standin import KubeletStandin

NODE = "bench-node"
CAPACITY = 2


def _inst_resources(k: KubeletStandin, config: str) -> list[str]:
    return [r for r in k.registrations if r.startswith(f"akri.sh/{config}-")]


def _all_healthy(k: KubeletStandin, config: str, n: int) -> bool:
    res = _inst_resources(k, config)
    return (
        len(res) == n
        and all(len(k.healthy(r)) == CAPACITY for r in res)
        and len(k.healthy(f"akri.sh/{config}")) > 0
    )


def _first_healthy(k: KubeletStandin, config: str) -> bool:
    return any(len(k.healthy(r)) == CAPACITY for r in _inst_resources(k, config))


def _none_healthy(k: KubeletStandin, config: str) -> bool:
    return not any(k.healthy(r) for r in _inst_resources(k, config)) and not k.healthy(
        f"akri.sh/{config}"
    )


def _watch_appear(k: KubeletStandin, config: str, n: int, t0: float) -> tuple[float, float]:
    """(first, all) seconds after t0, observed from the stand-in's own condition variable."""
    k.wait_for(lambda s: _first_healthy(s, config), 30.0)
    first = time.perf_counter() - t0
    k.wait_for(lambda s: _all_healthy(s, config, n), 30.0)
    return first, time.perf_counter() - t0


async def api_floor(api: Client, rounds: int) -> list[float]:
    """Instance POST + DELETE; returns the POST latencies."""
    out = []
    for i in range(rounds + 5):
        body = {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "metadata": {"name": f"floor-{i}", "namespace": BENCH_NS},
            "spec": {"configurationName": "floor", "cdiName": "akri.sh/floor=0", "capacity": 2},
        }
        t0 = time.perf_counter()
        await api.create(INSTANCES, body)
        dt = time.perf_counter() - t0
        await api.delete(INSTANCES, f"floor-{i}", namespace=BENCH_NS)
        if i >= 5:
            out.append(dt)
    return out


async def one_interval(
    api: Client, poll: float, rounds: int, devices: int, tag: str
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {
        "toggle first": [],
        "toggle all": [],
        "create first": [],
        "create all": [],
    }
    with tempfile.TemporaryDirectory(prefix="akd", dir="/tmp") as tmp:
        root = Path(tmp)
        avail = root / "avail"
        avail.write_text("ONLINE")
        kubelet = KubeletStandin(root / "dp").start()
        settings = AgentSettings(
            node=NODE,
            discovery_handlers_directory=root / "akri",
            device_plugin_dir=root / "dp",
            pod_resources_socket=root / "pr.sock",
            namespace=BENCH_NS,
            handlers=(bench_echo(avail, poll),),
            metrics_port=None,
            reclaim_period=3600.0,
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(lambda **kw: run_agent(settings, api=api, **kw))
                cfg = f"tog{tag}"
                descr = [f"{cfg}-d{i}" for i in range(devices)]
                t0 = time.perf_counter()
                await api.create(CONFIGURATIONS, echo_config(cfg, descr, CAPACITY))
                await trio.to_thread.run_sync(_watch_appear, kubelet, cfg, devices, t0)
                for _ in range(rounds):
                    avail.write_text("OFFLINE")
                    await trio.to_thread.run_sync(
                        kubelet.wait_for, lambda s: _none_healthy(s, cfg), 30.0
                    )
                    # A random phase against the handler's poll (else every round lands alike).
                    await trio.sleep(0.1 + random.uniform(0, poll))
                    t0 = time.perf_counter()
                    avail.write_text("ONLINE")
                    first, every = await trio.to_thread.run_sync(
                        _watch_appear, kubelet, cfg, devices, t0
                    )
                    samples["toggle first"].append(first)
                    samples["toggle all"].append(every)
                for i in range(rounds):
                    new = f"new{tag}-{i}"
                    descr = [f"{new}-d{j}" for j in range(devices)]
                    t0 = time.perf_counter()
                    await api.create(CONFIGURATIONS, echo_config(new, descr, CAPACITY))
                    first, every = await trio.to_thread.run_sync(
                        _watch_appear, kubelet, new, devices, t0
                    )
                    samples["create first"].append(first)
                    samples["create all"].append(every)
                    await api.delete(CONFIGURATIONS, new, namespace=BENCH_NS)
                    await trio.sleep(0.2)
                nursery.cancel_scope.cancel()
        finally:
            kubelet.stop()
    await purge_namespace(api)
    return samples


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    polls = [float(p) for p in args.polls.split(",")]
    started = time.monotonic()
    rows = []
    async with bench_api(env["KUBECONFIG"]) as api:
        await prepare_namespace(api)
        floor = summary(await api_floor(api, 30))
        for n, poll in enumerate(polls):
            got = await one_interval(api, poll, args.rounds, args.devices, str(n))
            for label, values in got.items():
                s = summary(values)
                rows.append(
                    [
                        f"{poll:g} s",
                        label,
                        str(int(s["n"])),
                        ms(s["p50"]),
                        ms(s["p90"]),
                        ms(s["max"]),
                        verdict(s["p50"] < 0.250),
                    ]
                )
    heads = ["handler poll", "path", "n", "p50 ms", "p90 ms", "max ms", "p50 < 250 ms"]
    return "\n".join(
        [
            f"### discovery_latency run {now()}",
            "",
            f"machine: {machine()}",
            f"command: .venv/bin/python -m bench.discovery_latency --rounds {args.rounds} "
            f"--polls {args.polls} --devices {args.devices}",
            "",
            table(heads, rows),
            "",
            f"(scale) one Instance POST to the API server: p50 {ms(floor['p50'])} ms, "
            f"p99 {ms(floor['p99'])} ms",
            f"wall time {time.monotonic() - started:.0f} s",
        ]
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--polls", default="0.2,0.05")
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    if not args.no_write:
        write_run("discovery_latency", report)


if __name__ == "__main__":
    main()
