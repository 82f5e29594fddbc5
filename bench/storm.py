"""Writes of many nodes on shared Instances: at once, against in turn — what contention costs.

    .venv/bin/python -m bench.storm [N] [--devices 10] [--rounds 2] [--no-joins] [--no-write]

Sent by this process, as the agents send them, with no agent in between, in the namespace
`akri-storm`:
- claims: one Instance that N nodes share (N membership applies), then N claims of one slot
  each, per round: a server-side apply of the key without force (field manager `dp-<node>`),
  all at once (the agents' claim before); the agents' claim now, all at once: a merge patch
  that names the resourceVersion seen as its precondition (`claims.usage_patch`), after a lost
  race `claims.retry_pause` (sized from a watch of the Instance) and a read; the same with a
  pause doubling per try from 10 ms; the apply one node after another (no contention: the
  floor). The slots are freed between rounds;
- joins: N nodes join M new shared Instances (one apply per node and Instance, field manager
  `<node>`), every node at once: each node 8 writes at a time in name order (what the agents
  did before), then one at a time from the node's own starting place (`instances.in_node_order`,
  what they do now).
Per round: wall time, latency p50 and max (claims), the API server's CPU seconds and the etcd
writes of Instances it made (its own counters, cluster-wide: another session's traffic adds to
them), and the races the patches lost (each answered 409 by its precondition). The difference
is what the API server spends retrying, inside each request, an apply that lost the race for
its object (each retry a full server-side apply of an object that grows with N), against what
a lost race costs when the client takes the retry.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time

import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.instance_plan import Apply, Operation, in_node_order
from akri_trio.agent.plugins.claims import (
    RETRY_CAP_S,
    USAGE_FIELD_MANAGER,
    retry_pause,
    usage_patch,
)
from akri_trio.agent.view import NodeView
from akri_trio.kube.client import JSON, Client
from akri_trio.kube.errors import Conflict, Invalid
from akri_trio.kube.store import drop_managed_fields, reflect
from akri_trio.model.convert import structure
from akri_trio.model.resources import INSTANCES, Instance
from bench._common import (
    bench_api,
    cluster_env,
    machine,
    ms,
    now,
    percentile,
    prepare_namespace,
    purge_namespace,
    record_run,
    table,
)
from bench.fleet import scrape, server_cpu, since, total

NAME = "storm"
STORM_NS = "akri-storm"  # its own: a fleet run in akri-fleet is never purged by this one


def member(node: str, n: int) -> JSON:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": NAME, "namespace": STORM_NS, "finalizers": [node]},
        "spec": {
            "configurationName": "storm",
            "cdiName": f"akri.sh/storm={NAME}",
            "capacity": n,
            "nodes": [node],
            "shared": True,
            "brokerProperties": {"ID": NAME},
        },
    }


def claim(slot: str, node: str) -> JSON:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": NAME, "namespace": STORM_NS},
        "spec": {"deviceUsage": {slot: node}},
    }


def doubling_pause(attempt: int) -> float:
    """The textbook alternative to the agents' pause, for comparison: full jitter over a
    window that doubles per lost race from 10 ms."""
    return random.uniform(0, min(RETRY_CAP_S, 0.01 * 2**attempt))


def _instance(obj: JSON) -> Instance:
    return structure(drop_managed_fields(obj), Instance)


class Latest:
    """The storm's Instance as each node's own view would hold it: a watch on it, with every
    write's answer in front until the watch brings that version (agent.view.NodeView)."""

    def __init__(self, obj: JSON) -> None:
        self.view = NodeView("storm")
        self.key = ObjectKey(STORM_NS, NAME)
        self.view.put_instance(obj)

    @property
    def position(self) -> int:
        """Take it before a request whose answer goes to `put`."""
        return self.view.position

    def put(self, obj: JSON, since: int) -> None:
        self.view.put_instance(obj, since=since)

    def instance(self) -> Instance:
        inst = self.view.instance(self.key)
        assert inst is not None, "the storm's Instance is never deleted during a round"
        return inst

    async def run(self, api: Client) -> None:
        await reflect(
            api,
            INSTANCES,
            self.view.store,
            namespace=STORM_NS,
            field_selector=f"metadata.name={NAME}",
        )


APPLY_AT_ONCE = "apply, at once"
PATCH_AT_ONCE = "patch, at once"
PATCH_DOUBLING = "patch, doubling pause"
ONE_BY_ONE = "apply, one by one"


async def one_round(
    api: Client, env: dict[str, str], n: int, how: str, latest: Latest
) -> list[str]:
    nodes = [f"node-{i:03d}" for i in range(n)]
    latencies: list[float] = []
    lost = 0

    async def patch(i: int) -> None:
        """The agents' claim: a patch on the version seen; after a lost race a pause, then
        the Instance read as it is."""
        nonlocal lost
        slot = f"{NAME}-{i}"
        inst = latest.instance()
        for attempt in itertools.count():
            since = latest.position
            try:
                answer = await api.merge_patch(
                    INSTANCES,
                    NAME,
                    usage_patch(inst, {}, {slot: nodes[i]}),
                    namespace=STORM_NS,
                    field_manager=USAGE_FIELD_MANAGER,
                )
                latest.put(answer, since)
                return
            except (Invalid, Conflict):
                lost += 1
                if how == PATCH_DOUBLING:
                    await trio.sleep(doubling_pause(attempt))
                else:
                    await trio.sleep(retry_pause(latest.instance(), nodes[i]))
                since = latest.position
                obj = await api.get(INSTANCES, NAME, namespace=STORM_NS)
                latest.put(obj, since)
                inst = _instance(obj)

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        if how in (PATCH_AT_ONCE, PATCH_DOUBLING):
            await patch(i)
        else:
            body = claim(f"{NAME}-{i}", nodes[i])
            await api.apply(INSTANCES, body, field_manager=f"dp-{nodes[i]}")
        latencies.append(time.perf_counter() - t0)

    at_once = how != ONE_BY_ONE
    before, cpu0, t0 = await scrape(api), server_cpu(env)[0], time.perf_counter()
    if at_once:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
    else:
        for i in range(n):
            await one(i)
    wall, cpu = time.perf_counter() - t0, server_cpu(env)[0] - cpu0
    delta = since(await scrape(api), before)
    etcd = total(delta, "etcd_requests_total", resource="instances", operation="update")
    for i in range(n):  # free the slots for the next round
        await api.json_patch(
            INSTANCES,
            NAME,
            [{"op": "remove", "path": f"/spec/deviceUsage/{NAME}-{i}"}],
            namespace=STORM_NS,
            field_manager=f"dp-{nodes[i]}",
        )
    return [
        how,
        f"{wall:.2f}",
        ms(percentile(latencies, 50)),
        ms(max(latencies)),
        f"{cpu:.2f}",
        f"{etcd:.0f}",
        str(lost),
    ]


async def joins_round(
    api: Client, env: dict[str, str], n: int, m: int, tag: str, per_node: int
) -> list[str]:
    names = [f"{NAME}-{tag}-{j}" for j in range(m)]

    async def node(i: int) -> None:
        nd = f"node-{i:03d}"
        ops: list[Operation] = [Apply(name, {}) for name in names]
        order = ops if per_node > 1 else in_node_order(ops, nd)
        limit = trio.Semaphore(per_node)

        async def one(name: str) -> None:
            async with limit:
                body = member(nd, n)
                body["metadata"]["name"] = name
                await api.apply(INSTANCES, body, field_manager=nd, force=True)

        async with trio.open_nursery() as nursery:
            for op in order:
                nursery.start_soon(one, op.name)

    before, cpu0, t0 = await scrape(api), server_cpu(env)[0], time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(node, i)
    wall, cpu = time.perf_counter() - t0, server_cpu(env)[0] - cpu0
    delta = since(await scrape(api), before)
    etcd = total(delta, "etcd_requests_total", resource="instances", operation={"create", "update"})
    how = "8 at a time, name order" if per_node > 1 else "1 at a time, own start"
    return [how, f"{wall:.2f}", f"{cpu:.2f}", f"{etcd:.0f}", str(n * m)]


async def bench(args: argparse.Namespace) -> str:
    env = cluster_env()
    n = args.nodes
    rows: list[list[str]] = []
    join_rows: list[list[str]] = []
    async with bench_api(env["KUBECONFIG"]) as api:
        await prepare_namespace(api, STORM_NS)
        try:
            for i in range(n):
                node = f"node-{i:03d}"
                await api.apply(INSTANCES, member(node, n), field_manager=node, force=True)
            obj = await api.get(INSTANCES, NAME, namespace=STORM_NS)
            size = len(str(obj))
            latest = Latest(obj)
            async with trio.open_nursery() as watching:
                watching.start_soon(latest.run, api)
                for _ in range(args.rounds):
                    for how in (APPLY_AT_ONCE, PATCH_AT_ONCE, PATCH_DOUBLING, ONE_BY_ONE):
                        rows.append(await one_round(api, env, n, how, latest))
                        print("  " + " | ".join(rows[-1]), flush=True)
                        await trio.sleep(1)
                watching.cancel_scope.cancel()
            for r in range(args.rounds if args.joins else 0):
                for per_node in (8, 1):
                    join_rows.append(
                        await joins_round(api, env, n, args.devices, f"{r}{per_node}", per_node)
                    )
                    print("  " + " | ".join(join_rows[-1]), flush=True)
        finally:
            await purge_namespace(api, STORM_NS)
    header = [
        "claims", "wall s", "p50 ms", "max ms", "apiserver CPU s", "etcd writes", "lost races"
    ]  # fmt: skip
    join_header = ["each node writes", "wall s", "apiserver CPU s", "etcd writes", "writes"]
    return "\n".join(
        [
            f"### storm N={n} M={args.devices} ({now()}, {machine()})",
            "",
            f"One Instance shared by {n} nodes (~{size / 1000:.0f} KB with its managedFields), "
            f"{n} claims of one slot each:",
            "",
            table(header, rows),
            "",
            f"{n} nodes joining {args.devices} new shared Instances at once:",
            "",
            table(join_header, join_rows) if join_rows else "(not run)",
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("nodes", type=int, nargs="?", default=25)
    p.add_argument("--devices", type=int, default=10, help="shared Instances the nodes join")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--no-joins", dest="joins", action="store_false", help="the claims only, not the joins"
    )
    p.add_argument(
        "--no-write",
        "--no-record",
        dest="no_record",
        action="store_true",
        help="print, do not append to RESULTS.md",
    )
    args = p.parse_args()
    report = trio.run(bench, args)
    print(report)
    record_run("storm", report, write=not args.no_record)


if __name__ == "__main__":
    main()
