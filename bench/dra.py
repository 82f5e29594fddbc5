"""DRA mode against device-plugin mode: a Pod's start with one Akri device, and what a shared
device's changes cost when the controller publishes its pool.

    .venv/bin/python -m bench.dra pods [--samples 10] [--no-record]
    .venv/bin/python -m bench.dra fleet N [--devices 1] [--limit 300] [--no-record]

`pods` (needs the cluster's node: `cluster up --node`): Pod created -> Running with one Akri
device, on the real kubelet, scheduler and containerd. The agent runs as its own process
(`bench._agent_proc`: the agent CLI with debugEcho as `benchEcho`, watching only
`akri-bench-dra`), first in device-plugin mode (the Pod asks for `akri.sh/<instance>: 1` in
its limits), then in DRA mode with the controller in DRA mode (the Pod references a
ResourceClaimTemplate selecting the Instance by CEL; kube-controller-manager makes the claim, the
scheduler allocates it, the kubelet prepares it through the agent's plugin and CDI). The floor is
the same busybox Pod with no device, created and measured interleaved with the device Pods
(floor, device, floor, ...) so load on this shared machine hits both alike; each mode's ratio
is its p50 over its own floor's p50. One warm-up Pod per mode is not counted (the first start
after an agent starts waits for its plugin's registration). A node has one kubelet plugin per
DRA driver: run it while no other `akri-trio agent --allocation dra` serves this node.

`fleet` (no node needed): N agent processes in DRA mode (no kubelet behind them: their
plugins wait for one) share M debugEcho devices; the controller runs in DRA mode and publishes
one pool per shared Instance. Phases: create (until every pool selects all N nodes), one off
(node 0 loses the devices), one on, all off (every node loses them: until no Instance and no
slice is left). Per phase: seconds, the Instance changes (watch events in the namespace: the
agents' writes that changed an Instance; bench.fleet counts what the agents send), the
controller's own ResourceSlice writes (its `akri_controller_writes_total`), and the ideal slice
writes: one per pool per change the
pool's readers can see, N*M at most for create and all off (every node's join or leave one at a
time; the controller's per-pool queue folds the ones that come while a write is in flight).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import trio

from akri_trio import dra
from akri_trio.controller.reconcilers import NODES, PODS
from akri_trio.kube import JSON, Apply, Client, Delete, NotFound, open_watch
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from bench._agent_proc import agent_process, child_process
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
from tests.support.kubectl import busybox_pod, free_port

PODS_NS = "akri-bench-dra"
FLEET_NS = "akri-bench-dra-fleet"
CONFIG = "dra-bench"
TEMPLATE = "dra-bench-claim"
WRITE_VERBS = {"APPLY", "PATCH", "POST", "PUT", "CREATE", "UPDATE", "DELETE"}


def in_namespace(body: JSON, namespace: str) -> JSON:
    body["metadata"]["namespace"] = namespace
    return body


@asynccontextmanager
async def controller_process(
    kubeconfig: str, namespace: str, log: Path, metrics_port: int = -1
) -> AsyncIterator[trio.Process]:
    """`akri-trio controller --allocation dra` scoped to `namespace`; SIGTERM on exit."""
    cmd = [
        sys.executable, "-m", "akri_trio", "controller",
        "--kubeconfig", kubeconfig,
        "--allocation", "dra",
        "--namespace", namespace,
        "--no-leader-elect",
        "--metrics-port", str(metrics_port),
        "--log-level", "WARNING",
    ]  # fmt: skip
    async with child_process(cmd, log) as proc:
        yield proc


async def wait_for(check: Callable[[], Awaitable[Any]], limit_s: float, what: str) -> float:
    """Seconds until `check()` is truthy (polled every 0.1 s)."""
    t0 = time.monotonic()
    try:
        with trio.fail_after(limit_s):
            while not await check():  # noqa: ASYNC110 (polls the API server)
                await trio.sleep(0.1)
    except trio.TooSlowError:
        raise RuntimeError(f"not within {limit_s} s: {what}") from None
    return time.monotonic() - t0


# --- pods ------------------------------------------------------------------------------------


async def start_pod(api: Client, body: JSON, limit_s: float = 120) -> float:
    """Seconds from the create to the Pod's phase Running (polled every 50 ms)."""
    meta = body["metadata"]
    t0 = time.monotonic()
    await api.create(PODS, body)
    with trio.fail_after(limit_s):
        while True:
            obj = await api.get(PODS, meta["name"], namespace=meta["namespace"])
            phase = (obj.get("status") or {}).get("phase")
            if phase == "Running":
                return time.monotonic() - t0
            if phase in ("Failed", "Succeeded"):
                raise RuntimeError(f"pod {meta['name']} {phase}")
            await trio.sleep(0.05)


async def delete_pods(api: Client, namespace: str, names: Sequence[str]) -> None:
    for name in names:
        with suppress(NotFound):
            await api.delete(PODS, name, namespace=namespace, grace_period_seconds=0)

    async def gone() -> bool:
        items = (await api.list(PODS, namespace=namespace)).items
        return not {p["metadata"]["name"] for p in items} & set(names)

    await wait_for(gone, 120, f"pods {names} gone")


SCRIPT = "sleep 3600"


def floor_pod(i: int) -> JSON:
    return busybox_pod(f"floor-{i}", PODS_NS, SCRIPT)


def plugin_pod(instance: str, i: int) -> JSON:
    return busybox_pod(f"dp-{i}", PODS_NS, SCRIPT, limits={naming.resource_name(instance): 1})


def claim_pod(i: int) -> JSON:
    pod = busybox_pod(f"dra-{i}", PODS_NS, SCRIPT)
    pod["spec"]["resourceClaims"] = [{"name": "akri", "resourceClaimTemplateName": TEMPLATE}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "akri"}]}
    return pod


async def measure(
    api: Client, samples: int, device_pod: Callable[[int], JSON]
) -> tuple[list[float], list[float]]:
    """(floor seconds, device seconds), interleaved, after one uncounted warm-up each."""
    floors: list[float] = []
    devices: list[float] = []
    for i in range(-1, samples):
        floor = floor_pod(i + 1000 if i < 0 else i)
        device = device_pod(i + 1000 if i < 0 else i)
        try:
            f = await start_pod(api, floor)
            d = await start_pod(api, device)
        finally:
            with trio.CancelScope(shield=True):
                pods = [floor["metadata"]["name"], device["metadata"]["name"]]
                await delete_pods(api, PODS_NS, pods)
        if i >= 0:
            floors.append(f)
            devices.append(d)
    return floors, devices


async def bench_pods(args: argparse.Namespace) -> str:
    env = cluster_env()
    node = env["AKRI_TRIO_NODE_NAME"]
    kubeconfig = env["KUBECONFIG"]
    instance = naming.instance_name(CONFIG, naming.device_hash("p0", node))
    config = in_namespace(echo_config(CONFIG, ["p0"], args.samples + 2), PODS_NS)
    rows: list[list[str]] = []
    async with bench_api(kubeconfig) as api:
        await prepare_namespace(api, PODS_NS)
        with tempfile.TemporaryDirectory(prefix="akd", dir="/tmp") as tmp:
            root = Path(tmp)
            for mode in ("device-plugin", "dra"):
                home = root / mode
                home.mkdir()
                (home / "avail").write_text("")
                async with AsyncExitStack() as stack:
                    if mode == "device-plugin":
                        extra = [
                            "--device-plugin-dir", env["AKRI_TRIO_DEVICE_PLUGIN_DIR"],
                            "--pod-resources-socket", env["AKRI_TRIO_POD_RESOURCES_SOCKET"],
                        ]  # fmt: skip
                    else:
                        extra = [
                            "--allocation", "dra",
                            "--kubelet-root-dir", env["AKRI_TRIO_KUBELET_ROOT_DIR"],
                            "--cdi-dir", env["AKRI_TRIO_CDI_DIR"],
                            "--log-level", "INFO",  # to see the kubelet's registration
                        ]  # fmt: skip
                        await stack.enter_async_context(
                            controller_process(kubeconfig, PODS_NS, home / "controller.log")
                        )
                    await stack.enter_async_context(
                        agent_process(home, kubeconfig, node, "--namespace", PODS_NS, *extra)
                    )
                    await api.create(CONFIGURATIONS, config)
                    make: Callable[[int], JSON]
                    if mode == "device-plugin":
                        make = functools.partial(plugin_pod, instance)
                        await wait_for(
                            lambda: _allocatable(api, node, naming.resource_name(instance)),
                            60,
                            "the device plugin's resource on the node",
                        )
                    else:
                        await api.apply(
                            dra.RESOURCE_CLAIM_TEMPLATES,
                            {
                                "apiVersion": "resource.k8s.io/v1",
                                "kind": "ResourceClaimTemplate",
                                "metadata": {"name": TEMPLATE, "namespace": PODS_NS},
                                "spec": {"spec": dra.claim_spec(CONFIG, PODS_NS, instance)},
                            },
                            field_manager="akri-trio-bench",
                            force=True,
                        )
                        make = claim_pod
                        await wait_for(
                            lambda: _device_class(api), 60, "the controller's DeviceClass"
                        )
                        await wait_for(
                            functools.partial(_registered, home / "agent.log"),
                            60,
                            "the kubelet's registration of the agent's DRA plugin",
                        )
                    floors, devices = await measure(api, args.samples, make)
                    await api.delete(CONFIGURATIONS, CONFIG, namespace=PODS_NS)
                    if mode == "dra":
                        await api.delete(dra.RESOURCE_CLAIM_TEMPLATES, TEMPLATE, namespace=PODS_NS)
                        await wait_for(
                            lambda: _device_class(api, present=False), 60, "the DeviceClass gone"
                        )
                    await wait_for(lambda: _no_instances(api, PODS_NS), 60, "Instances gone")
                p50f, p50d = percentile(floors, 50), percentile(devices, 50)
                rows.append(
                    [
                        mode, str(len(devices)), f"{p50f:.2f}", f"{percentile(floors, 90):.2f}",
                        f"{p50d:.2f}", f"{percentile(devices, 90):.2f}", f"{p50d / p50f:.2f}",
                    ]
                )  # fmt: skip
                print("  " + " | ".join(rows[-1]), flush=True)
        await purge_namespace(api, PODS_NS)
    header = [
        "mode", "n", "floor p50 s", "floor p90 s", "device Pod p50 s", "device Pod p90 s",
        "ratio p50",
    ]  # fmt: skip
    dp, dr = (float(r[4]) for r in rows)
    return "\n".join(
        [
            f"### Pod created -> Running with one Akri device, N={args.samples} ({now()}, "
            f"{machine()})",
            "",
            table(header, rows),
            "",
            f"- DRA over device-plugin, p50: {dr / dp:.2f}",
            "",
        ]
    )


async def _allocatable(api: Client, node: str, resource: str) -> bool:
    obj = await api.get(NODES, node)
    return int((obj.get("status") or {}).get("allocatable", {}).get(resource, "0")) > 0


async def _device_class(api: Client, namespace: str = PODS_NS, *, present: bool = True) -> bool:
    """Whether the Configuration's DeviceClass is there (`present`), or gone."""
    try:
        await api.get(dra.DEVICE_CLASSES, dra.device_class_name(CONFIG, namespace))
    except NotFound:
        return not present
    return present


async def _registered(log: Path) -> bool:
    return f"the kubelet registered DRA driver {dra.DRIVER}" in await trio.Path(log).read_text()


async def _no_instances(api: Client, namespace: str) -> bool:
    return not (await api.list(INSTANCES, namespace=namespace)).items


# --- fleet -----------------------------------------------------------------------------------


class InstanceChanges:
    """Counts the namespace's Instance changes (watch events after the first list): exactly
    the writes that changed an Instance, whatever else the shared cluster is doing."""

    def __init__(self) -> None:
        self.count = 0

    async def run(self, api: Client, *, task_status: trio.TaskStatus[None]) -> None:
        async with open_watch(api, INSTANCES, namespace=FLEET_NS) as events:
            task_status.started()
            async for event in events:
                if isinstance(event, Apply | Delete):
                    self.count += 1


async def slice_writes(port: int) -> int:
    """The controller's own ResourceSlice writes (akri_controller_writes_total)."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("akri_controller_writes_total{") and 'kind="ResourceSlice"' in line
    )


async def shared_slices(api: Client) -> list[JSON]:
    selector = f"{dra.LABEL_POOL_KIND}=shared,{dra.LABEL_NAMESPACE}={FLEET_NS}"
    return (await api.list(dra.RESOURCE_SLICES, label_selector=selector)).items


def selected(slice_: JSON) -> int:
    terms = slice_["spec"]["nodeSelector"]["nodeSelectorTerms"]
    return len(terms[0]["matchExpressions"][0]["values"])


async def bench_fleet(args: argparse.Namespace) -> str:
    env = cluster_env()
    kubeconfig = env["KUBECONFIG"]
    n, m = args.nodes, args.devices
    async with bench_api(kubeconfig) as api:
        await prepare_namespace(api, FLEET_NS)
        changes = InstanceChanges()
        async with trio.open_nursery() as watching:
            await watching.start(changes.run, api)
            rows = await _fleet_phases(api, args, kubeconfig, changes)
            watching.cancel_scope.cancel()
        await purge_namespace(api, FLEET_NS)
    header = [
        "phase", "s", "Instance changes", "slice writes (controller)", "ideal slice writes",
        "slice writes / Instance change",
    ]  # fmt: skip
    return "\n".join(
        [
            f"### DRA fleet N={n} M={m} ({now()}, {machine()})",
            "",
            table(header, rows),
            "",
        ]
    )


async def _fleet_phases(
    api: Client, args: argparse.Namespace, kubeconfig: str, changes: InstanceChanges
) -> list[list[str]]:
    n, m = args.nodes, args.devices
    names = [f"dra-fleet-{i:03d}" for i in range(n)]
    port = free_port()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="akdf", dir="/tmp") as tmp:
        root = Path(tmp)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(
                controller_process(kubeconfig, FLEET_NS, root / "controller.log", port)
            )
            for name in names:
                home = root / name
                (home / "kubelet" / "plugins_registry").mkdir(parents=True)
                (home / "avail").write_text("")
                await stack.enter_async_context(
                    agent_process(
                        home, kubeconfig, name,
                        "--namespace", FLEET_NS,
                        "--debug-echo-shared",
                        "--allocation", "dra",
                        "--kubelet-root-dir", str(home / "kubelet"),
                        "--cdi-dir", str(home / "cdi"),
                    )
                )  # fmt: skip
            await trio.sleep(5 + n / 10)  # every agent and the controller listed

            async def serving() -> bool:
                try:
                    await slice_writes(port)
                except httpx.HTTPError:
                    return False
                return True

            await wait_for(serving, 60, "the controller's metrics")

            async def pools_select(k: int) -> bool:
                per = [len(i["spec"].get("nodes") or []) for i in await _instances(api)]
                slices = await shared_slices(api)
                return (
                    len(per) == m
                    and all(x == k for x in per)
                    and len(slices) == m
                    and all(selected(s) == k for s in slices)
                )

            async def nothing_left() -> bool:
                return not await _instances(api) and not await shared_slices(api)

            async def phase(
                name: str,
                ideal: str,
                act: Callable[[], Awaitable[object]],
                done: Callable[[], Awaitable[bool]],
            ) -> None:
                i0, s0 = changes.count, await slice_writes(port)
                t0 = time.monotonic()
                await act()
                took = time.monotonic() - t0 + await wait_for(done, args.limit, name)
                await trio.sleep(1)  # late writes of this phase still count here
                i1, s1 = changes.count, await slice_writes(port)
                per = (s1 - s0) / (i1 - i0) if i1 > i0 else float("nan")
                rows.append([name, f"{took:.1f}", str(i1 - i0), str(s1 - s0), ideal, f"{per:.2f}"])
                print("  " + " | ".join(rows[-1]), flush=True)

            async def set_avail(nodes: range, text: str) -> None:
                for i in nodes:
                    (root / names[i] / "avail").write_text(text)

            config = in_namespace(echo_config(CONFIG, [f"d{j}" for j in range(m)], n), FLEET_NS)
            await phase(
                "create",
                f"<= {n * m}",
                lambda: api.create(CONFIGURATIONS, config),
                lambda: pools_select(n),
            )
            await phase(
                "one off", str(m), lambda: set_avail(range(1), "OFFLINE"),
                lambda: pools_select(n - 1),
            )  # fmt: skip
            await phase("one on", str(m), lambda: set_avail(range(1), ""), lambda: pools_select(n))
            await phase(
                "all off", f"<= {n * m}", lambda: set_avail(range(n), "OFFLINE"),
                nothing_left,
            )  # fmt: skip
            # While the controller runs: it deletes the Configuration's DeviceClass.
            await api.delete(CONFIGURATIONS, CONFIG, namespace=FLEET_NS)
            await wait_for(
                lambda: _device_class(api, FLEET_NS, present=False), 60, "the DeviceClass gone"
            )
    return rows


async def _instances(api: Client) -> list[JSON]:
    return (await api.list(INSTANCES, namespace=FLEET_NS)).items


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="bench", required=True)
    pods = sub.add_parser("pods", help="Pod created -> Running, DRA vs device-plugin")
    pods.add_argument("--samples", type=int, default=10)
    fleet = sub.add_parser("fleet", help="a shared device's changes from N nodes, DRA mode")
    fleet.add_argument("nodes", type=int)
    fleet.add_argument("--devices", type=int, default=1)
    fleet.add_argument("--limit", type=float, default=300.0, help="bound on each phase, s")
    for parser in (pods, fleet):
        parser.add_argument("--no-record", action="store_true", help="print only")
    args = p.parse_args()
    if args.bench == "pods":
        report = trio.run(bench_pods, args)
        name = "dra_pods"
    else:
        report = trio.run(bench_fleet, args)
        name = "dra_fleet"
    print(report)
    record_run(name, report, write=not args.no_record)


if __name__ == "__main__":
    main()
