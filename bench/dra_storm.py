"""Claim storms: N Pods on N nodes asking at once for a slot of one shared device, in DRA mode
against device-plugin mode, in the same run.

    .venv/bin/python -m bench.dra_storm [N ...] [--solo 5] [--limit 300] [--no-record]
        [--limits 50/100 500/1000] [--repeat 1] [--no-device-plugin]

(default N: 10 25 50). For each N, `--repeat` times: DRA mode once per scheduler setting of
`--limits`, then device-plugin mode:

DRA mode (no kubelet needed: the scheduler allocates, and the kubelet's part, preparing a claim,
is one node's own work whatever N is; `bench.dra pods` measures it on the real node). N Node
objects of the bench's own (Ready, Leases renewed, tainted so no other Pod lands there; the API
server and the scheduler cannot tell them from real ones), one shared Instance that names them
all, written as their agents would (capacity N), and the controller in DRA mode as its own
process, which publishes the Instance's pool (one device with N slots of consumable capacity, on
a node selector of the N nodes) and its DeviceClasses. Each Pod asks for `akri.sh/<instance>: 1`
in its limits, the Pod spec of device-plugin mode unchanged, and is pinned to its node. Its
scheduler is the bench's own (`bench._scheduler`: the cluster's is shared and its metrics closed),
with the client's `qps/burst` of that run; each phase also reports what it cost that scheduler
(time in each extension point, waits in its client's rate limiter, its writes), and the storm
its FailedScheduling messages.
Measured: seconds from the create to the Pod bound to its node (the scheduler binds only after
it has written the claim's allocation), for one Pod alone (`--solo` times, one after another)
and for the N created at once; the floor: the same N Pods without a device, created at once
(what binding any N Pods at once costs); the Pod and claim writes per Pod (every
ADDED/MODIFIED the namespace's watch delivered for them); claims allocated, and double
allocations (more claims on the device than its capacity).

Device-plugin mode: `bench.fleet`'s storm at the same N: N agents as processes, each with its
kubelet stand-in, share two debugEcho devices (capacity N); one node alone claims a slot of one
device `SOLO_SAMPLES` times, then every node claims a slot of the other at the same moment
(GetPreferredAllocation then Allocate). Measured: the Allocate latencies, the Instance writes
the agents sent (each claim is a version-tested patch of the one Instance: N at best, more
when races are lost), and double claims.

The target (issue 24): DRA mode's p50 at N=50 at most 2x its one Pod alone; 0 double
allocations in either mode.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path

import attrs
import httpx
import trio

from akri_trio import dra
from akri_trio.kube import JSON, Client, NotFound, open_watch
from akri_trio.kube.events import EVENTS
from akri_trio.kube.watch import Apply, InitApply
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
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
from bench._scheduler import DEFAULT_LIMITS, SCHEDULER_NAME, Cost, Limits, own_scheduler, since
from bench.dra import controller_process
from bench.fleet import CONFIG as FLEET_CONFIG
from bench.fleet import FLEET_NS, WRITE_VERBS, Fleet, answered, purge_after
from tests.controller.support import NO_KUBELET_TAINT, PODS, schedulable_nodes
from tests.support.kubectl import busybox_pod

STORM_NS = "akri-bench-dra-storm"
CONFIG = "dra-storm"
DEVICE = "shared-camera"
FAKE_NODE_PREFIX = "ctl-test-node"  # tests.controller.support.fake_nodes names them so


@attrs.frozen
class Row:
    mode: str
    n: int
    alone: list[float]
    storm: list[float]
    writes_per_claim: float
    granted: int
    doubles: int
    floor: list[float] | None = None  # the same N Pods at once without a device
    costs: dict[str, Cost] = attrs.Factory(dict)  # what each phase cost the bench's scheduler
    # the storm's refusals: DRA, FailedScheduling messages; device-plugin, Allocate's errors
    refusals: Counter[str] = attrs.Factory(Counter)

    def cells(self) -> list[str]:
        alone, p50 = percentile(self.alone, 50), percentile(self.storm, 50)
        return [
            self.mode, str(self.n), f"{alone:.3f}", f"{p50:.3f}",
            f"{percentile(self.storm, 99):.3f}", f"{p50 / alone:.2f}",
            f"{self.writes_per_claim:.2f}", f"{self.granted}/{self.n}", str(self.doubles),
            f"{percentile(self.floor, 50):.3f}" if self.floor else "-",
        ]  # fmt: skip


HEADER = [
    "mode", "N", "one alone p50 s", "storm p50 s", "storm p99 s", "p50 / alone",
    "writes per claim", "granted", "double", "no-device storm p50 s",
]  # fmt: skip


# --- DRA mode ---------------------------------------------------------------------------------


async def until(check: Callable[[], Awaitable[bool]], limit_s: float, what: str) -> None:
    """Poll `check` until true; an API server away for a moment (another session restarting
    it on the shared cluster) is one more poll, not the end of the run."""
    try:
        with trio.fail_after(limit_s):
            while True:
                with suppress(httpx.TransportError):
                    if await check():
                        return
                await trio.sleep(0.2)
    except trio.TooSlowError:
        raise RuntimeError(f"not within {limit_s} s: {what}") from None


def shared_instance(name: str, nodes: Sequence[str]) -> JSON:
    """The Instance the nodes' agents would have written for one shared device."""
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": name, "namespace": STORM_NS},
        "spec": {
            "configurationName": CONFIG,
            "cdiName": naming.cdi_name(CONFIG, name.rsplit("-", 1)[-1]),
            "capacity": len(nodes),
            "nodes": list(nodes),
            "shared": True,
            "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": DEVICE},
        },
    }


def device_pod(name: str, node: str, instance: str | None) -> JSON:
    """A Pod pinned to `node` asking for one slot of `instance` (None: no device)."""
    limits = {naming.resource_name(instance): 1} if instance else None
    pod = busybox_pod(name, STORM_NS, "sleep 3600", limits=limits)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    pod["spec"]["tolerations"] = [{**NO_KUBELET_TAINT, "operator": "Exists"}] + [
        {"key": f"node.kubernetes.io/{k}", "operator": "Exists"}
        for k in ("not-ready", "unreachable")
    ]
    return pod


class Bindings:
    """The namespace's Pods and claims as the watch delivers them: when each Pod was first seen
    bound to a node, and how many writes of Pods and claims arrived."""

    def __init__(self) -> None:
        self.bound_at: dict[str, float] = {}
        self.writes: Counter[str] = Counter()
        self.changed = trio.Event()

    async def run(self, api: Client, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._pods, api)
            await nursery.start(self._claims, api)
            task_status.started()

    async def _pods(self, api: Client, task_status: trio.TaskStatus[None]) -> None:
        async with open_watch(api, PODS, namespace=STORM_NS) as events:
            task_status.started()
            async for event in events:
                if isinstance(event, Apply | InitApply):
                    self.writes["pods"] += 1
                    name = event.obj["metadata"]["name"]
                    if event.obj["spec"].get("nodeName") and name not in self.bound_at:
                        self.bound_at[name] = time.monotonic()
                        self.changed.set()
                        self.changed = trio.Event()

    async def _claims(self, api: Client, task_status: trio.TaskStatus[None]) -> None:
        async with open_watch(api, dra.RESOURCE_CLAIMS, namespace=STORM_NS) as events:
            task_status.started()
            async for event in events:
                if isinstance(event, Apply | InitApply):
                    self.writes["claims"] += 1

    async def wait_bound(self, names: Sequence[str], limit_s: float) -> None:
        with trio.fail_after(limit_s):
            while not set(names) <= self.bound_at.keys():
                await self.changed.wait()


async def delete_pods(api: Client, names: Sequence[str]) -> None:
    for name in names:
        with suppress(NotFound):
            await api.delete(PODS, name, namespace=STORM_NS, grace_period_seconds=0)

    async def gone() -> bool:
        pods = {p["metadata"]["name"] for p in (await api.list(PODS, namespace=STORM_NS)).items}
        claims = (await api.list(dra.RESOURCE_CLAIMS, namespace=STORM_NS)).items
        return not pods & set(names) and not claims

    await until(gone, 120, f"{len(names)} Pods and their claims gone")


async def launch(
    api: Client, bindings: Bindings, pods: Sequence[JSON], limit_s: float
) -> list[float]:
    """Create `pods` at once; seconds from the first create to each one bound."""
    t0 = time.monotonic()
    async with trio.open_nursery() as nursery:
        for pod in pods:
            nursery.start_soon(api.create, PODS, pod)
    names = [p["metadata"]["name"] for p in pods]
    await bindings.wait_bound(names, limit_s)
    return [bindings.bound_at[name] - t0 for name in names]


async def pool_slices(api: Client, instance: str) -> list[JSON]:
    pool = dra.shared_pool(STORM_NS, instance)
    slices = (await api.list(dra.RESOURCE_SLICES)).items
    return [s for s in slices if s["spec"]["pool"]["name"] == pool]


async def no_pool(api: Client, instance: str) -> bool:
    return not await pool_slices(api, instance)


def allocations(claims: Sequence[JSON]) -> Counter[str]:
    """How many claims each device (`<pool>/<device>`) is allocated to."""
    held: Counter[str] = Counter()
    for claim in claims:
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []:
            held[f"{result['pool']}/{result['device']}"] += 1
    return held


async def dra_mode(
    api: Client, env: dict[str, str], n: int, limits: Limits, args: argparse.Namespace
) -> Row:
    await prepare_namespace(api, STORM_NS)
    instance = naming.instance_name(CONFIG, naming.device_hash(DEVICE, None))
    config = echo_config(CONFIG, [DEVICE], n)
    config["metadata"]["namespace"] = STORM_NS
    bindings = Bindings()
    with tempfile.TemporaryDirectory(prefix="akds", dir="/tmp") as tmp:
        async with (
            schedulable_nodes(api, n) as nodes,
            controller_process(env["KUBECONFIG"], STORM_NS, Path(tmp) / "controller.log"),
            own_scheduler(env["AKRI_TRIO_K8S_VERSION"], limits, Path(tmp)) as scheduler,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(bindings.run, api)
            await api.create(CONFIGURATIONS, config)
            await api.create(INSTANCES, shared_instance(instance, nodes))

            async def published() -> bool:
                """The pool selects exactly these nodes (not a pool an earlier run left for its
                own nodes) and the Instance's class exists."""
                selectors = [
                    json.dumps(s["spec"].get("nodeSelector"))
                    for s in await pool_slices(api, instance)
                    if s["spec"].get("devices")
                ]
                classes = {
                    c["metadata"]["name"] for c in (await api.list(dra.DEVICE_CLASSES)).items
                }
                return (
                    len(selectors) == 1
                    and all(f'"{node}"' in selectors[0] for node in nodes)
                    and selectors[0].count(f'"{FAKE_NODE_PREFIX}') == n
                    and dra.instance_class_name(instance, STORM_NS) in classes
                )

            await until(published, 60, "the controller's pool of these nodes and its classes")
            try:
                costs: dict[str, Cost] = {}

                async def phase(name: str, batches: Sequence[Sequence[JSON]]) -> list[float]:
                    """Each batch of Pods created at once and bound, the next after it; what that
                    cost the scheduler. The Pods of every batch but the last are deleted."""
                    before = await scheduler.metrics()
                    seconds: list[float] = []
                    for i, batch in enumerate(batches):
                        seconds += await launch(api, bindings, batch, args.limit)
                        if i < len(batches) - 1:
                            await delete_pods(api, [p["metadata"]["name"] for p in batch])
                    await trio.sleep(1)  # the last status writes and events of the phase
                    costs[name] = Cost.of(len(seconds), since(before, await scheduler.metrics()))
                    return seconds

                alone_pods = [
                    device_pod(f"alone-{i}", nodes[i % n], instance) for i in range(args.solo)
                ]
                alone = await phase("alone", [[pod] for pod in alone_pods])
                await delete_pods(api, [alone_pods[-1]["metadata"]["name"]])
                plain = [device_pod(f"plain-{i:03d}", node, None) for i, node in enumerate(nodes)]
                floor = await phase("no device", [plain])
                await delete_pods(api, [p["metadata"]["name"] for p in plain])
                writes0 = sum(bindings.writes.values())
                pods = [
                    device_pod(f"storm-{i:03d}", node, instance) for i, node in enumerate(nodes)
                ]
                storm = await phase("storm", [pods])
                writes = sum(bindings.writes.values()) - writes0
                claims = (await api.list(dra.RESOURCE_CLAIMS, namespace=STORM_NS)).items
                # this run's storm Pods (events of an earlier run's namesakes may still be there)
                uids = {
                    p["metadata"]["uid"]
                    for p in (await api.list(PODS, namespace=STORM_NS)).items
                    if p["metadata"]["name"].startswith("storm-")
                }
                refusals = Counter(
                    e.get("message", "")
                    for e in (await api.list(EVENTS, namespace=STORM_NS)).items
                    if e.get("reason") == "FailedScheduling" and e["involvedObject"]["uid"] in uids
                )
                held = allocations(claims)
                # consumable capacity: one device for n claims; else n devices, one claim each
                whole = f"{dra.shared_pool(STORM_NS, instance)}/{dra.device_name(instance)}"
                granted = sum(held.values())
                doubles = sum(max(0, k - (n if d == whole else 1)) for d, k in held.items())
            finally:
                # After a failed run too: its Pods would stay Pending once the bench's scheduler
                # is gone. While the controller runs, so that it deletes the pool (the next
                # run's is new).
                with trio.move_on_after(240, shield=True):
                    left = (await api.list(PODS, namespace=STORM_NS)).items
                    await delete_pods(api, [p["metadata"]["name"] for p in left])
                    await purge_namespace(api, STORM_NS)
                    await until(
                        lambda: no_pool(api, instance), 60, "the pool gone with its Instance"
                    )
            nursery.cancel_scope.cancel()
    return Row(
        f"dra {limits}", n, alone, storm, writes / n, granted, doubles, floor, costs, refusals
    )


# --- device-plugin mode -----------------------------------------------------------------------


async def device_plugin_mode(api: Client, kubeconfig: str, n: int, limit_s: float) -> Row:
    await prepare_namespace(api, FLEET_NS)
    with tempfile.TemporaryDirectory(prefix="akdp", dir="/tmp") as tmp:
        fleet = Fleet(api, Path(tmp), n)
        async with fleet.running(kubeconfig):
            body = echo_config(FLEET_CONFIG, ["d0", "d1"], n)
            body["metadata"]["namespace"] = FLEET_NS
            await api.create(CONFIGURATIONS, body)

            async def every_node() -> bool:
                per = await fleet.nodes_per_instance()
                return len(per) == 2 and all(k == n for k in per)

            await until(every_node, limit_s, "both Instances on every node")
            items = sorted(
                (await api.list(INSTANCES, namespace=FLEET_NS)).items,
                key=lambda o: o["metadata"]["name"],
            )
            storm_res, solo_res = (naming.resource_name(o["metadata"]["name"]) for o in items)
            alone = await fleet.alone(solo_res, storm_res)
            sent0 = fleet.requests()
            results = await fleet.storm(storm_res)
            await trio.sleep(1)
            writes = answered(fleet.requests() - sent0, WRITE_VERBS, {"instances"})
    await purge_after(cluster_env())
    granted = [r for r in results if r[2] is None]
    doubles = len(granted) - len({slot for slot, _, _ in granted})
    refusals = Counter(error for _, _, error in results if error)
    latencies = [r[1] for r in results]
    return Row(
        "device-plugin", n, alone, latencies, writes / n, len(granted), doubles, refusals=refusals
    )


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    rows: list[Row] = []
    async with bench_api(env["KUBECONFIG"]) as api:
        for n in args.nodes:
            for _ in range(args.repeat):
                for limits in args.limits:
                    rows.append(await dra_mode(api, env, n, Limits.parse(limits), args))
                    print("  " + " | ".join(rows[-1].cells()), flush=True)
                if args.device_plugin:
                    rows.append(await device_plugin_mode(api, env["KUBECONFIG"], n, args.limit))
                    print("  " + " | ".join(rows[-1].cells()), flush=True)
    costs = [
        f"- {r.mode}, N={r.n}, {phase} ({cost.pods} Pods): {cost.line()}"
        for r in rows
        for phase, cost in r.costs.items()
    ] + [
        f"- {r.mode}, N={r.n}, storm refused {k}x: {message}"
        for r in rows
        for message, k in r.refusals.items()
    ]
    return "\n".join(
        [
            f"### dra_storm N={','.join(map(str, args.nodes))} ({now()}, {machine()})",
            "",
            table(HEADER, [r.cells() for r in rows]),
            "",
            "Seconds: DRA, Pod created -> bound (claim allocated) by the bench's kube-scheduler "
            "(its client's qps/burst in the mode column); device-plugin, one Allocate "
            "(preferred + Allocate, the claim written). Writes per claim: DRA, Pod and claim "
            "writes; device-plugin, Instance writes the agents sent.",
            "",
            "The bench's scheduler, from its metrics (each phase's gain; seconds summed over "
            "its Pods' attempts, shown per Pod):",
            "",
            *costs,
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("nodes", type=int, nargs="*", default=[10, 25, 50])
    p.add_argument("--solo", type=int, default=5, help="Pods alone, one after another")
    p.add_argument("--limit", type=float, default=300.0, help="bound on each wait, s")
    p.add_argument(
        "--limits",
        nargs="+",
        default=[DEFAULT_LIMITS, "500/1000"],
        help="the bench's scheduler's client qps/burst, one DRA run each",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs of each N")
    p.add_argument(
        "--no-device-plugin",
        dest="device_plugin",
        action="store_false",
        help="DRA mode only (device-plugin mode does not use the scheduler)",
    )
    p.add_argument("--no-record", action="store_true", help="print, do not append to RESULTS.md")
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    record_run("dra_storm", report, write=not args.no_record)


if __name__ == "__main__":
    main()
