"""Chaos across three real nodes: one shared device of capacity 2, Pods wanting it on every
node, while agents, kubelets, the nodes' links and the API server fail.

One agent per real node (debugEcho shared) and the controller run as processes
(tests/support/fleet.py). A claimant thread per node keeps creating a Pod there that asks for
one slot, lets it run a moment and deletes it. Meanwhile, for FAULT_ROUNDS rounds, a fault
loop SIGKILLs (and restarts) a node's agent, restarts an extra node's kubelet and runtime
(`cluster node stop`, `start`), partitions an extra node from the API server for long enough
that it goes NotReady and the controller frees its slots (`node partition`, `heal`), and, once
per run, SIGKILLs the API server (`cluster up` starts it again: it disturbs everyone using the
cluster, hence only once). A sampler thread looks at the fleet every SAMPLE_EVERY seconds: the
Pods Running on a Ready node and the slot each one's kubelet gave it (pod-resources).

Then the faults stop, every node is up and connected, the claimants' Pods are gone, and two
holder Pods take both slots. The counts are printed; the test asserts 0 double grants (no slot
held by two Running Pods in any sample) and 0 leaked slots (every slot the Instance records as
held belongs to a Running Pod that holds it, and nothing else is held).

Destructive: it restarts the shared API server and stops and cuts off nodes, so it runs in CI's
single session and not beside other developers' tests.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest

from akri_trio_dev import run_cluster_command
from tests.support.fleet import Fleet, debug_echo_args, node_command
from tests.support.node_agent import debug_echo_configuration, held_by_pods, sigkill_component
from tests.support.polling import until

NS = "akri-multinode-chaos"
CONFIG = "mn-chaos"
DESCRIPTION = "mn-chaos-0"
CAPACITY = 2
FAULT_ROUNDS = 2  # each round fails every node-level part once; the API server goes once
FAULT_GAP = 6.0  # seconds between two faults
PARTITION_S = 30.0  # past the 16 s node grace: the node goes NotReady and is cleaned
POD_WAIT = 30.0  # a claimant gives a Pod this long to start before it deletes it
HOLD_S = 2.0  # how long a claimant keeps a Running Pod
SAMPLE_EVERY = 2.0


class Chaos:
    """The fleet, the claimants' and the sampler's counts, and the faults injected."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.cluster_dir = Path(fleet.nodes[0]["AKRI_TRIO_CLUSTER_DIR"])
        self.sockets = {
            n["AKRI_TRIO_NODE_NAME"]: Path(n["AKRI_TRIO_POD_RESOURCES_SOCKET"]) for n in fleet.nodes
        }
        self.faults: dict[str, int] = {}
        self.claims = {"made": 0, "running": 0, "failed": 0, "not-started": 0, "api-errors": 0}
        self.samples = {"taken": 0, "skipped": 0, "max-running": 0}
        self.double_grants: list[str] = []
        self.lock = threading.Lock()

    def _count(self, counts: dict[str, int], what: str, n: int = 1) -> None:
        with self.lock:
            counts[what] += n

    # --- the books ----------------------------------------------------------------------

    def slots_of_running(self) -> dict[str, list[str]]:
        """slot -> the Running Pods on Ready nodes whose kubelet assigned them that slot."""
        fleet = self.fleet
        running = fleet.running()
        holders: dict[str, list[str]] = {}
        for node in set(running.values()):
            try:
                report = held_by_pods(self.sockets[node], NS)
            except grpc.RpcError:  # its kubelet is stopping: its containers go with it
                continue
            for pod, resources in report.items():
                if running.get(pod) == node:
                    for slot in resources.get(fleet.resource, []):
                        holders.setdefault(slot, []).append(pod)
        return holders

    def sample(self) -> None:
        try:
            holders = self.slots_of_running()
        except AssertionError:  # kubectl failed: the API server is down
            self._count(self.samples, "skipped")
            return
        doubled = [f"slot {s} held by {pods}" for s, pods in holders.items() if len(pods) > 1]
        with self.lock:
            self.samples["taken"] += 1
            pods = {p for ps in holders.values() for p in ps}
            self.samples["max-running"] = max(self.samples["max-running"], len(pods))
            self.double_grants += [f"{time.strftime('%H:%M:%S')} {d}" for d in doubled]

    def sampler(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_EVERY):
            self.sample()

    def leaks(self) -> list[str]:
        """Slots the Instance records as held that no Running Pod of that node holds."""
        holders = self.slots_of_running()
        running = self.fleet.running()
        found = []
        for slot, node in self.fleet.held().items():
            if not any(running.get(p) == node for p in holders.get(slot, [])):
                found.append(f"slot {slot} held by {node} for no Running Pod there")
        return found

    def report(self) -> str:
        return (
            f"faults {sum(self.faults.values())} {self.faults}; claims {self.claims}; "
            f"samples {self.samples}; double grants {len(self.double_grants)}"
        )

    # --- claimants ----------------------------------------------------------------------

    def claimant(self, index: int, stop: threading.Event) -> None:
        node = self.fleet.names[index]
        for n in itertools.count():
            if stop.is_set():
                return
            name = f"claim-{index}-{n}"
            try:
                self.fleet.pod(name, node)
            except AssertionError:  # the API server is down: try again shortly
                self._count(self.claims, "api-errors")
                stop.wait(1)
                continue
            self._count(self.claims, "made")
            phase = self._wait_started(name, stop)
            self._count(
                self.claims, {"Running": "running", "Failed": "failed"}.get(phase, "not-started")
            )
            if phase == "Running":
                stop.wait(HOLD_S)
            self.fleet.kubectl("delete", "pod", name, "-n", NS, "--wait=false", check=False)

    def _wait_started(self, name: str, stop: threading.Event) -> str:
        deadline = time.monotonic() + POD_WAIT
        phase = ""
        while time.monotonic() < deadline and not stop.is_set():
            out = self.fleet.kubectl(
                "get", "pod", name, "-n", NS, "-o", "jsonpath={.status.phase}", check=False
            )
            phase = out.strip()
            if phase in ("Running", "Failed", "Succeeded"):
                return phase
            stop.wait(0.5)
        return phase

    # --- faults -------------------------------------------------------------------------

    def fault_loop(self) -> None:
        extra = self.fleet.names[1:]
        faults: list[tuple[str, Callable[[], None]]] = []
        for r in range(FAULT_ROUNDS):
            faults += [
                ("agent killed", partial(self._kill_agent, r % 3)),
                ("kubelet restarted", partial(self._restart_node, extra[r % 2])),
                ("node partitioned", partial(self._partition, extra[(r + 1) % 2])),
            ]
        faults.insert(2, ("apiserver restarted", self._restart_apiserver))
        for name, inject in faults:
            inject()
            self.faults[name] = self.faults.get(name, 0) + 1
            time.sleep(FAULT_GAP)

    def _kill_agent(self, index: int) -> None:
        agent = self.fleet.agents[index]
        agent.kill()
        time.sleep(0.5)
        agent.start()

    def _restart_node(self, node: str) -> None:
        node_command("stop", node)
        node_command("start", node)

    def _partition(self, node: str) -> None:
        node_command("partition", node)
        try:
            time.sleep(PARTITION_S)
        finally:
            node_command("heal", node)

    def _restart_apiserver(self) -> None:
        sigkill_component(self.cluster_dir, "kube-apiserver")
        run_cluster_command("up", "--nodes", "3", check=True, capture_output=True, timeout=300)


@pytest.fixture
def chaos(multi_node_cluster: list[dict[str, str]], tmp_path: Path) -> Iterator[Chaos]:
    fleet = Fleet(
        multi_node_cluster,
        tmp_path,
        namespace=NS,
        configuration=CONFIG,
        device_id=DESCRIPTION,
        capacity=CAPACITY,
        handler_args=debug_echo_args(tmp_path / "availability"),
    )
    with fleet.running_with(debug_echo_configuration(CONFIG, NS, [DESCRIPTION], CAPACITY)):
        yield Chaos(fleet)


def test_chaos_across_three_nodes_leaves_no_slot_doubled_or_leaked(chaos: Chaos) -> None:
    fleet = chaos.fleet
    stop = threading.Event()
    threads = [
        threading.Thread(target=chaos.claimant, args=(i, stop), daemon=True) for i in range(3)
    ]
    threads.append(threading.Thread(target=chaos.sampler, args=(stop,), daemon=True))
    for t in threads:
        t.start()
    try:
        chaos.fault_loop()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=POD_WAIT + 30)
        print(f"\nchaos x3 nodes, faults done: {chaos.report()}")
    # Calm: every node up and connected (the loop healed and started what it broke), every
    # agent running, the claimants' Pods gone; then two holders take both slots.
    for agent in fleet.agents:
        if agent.process is None:
            agent.start()
    until(lambda: fleet.ready_nodes() >= set(fleet.names), 120, "every node Ready")
    fleet.delete_pods()
    until(lambda: fleet.instance_nodes() == sorted(fleet.names), 120, "every node in the Instance")
    until(lambda: not fleet.held(), 60, "every claimant's slot freed")
    holders = dict(zip(("hold-a", "hold-b"), fleet.names[:2], strict=True))

    def holders_running() -> bool:
        pods = fleet.pods()
        for name, node in holders.items():
            phase = pods.get(name, {}).get("status", {}).get("phase")
            if phase == "Failed":  # lost the race for a slot at admission: try again
                fleet.delete_pods(name)
            if phase in (None, "Failed"):
                fleet.pod(name, node)
        return set(holders) <= set(fleet.running())

    until(holders_running, 120, "both holders Running")
    chaos.sample()
    try:
        until(lambda: not chaos.leaks() and len(fleet.held()) == CAPACITY, 60, "books balance")
        leaks: list[str] = []
    except AssertionError:
        leaks = chaos.leaks()
    print(f"\nchaos x3 nodes: {chaos.report()}; leaked slots {len(leaks)}")
    assert not chaos.double_grants, chaos.double_grants
    assert not leaks, leaks
    assert sum(chaos.faults.values()) == 3 * FAULT_ROUNDS + 1
    assert chaos.claims["running"] > 0
    assert chaos.samples["taken"] > 0
