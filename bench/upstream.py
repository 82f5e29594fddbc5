"""Upstream Akri's Rust agent and controller against ours, one after the other, on the same real
node (node 1 of the local cluster, its kubelet and its device-plugin directory), the same API
server and the same workloads.

Upstream's binaries are built from source by the operator (bench/README.md says how and how
long it takes); this script only runs them, from `--upstream-agent` / `--upstream-controller`
(env AKRI_UPSTREAM_AGENT / AKRI_UPSTREAM_CONTROLLER). For each implementation in turn:

1. its controller and agent start (the agent with its embedded debugEcho, both serving
   metrics, ours with `--no-leader-elect` as upstream's controller has no election); after
   `--settle` s the agent's RSS with no Configuration;
2. a Configuration of 10 debugEcho devices: once its 10 Instances exist and `--settle` s
   passed, the agent's and the controller's RSS; the Configuration deleted;
3. a Configuration of `--devices` devices, timed from the create to the moment a watch has
   seen all its Instances; settled, both RSS, then both processes' CPU over `--idle` s in a
   window where no akri object changed; the Configuration deleted, timed until its last
   Instance is gone;
4. a Configuration of one device with capacity `--allocs` + 20: its plugin's socket found in
   the kubelet's device-plugin directory, its slot IDs read from ListAndWatch, then 20 + `--allocs`
   sequential Allocates, each a fresh slot (the first 20 not counted), from a grpcio client
   that sends `:authority` `localhost` as the kubelet does (upstream's plugins reset a stream
   whose authority is the socket path).
Both implementations' processes reach the API server through `bench._nsproxy` (one namespace,
`akri-bench-upstream`, and a handler name no other session's agent serves: see that module),
so the proxy's hop is in both columns. RSS is VmRSS, CPU is utime + stime of all threads.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import grpc
import httpx
import trio
import yaml

from akri_trio.kube.client import Client
from akri_trio.kube.errors import ApiError, NotFound, ServerError
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc as dp_grpcio
from bench._agent_proc import child_process
from bench._common import (
    bench_api,
    cluster_env,
    echo_config,
    machine,
    now,
    percentile,
    prepare_namespace,
    purge_namespace,
    record_run,
    table,
)
from bench._nsproxy import namespace_proxy
from bench.footprint import measure
from bench.scale import rss_mb

NAMESPACE = "akri-bench-upstream"
WARMUP = 20
T = TypeVar("T")
PREFIX = "upb"  # Configuration names: the kubelet's resource names are cluster-node-wide


@attrs.define
class Run:
    """One implementation's numbers."""

    agent_rss: dict[str, float] = attrs.field(factory=dict)
    controller_rss: dict[str, float] = attrs.field(factory=dict)
    agent_cpu: float = 0.0
    controller_cpu: float = 0.0
    create_s: float = 0.0
    delete_s: float = 0.0
    allocate: list[float] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)
    restarts: dict[str, int] = attrs.field(factory=dict)


class Supervised:
    """A process of the implementation under test, started again when it exits, as its
    DaemonSet or Deployment would (upstream's controller exits when a watch fails, e.g. when
    another session's chaos test restarts the API server); `restarts` counts that, and each
    start logs to its own `<base>.<n>.log`."""

    def __init__(self, argv: list[str], base: Path, env: dict[str, str]) -> None:
        self.argv, self.base, self.env = argv, base, env
        self.proc: trio.Process | None = None
        self.restarts = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        while True:
            log = self.base.with_name(f"{self.base.name}.{self.restarts}.log")
            async with child_process(self.argv, log, self.env) as proc:
                self.proc = proc
                if self.restarts == 0:
                    task_status.started()
                await proc.wait()
            self.proc = None
            self.restarts += 1
            print(f"  {self.argv[0]} {self.base.name} exited ({proc.returncode}); restarted")
            await trio.sleep(1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def proxied_kubeconfig(kubeconfig: str, server: str, path: Path) -> Path:
    """A copy of `kubeconfig` pointing at `server` (the proxy)."""
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    for cluster in cfg["clusters"]:
        cluster["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(cfg))
    return path


def commands(
    which: str, args: argparse.Namespace, root: Path, kubeconfig: Path, node: str
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """{"controller"|"agent": (argv, env)} of one implementation, as deployed."""
    base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "RUST_LOG")}
    base["KUBECONFIG"] = str(kubeconfig)
    akri_dir = root / "akri"
    akri_dir.mkdir(exist_ok=True)
    if which == "upstream":
        env = {**base, "RUST_LOG": "warn"}
        return {
            "controller": (
                [args.upstream_controller],
                {**env, "METRICS_PORT": str(free_port())},
            ),
            "agent": (
                [args.upstream_agent],
                {
                    **env,
                    "METRICS_PORT": str(free_port()),
                    "AGENT_NODE_NAME": node,
                    "DISCOVERY_HANDLERS_DIRECTORY": str(akri_dir),
                    "ENABLE_DEBUG_ECHO": "1",
                    "DEBUG_ECHO_INSTANCES_SHARED": "false",
                },
            ),
        }
    py = [sys.executable, "-m", "akri_trio"]
    common = ["--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, "--log-level", "WARNING"]
    agent = [
        *py, "agent", *common,
        "--node-name", node,
        "--discovery-handlers-directory", str(akri_dir),
        "--enable-debug-echo",
        "--metrics-port", str(free_port()),
    ]  # fmt: skip
    controller = [
        *py, "controller", *common, "--no-leader-elect", "--metrics-port", str(free_port()),
    ]  # fmt: skip
    return {"controller": (controller, base), "agent": (agent, base)}


# What the shared cluster's other sessions do to the API server now and then (a chaos test
# restarts it): the bench's own requests wait it out instead of losing the run.
PASSING = (httpx.TransportError, ServerError)


async def retried(fn: Callable[[], Awaitable[T]], limit: float = 120.0) -> T:
    """`await fn()`, again after a pause while the API server is away (at most `limit` s)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return await fn()
        except PASSING:
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.5)


async def names_of(api: Client, config: str) -> tuple[set[str], str]:
    """(names of the Instances of `config`, the list's resourceVersion)."""
    listed = await retried(lambda: api.list(INSTANCES, namespace=NAMESPACE))
    names = {
        o["metadata"]["name"] for o in listed.items if o["spec"].get("configurationName") == config
    }
    return names, listed.resource_version


async def instances_reach(
    api: Client, config: str, n: int, rv: str, names: set[str] | None = None
) -> None:
    """Return once a watch from resourceVersion `rv` (when `names` of `config` existed) has
    seen `n` Instances of `config` (a watch cut by an API server restart is followed by a list
    and a new watch)."""
    names = set(names or ())
    while len(names) != n:
        try:
            async with api.watch_stream(
                INSTANCES, namespace=NAMESPACE, resource_version=rv
            ) as events:
                async for event in events:
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    if obj["spec"].get("configurationName") != config:
                        continue
                    if event["type"] == "DELETED":
                        names.discard(obj["metadata"]["name"])
                    else:
                        names.add(obj["metadata"]["name"])
                    if len(names) == n:
                        return
        except (*PASSING, ApiError):
            await trio.sleep(0.5)
            names, rv = await names_of(api, config)
            if len(names) == n:
                return


def config_body(name: str, devices: int, capacity: int = 1) -> dict[str, Any]:
    body = echo_config(name, [f"{name}-{i:04d}" for i in range(devices)], capacity)
    body["metadata"]["namespace"] = NAMESPACE
    return body


async def apply_and_wait(
    api: Client, name: str, devices: int, capacity: int, limit: float
) -> float:
    """Create the Configuration; seconds until all its Instances exist."""
    _, rv = await names_of(api, name)
    t0 = time.perf_counter()
    await retried(lambda: api.create(CONFIGURATIONS, config_body(name, devices, capacity)))
    with trio.fail_after(limit):
        await instances_reach(api, name, devices, rv)
    return time.perf_counter() - t0


async def delete_and_wait(api: Client, name: str, limit: float) -> float:
    """Delete the Configuration; seconds until none of its Instances is left (NaN when someone
    else deleted it first: the shared cluster's fixtures purge namespaces now and then)."""
    t0 = time.perf_counter()
    names, rv = await names_of(api, name)
    purged = False
    try:
        await retried(lambda: api.delete(CONFIGURATIONS, name, namespace=NAMESPACE))
    except NotFound:  # another session's fixture purged the namespace: not our deletion's time
        print(f"  {name} was already deleted (purged by someone else?)", flush=True)
        purged = True
    with trio.fail_after(limit):
        await instances_reach(api, name, 0, rv, names)
    return float("nan") if purged else time.perf_counter() - t0


def plugin_socket(plugin_dir: Path, instance: str, limit: float) -> Path:
    """The newest `<instance>-<secs>.sock` in the device-plugin directory."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = sorted(plugin_dir.glob(f"{instance}-*.sock"), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
        time.sleep(0.1)
    raise SystemExit(f"no plugin socket for {instance} in {plugin_dir}")


def allocate_sequentially(sock: Path, n: int) -> tuple[list[float], list[str]]:
    """Latencies of `n` sequential Allocates, each of a fresh slot (from ListAndWatch)."""
    channel = grpc.insecure_channel(
        f"unix://{sock}", options=[("grpc.default_authority", "localhost")]
    )
    try:
        stub = dp_grpcio.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        stream = stub.ListAndWatch(dp.Empty(), timeout=30)
        ids = sorted((d.ID for d in next(stream).devices), key=lambda s: int(s.rsplit("-", 1)[1]))
        stream.cancel()
        stub.GetDevicePluginOptions(dp.Empty(), timeout=30)  # the connection is up
        samples, errors = [], []
        for slot in ids[:n]:
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=[slot])]
            )
            t0 = time.perf_counter()
            try:
                stub.Allocate(request, timeout=30)
                samples.append(time.perf_counter() - t0)
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()}")
        return samples, errors
    finally:
        channel.close()


async def one_implementation(
    which: str, args: argparse.Namespace, api: Client, proxy: str, env: Mapping[str, str]
) -> Run:
    run = Run()
    node = env["AKRI_TRIO_NODE_NAME"]
    plugin_dir = Path(env.get("AKRI_TRIO_DEVICE_PLUGIN_DIR", "/var/lib/kubelet/device-plugins"))
    with tempfile.TemporaryDirectory(prefix=f"akup-{which}-", dir="/tmp") as tmp:
        root = Path(tmp)
        kubeconfig = proxied_kubeconfig(env["KUBECONFIG"], proxy, root / "kubeconfig")
        cmds = commands(which, args, root, kubeconfig, node)
        async with trio.open_nursery() as nursery:
            roles = {}
            for role in ("controller", "agent"):
                argv, penv = cmds[role]
                roles[role] = Supervised(argv, root / role, penv)
                await nursery.start(roles[role].run)
            await trio.sleep(args.settle)

            def procs() -> dict[str, trio.Process]:
                return {role: sup.proc for role, sup in roles.items() if sup.proc is not None}

            def agent() -> int:
                return procs()["agent"].pid

            def controller() -> int:
                return procs()["controller"].pid

            run.agent_rss["0"] = rss_mb(agent())[0]
            run.controller_rss["0"] = rss_mb(controller())[0]
            print(f"{which}: started, agent {run.agent_rss['0']:.1f} MB", flush=True)

            small = f"{PREFIX}-ten"
            await apply_and_wait(api, small, 10, 1, args.limit)
            await trio.sleep(args.settle)
            run.agent_rss["10"] = rss_mb(agent())[0]
            run.controller_rss["10"] = rss_mb(controller())[0]
            await delete_and_wait(api, small, args.limit)

            big = f"{PREFIX}-many"
            run.create_s = await apply_and_wait(api, big, args.devices, 1, args.limit)
            print(f"{which}: {args.devices} Instances in {run.create_s:.2f} s", flush=True)
            await trio.sleep(args.settle)
            run.agent_rss["many"] = rss_mb(agent())[0]
            run.controller_rss["many"] = rss_mb(controller())[0]
            idle = await measure(api, procs(), args.idle, tries=5, namespace=NAMESPACE)
            run.agent_cpu, run.controller_cpu = idle["agent"][1], idle["controller"][1]
            run.delete_s = await delete_and_wait(api, big, args.limit)

            alloc = f"{PREFIX}-alloc"
            await apply_and_wait(api, alloc, 1, WARMUP + args.allocs, args.limit)
            (inst,) = (await names_of(api, alloc))[0]
            sock = await trio.to_thread.run_sync(plugin_socket, plugin_dir, inst, args.limit)
            samples, run.errors = await trio.to_thread.run_sync(
                allocate_sequentially, sock, WARMUP + args.allocs
            )
            run.allocate = samples[WARMUP:]
            print(
                f"{which}: Allocate p50 {percentile(run.allocate, 50) * 1e3:.2f} ms",
                flush=True,
            )
            await delete_and_wait(api, alloc, args.limit)
            run.restarts = {role: sup.restarts for role, sup in roles.items()}
            nursery.cancel_scope.cancel()
    return run


def report(args: argparse.Namespace, up: Run, ours: Run) -> str:
    n: int = args.devices

    def row(label: str, a: float, b: float, fmt: str, target: str = "") -> list[str]:
        return [label, fmt.format(a), fmt.format(b), f"{b / a:.2f}x" if a else "-", target]

    def p(run: Run, q: float) -> float:
        return percentile(run.allocate, q) * 1e3

    rows = [
        row("agent RSS MB, no Configuration", up.agent_rss["0"], ours.agent_rss["0"], "{:.1f}",
            "<= 25 MB"),
        row("agent RSS MB, 10 debugEcho devices, settled", up.agent_rss["10"],
            ours.agent_rss["10"], "{:.1f}"),
        row(f"agent RSS MB, {n} debugEcho devices, settled", up.agent_rss["many"],
            ours.agent_rss["many"], "{:.1f}", "<= 40 MB"),
        row(f"agent CPU %, idle {args.idle:.0f} s, {n} devices", up.agent_cpu, ours.agent_cpu,
            "{:.3f}", "< 0.05 %"),
        row("controller RSS MB, no Instance", up.controller_rss["0"], ours.controller_rss["0"],
            "{:.1f}"),
        row("controller RSS MB, 10 Instances", up.controller_rss["10"],
            ours.controller_rss["10"], "{:.1f}"),
        row(f"controller RSS MB, {n} Instances", up.controller_rss["many"],
            ours.controller_rss["many"], "{:.1f}", "<= 25 MB"),
        row(f"controller CPU %, idle {args.idle:.0f} s", up.controller_cpu, ours.controller_cpu,
            "{:.3f}", "0 %"),
        row(f"Allocate p50 ms ({args.allocs} sequential, fresh slot each)", p(up, 50),
            p(ours, 50), "{:.2f}", "<= 1.0x"),
        row("Allocate p99 ms", p(up, 99), p(ours, 99), "{:.2f}", "<= 1.2x"),
        row(f"Configuration applied -> {n} Instances exist, s", up.create_s, ours.create_s,
            "{:.2f}", "<= 1.0x"),
        row(f"Configuration deleted -> its {n} Instances gone, s", up.delete_s, ours.delete_s,
            "{:.2f}", "keep <= 1.0x"),
    ]  # fmt: skip

    def growth(run: Run) -> float:
        return (run.controller_rss["many"] - run.controller_rss["10"]) / (n - 10) * 1000

    lines = [
        f"### upstream side by side {now()}",
        "",
        f"machine: {machine()}",
        f"command: .venv/bin/python -m bench.upstream --devices {n} --allocs {args.allocs} "
        f"--idle {args.idle:g} --settle {args.settle:g}",
        "",
        table(["", "upstream (Rust)", "akri-trio", "ratio", "target"], rows),
        "",
        f"controller RSS growth per 1,000 Instances (from 10 to {n}): upstream "
        f"{growth(up):.1f} MB, akri-trio {growth(ours):.1f} MB",
        f"Allocate errors: upstream {len(up.errors)} {up.errors[:2]}, "
        f"akri-trio {len(ours.errors)} {ours.errors[:2]}",
        f"process restarts (exits the bench restarted, as Kubernetes would): upstream "
        f"{up.restarts}, akri-trio {ours.restarts}",
    ]
    return "\n".join(lines)


def binaries(args: argparse.Namespace) -> None:
    for name in ("upstream_agent", "upstream_controller"):
        path = getattr(args, name)
        if not path or not Path(path).is_file():
            flag = "--" + name.replace("_", "-")
            raise SystemExit(f"{flag} (or env AKRI_{name.upper()}) must name the built binary")


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    pki = Path(env["AKRI_TRIO_CLUSTER_DIR"]) / "pki"
    runs: dict[str, Run] = {}
    async with bench_api(env["KUBECONFIG"]) as api:
        await retried(lambda: prepare_namespace(api, NAMESPACE))
        try:
            async with namespace_proxy(env["AKRI_TRIO_APISERVER"], pki, NAMESPACE) as proxy:
                for which in args.order:
                    runs[which] = await one_implementation(which, args, api, proxy, env)
        finally:
            await retried(lambda: purge_namespace(api, NAMESPACE))
    if set(runs) != {"upstream", "akri-trio"}:
        return repr(runs)  # a partial run (--order): the raw numbers, not the table
    return report(args, runs["upstream"], runs["akri-trio"])


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__)
    p.add_argument("--upstream-agent", default=os.environ.get("AKRI_UPSTREAM_AGENT"))
    p.add_argument("--upstream-controller", default=os.environ.get("AKRI_UPSTREAM_CONTROLLER"))
    p.add_argument("--devices", type=int, default=200)
    p.add_argument("--allocs", type=int, default=200)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--limit", type=float, default=180.0, help="seconds any one step may take")
    p.add_argument(
        "--order", type=lambda s: s.split(","), default=["upstream", "akri-trio"],
        help="which runs, in this order (default upstream,akri-trio)",
    )  # fmt: skip
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args(argv)
    binaries(args)
    text = trio.run(bench, args)
    print(text)
    record_run("upstream", text, write=not args.no_write)


if __name__ == "__main__":
    main()
