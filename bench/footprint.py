"""What each akri-trio process costs at rest: its import time, its resident memory after
start-up, and the CPU it burns while nothing changes.

On a small board every role's start-up time and resident set is paid on every node, so each is
measured against a floor taken in the same run: a bare `python -c pass` (its `-X importtime`
total and its RSS). The import time of a role is the `-X importtime` cumulative time of the
modules its entry point imports, beyond those the bare interpreter imports too (median of
`--repeat` fresh interpreters). Then the real processes start, each against the local cluster
and each scoped to the bench namespace: the agent (no Configuration; the debugEcho handler
embedded), the controller (`--namespace akri-bench --no-leader-elect`), the webhook (a
self-signed certificate) and a `discovery-handler debugEcho` registering with that agent. After
`--settle` seconds their RSS is read, and their CPU over `--idle` seconds of nothing changing
(utime + stime from /proc/<pid>/stat, % of one core: one window, so the clock tick's 10 ms is
0.017 % of a minute). Then a Configuration of `--devices` debugEcho devices (a kubelet stand-in
takes their plugins), and the agent's and the controller's RSS and idle CPU again once settled.
The agent's API requests are not counted here (counting wakes it); `--agent-flags` gives it
more flags, e.g. the periods of an earlier default to compare with.

Usage: python -m bench.footprint [--repeat 5] [--settle 10] [--idle 60] [--devices 200]
       [--agent-flags "..."] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from akri_trio.kube.client import Client
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._agent_proc import agent_process, child_process
from bench._common import (
    BENCH_NS,
    bench_api,
    cluster_env,
    echo_config,
    machine,
    prepare_namespace,
    purge_namespace,
    table,
    write_run,
)
from bench.scale import count_instances, cpu_seconds, rss_mb, until
from tests.support.kubelet_standin import KubeletStandin

# What each role's entry point imports before it does anything (akri_trio.__main__ dispatches
# to these lazily, so each process pays for its own role only).
ROLE_IMPORTS: dict[str, tuple[str, ...]] = {
    "agent": ("akri_trio.agent.cli", "akri_trio.agent.run"),
    "controller": ("akri_trio.controller.cli", "akri_trio.controller.run"),
    "webhook": ("akri_trio.webhook.cli", "akri_trio.webhook.server"),
    "discovery-handler debugEcho": (
        "akri_trio.discovery.cli",
        "akri_trio.discovery.standalone",
        "akri_trio.discovery.handlers.debug_echo",
    ),
    "cli (akri-trio --help)": ("akri_trio.cli",),
}
NODE = "bench-footprint-node"


# --- import time and RSS after import: fresh interpreters, no cluster -------------------------


def _top_level_importtimes(stderr: str) -> dict[str, int]:
    """{module: cumulative us} of the top-level entries of an `-X importtime` report."""
    out: dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if name.startswith(" ") and not name.startswith("  "):  # one space: top level
            try:
                out[name.strip()] = int(cumulative)
            except ValueError:  # the header line
                continue
    return out


def import_ms(modules: Sequence[str], floor: dict[str, int]) -> float:
    """The import time of `modules` in a fresh interpreter beyond the interpreter's own."""
    code = "; ".join(f"import {m}" for m in modules) or "pass"
    report = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    own = _top_level_importtimes(report)
    return sum(us for name, us in own.items() if name not in floor) / 1000


def rss_after_import(modules: Sequence[str]) -> float:
    """VmRSS in MB of a fresh interpreter that imported `modules`."""
    # /proc read inline: importing a helper would add its own imports to what is measured
    code = "".join(f"import {m}\n" for m in modules) + (
        "for line in open('/proc/self/status'):\n"
        "    if line.startswith('VmRSS:'):\n"
        "        print(int(line.split()[1]) / 1024)\n"
    )
    return float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    )


def imports_table(repeat: int) -> str:
    floor_report = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True
    ).stderr
    floor = _top_level_importtimes(floor_report)
    floor_ms = sum(floor.values()) / 1000
    floor_rss = rss_after_import(())
    rows = [["python -c pass (floor)", f"{floor_ms:.1f}", "1.0", f"{floor_rss:.1f}", "1.0"]]
    for role, modules in ROLE_IMPORTS.items():
        ms = statistics.median(import_ms(modules, floor) for _ in range(repeat))
        rss = rss_after_import(modules)
        rows.append(
            [role, f"{ms:.0f}", f"{ms / floor_ms:.1f}", f"{rss:.1f}", f"{rss / floor_rss:.1f}"]
        )
    headers = ["role", "import ms", "x floor", "RSS after import MB", "x floor"]
    return table(headers, rows)


# --- the real processes, against the cluster ---------------------------------------------------


def role_command(*args: str) -> list[str]:
    """`akri-trio ARGS` as this interpreter runs it, logging warnings only."""
    return [sys.executable, "-m", "akri_trio", *args, "--log-level", "WARNING"]


def controller_command(kubeconfig: str) -> list[str]:
    return role_command(
        "controller", "--kubeconfig", kubeconfig, "--namespace", BENCH_NS,
        "--no-leader-elect", "--metrics-port", "-1",
    )  # fmt: skip


def webhook_command(root: Path, kubeconfig: str) -> list[str]:
    """The webhook serving a fresh self-signed certificate written under `root`."""
    from akri_trio.webhook.certs import serving_certs

    certs = serving_certs("bench-webhook", BENCH_NS, dt.datetime.now(dt.UTC), ips=["127.0.0.1"])
    (root / "tls.crt").write_bytes(certs.cert_pem)
    (root / "tls.key").write_bytes(certs.key_pem)
    return role_command(
        "webhook", "--tls-cert-file", str(root / "tls.crt"), "--tls-key-file",
        str(root / "tls.key"), "--kubeconfig", kubeconfig, "--host", "127.0.0.1", "--port", "0",
    )  # fmt: skip


def handler_command(root: Path) -> list[str]:
    """`discovery-handler debugEcho`, registering with the agent whose root is `root`."""
    return role_command(
        "discovery-handler", "debugEcho",
        "--registration-socket", str(root / "akri" / "agent-registration.sock"),
        "--socket", str(root / "echo.sock"),
    )  # fmt: skip


async def akri_versions(api: Client, namespace: str = BENCH_NS) -> dict[str, str]:
    """{kind/name: resourceVersion} of the akri objects in `namespace`."""
    out: dict[str, str] = {}
    for resource in (CONFIGURATIONS, INSTANCES):
        for obj in (await api.list(resource, namespace=namespace)).items:
            out[f"{resource.plural}/{obj['metadata']['name']}"] = obj["metadata"]["resourceVersion"]
    return out


async def measure(
    api: Client,
    procs: dict[str, trio.Process],
    idle: float,
    tries: int = 3,
    namespace: str = BENCH_NS,
) -> dict[str, tuple[float, float]]:
    """{name: (RSS MB, CPU % of one core over `idle` seconds)}, from the first of `tries`
    windows in which no akri object of `namespace` changed (the shared cluster's test
    fixtures purge every namespace now and then: a window with the agent re-creating what was
    purged is not idle). Raises if none was."""
    for _ in range(tries):
        before = await akri_versions(api, namespace)
        rss = {name: rss_mb(proc.pid)[0] for name, proc in procs.items()}
        cpu0 = {name: cpu_seconds(proc.pid) for name, proc in procs.items()}
        t0 = time.monotonic()
        await trio.sleep(idle)
        wall = time.monotonic() - t0
        cpu = {
            name: 100 * (cpu_seconds(proc.pid) - cpu0[name]) / wall for name, proc in procs.items()
        }
        if await akri_versions(api, namespace) == before:
            return {name: (rss[name], cpu[name]) for name in procs}
        print("  an akri object changed during the window (purged?); measuring again", flush=True)
    raise SystemExit(f"no undisturbed {idle:g} s window in {tries} tries")


async def with_devices(api: Client, kubelet: KubeletStandin, n: int, limit: float) -> None:
    """Our Configuration of `n` debugEcho devices applied; return once the API server has its
    `n` Instances and the kubelet stand-in every plugin (and the agent's own), healthy."""
    await api.create(CONFIGURATIONS, echo_config("footprint", [f"fp-{i:04d}" for i in range(n)], 1))

    async def all_there() -> bool:
        return await count_instances(api) >= n

    await until(all_there, limit)

    def registered(k: KubeletStandin) -> bool:
        healthy = sum(1 for r in k.devices if k.healthy(r))
        return len(k.registrations) == n + 1 and healthy == n + 1

    await trio.to_thread.run_sync(kubelet.wait_for, registered, limit)


async def processes_table(args: argparse.Namespace) -> str:
    env = cluster_env()
    floor_rss = rss_after_import(())
    rows: list[list[str]] = []

    def add(phase: str, measured: dict[str, tuple[float, float]]) -> None:
        for name, (rss, cpu) in measured.items():
            rows.append([name, phase, f"{rss:.1f}", f"{rss / floor_rss:.1f}", f"{cpu:.3f}"])

    async with bench_api(env["KUBECONFIG"]) as api:
        await prepare_namespace(api)
        with tempfile.TemporaryDirectory(prefix="akf", dir="/tmp") as tmp:
            root = Path(tmp)
            handler_env = {**os.environ, "DEBUG_ECHO_AVAILABILITY": str(root / "avail")}
            kubelet = KubeletStandin(root / "dp").start()
            try:
                async with AsyncExitStack() as stack:
                    procs = {
                        "agent": await stack.enter_async_context(
                            agent_process(
                                root,
                                env["KUBECONFIG"],
                                NODE,
                                *args.agent_flags,
                                count_requests=False,
                            )
                        ),
                        "controller (bench namespace)": await stack.enter_async_context(
                            child_process(
                                controller_command(env["KUBECONFIG"]), root / "controller.log"
                            )
                        ),
                        "webhook": await stack.enter_async_context(
                            child_process(
                                webhook_command(root, env["KUBECONFIG"]), root / "webhook.log"
                            )
                        ),
                        "discovery-handler debugEcho": await stack.enter_async_context(
                            child_process(handler_command(root), root / "handler.log", handler_env)
                        ),
                    }
                    await trio.sleep(args.settle)
                    for name, proc in procs.items():
                        if proc.returncode is not None:
                            raise SystemExit(f"{name} exited ({proc.returncode}); logs: {root}")
                    add("no Configuration", await measure(api, procs, args.idle))
                    if args.devices:
                        await with_devices(api, kubelet, args.devices, args.limit)
                        await trio.sleep(args.settle)
                        busy = {k: v for k, v in procs.items() if k.startswith(("agent", "contr"))}
                        add(f"{args.devices} devices, settled", await measure(api, busy, args.idle))
            finally:
                kubelet.stop()
                await purge_namespace(api)
    headers = ["process", "phase", "RSS MB", "x floor RSS", f"idle CPU % ({args.idle:.0f} s)"]
    return table(headers, rows)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__)
    p.add_argument("--repeat", type=int, default=5, help="fresh interpreters per import time")
    p.add_argument("--settle", type=float, default=10.0, help="seconds before RSS is read")
    p.add_argument("--idle", type=float, default=60.0, help="the idle CPU window")
    p.add_argument("--devices", type=int, default=200, help="then this many debugEcho devices")
    p.add_argument("--limit", type=float, default=120.0, help="seconds the devices may take")
    p.add_argument(
        "--agent-flags",
        type=str.split,
        default=[],
        help='more agent flags, one string (e.g. "--kubelet-poll-period 0.2")',
    )
    p.add_argument("--no-cluster", action="store_true", help="the import table only")
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args()
    parts = [imports_table(args.repeat)]
    print(parts[0], flush=True)
    if not args.no_cluster:
        parts.append(trio.run(processes_table, args))
        print(parts[1], flush=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    flags = f"; agent flags: `{' '.join(args.agent_flags)}`" if args.agent_flags else ""
    text = f"### footprint {stamp} ({machine()}{flags})\n\n" + "\n\n".join(parts)
    if not args.no_write:
        write_run("footprint", text)


if __name__ == "__main__":
    main()
