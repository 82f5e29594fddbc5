"""A shared device across three real kubelets: its slots are one budget for the whole fleet.

One agent per real node runs as a process (debugEcho shared: every node sees the one device),
with the node's own device-plugin dir, pod-resources socket and API link (its kubeconfig) from
`cluster env --node`; the controller runs too, with a short `--node-lost-grace`. The story runs
in file order: of five Pods spread over the nodes exactly two run; deleting one lets exactly one
more run; after a partition (`cluster node partition`, then `heal`) every node's view of the
slots converges; a node that is lost (`cluster node stop`, its agent gone with it) goes
NotReady, the controller removes it from the Instance and frees its slot, and a Pod then runs on
a surviving node; `node start` brings the node back into the Instance.

Device plugins admit on each kubelet's own view: a Pod bound to a node in the moment a slot
looks free everywhere can lose the race for it at its kubelet, which fails it with
UnexpectedAdmissionError (never runs it). So the tests assert what must hold on a fleet: never
more Pods running than the capacity, never a slot held twice, and the loser never Running.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from akri_trio.model import naming
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster.layout import EXTRA_NODE_TOLERATION
from tests.support.kubectl import Kubectl, busybox_pod
from tests.support.node_agent import (
    AgentProcess,
    clear_namespace,
    debug_echo_configuration,
    fresh_namespace,
)
from tests.support.polling import until

NS = "akri-multinode"
CONFIG = "mn-shared"
DESCRIPTION = "mn-shared-0"
CAPACITY = 2
NODE_LOST_GRACE = "5"
REPO = Path(__file__).resolve().parents[2]
# Room for the controller-manager's default 50 s node grace (a cluster started before the
# shortened one was configured) plus the controller's grace.
NODE_LOSS_S = 150


class Fleet:
    """Three nodes, an agent process on each, the controller, and the shared Instance."""

    def __init__(self, nodes: list[dict[str, str]], tmp: Path) -> None:
        self.nodes = nodes
        self.names = [n["AKRI_TRIO_NODE_NAME"] for n in nodes]
        self.kubectl = Kubectl(nodes[0])
        self.instance = naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, None))
        self.resource = f"akri.sh/{self.instance}"
        self.agents = [self._agent(n, tmp / f"node-{i}") for i, n in enumerate(nodes, 1)]
        self.tmp = tmp
        self.controller: subprocess.Popen[bytes] | None = None

    def _agent(self, node: Mapping[str, str], tmp: Path) -> AgentProcess:
        tmp.mkdir()
        args = [
            *("--node-name", node["AKRI_TRIO_NODE_NAME"], "--namespace", NS),
            # The API server through the node's own link, as a node's agent would reach it.
            *("--kubeconfig", node["AKRI_TRIO_NODE_KUBECONFIG"]),
            *("--device-plugin-dir", node["AKRI_TRIO_DEVICE_PLUGIN_DIR"]),
            *("--pod-resources-socket", node["AKRI_TRIO_POD_RESOURCES_SOCKET"]),
            *("--discovery-handlers-directory", str(tmp / "akri")),
            *("--enable-debug-echo", "--debug-echo-shared"),
            *("--debug-echo-availability", str(tmp / "availability")),
            *("--metrics-port", "-1", "--reclaim-period", "1", "--reclaim-grace", "3"),
        ]
        return AgentProcess(self.kubectl, tmp / "agent.log", args)

    def start_controller(self) -> None:
        log = open(self.tmp / "controller.log", "ab")  # noqa: SIM115  (closed with the process)
        self.controller = subprocess.Popen(
            [
                *(sys.executable, "-m", "akri_trio", "controller", "--namespace", NS),
                *("--no-leader-elect", "--metrics-port", "-1"),
                *("--node-lost-grace", NODE_LOST_GRACE),
            ],
            cwd=REPO,
            env={**self.kubectl.environ, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=log,
        )

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.controller.send_signal(signal.SIGTERM)
            self.controller.wait(timeout=15)
            self.controller = None

    # -- reading the cluster ----------------------------------------------------------------
    def allocatable(self, node: str) -> int:
        status = self.kubectl.json("get", "node", node)["status"]
        return int(status.get("allocatable", {}).get(self.resource, "0"))

    def converged(self, node: str) -> bool:
        """The node's kubelet offers every slot no other node holds (allocatable counts the
        slots its own Pods use too; the agents mark the others' slots unhealthy)."""
        others = sum(1 for holder in self.held().values() if holder != node)
        return self.allocatable(node) == CAPACITY - others

    def wait_converged(self) -> None:
        """Until every node's view of the shared device agrees with its deviceUsage."""
        for node in self.names:
            until(functools.partial(self.converged, node), 60, f"{node}'s view converged")

    def wait_running(self, pod: str) -> None:
        until(functools.partial(lambda p: p in self.running(), pod), 60, f"{pod} running")

    def ready(self, node: str) -> bool:
        conds = self.kubectl.json("get", "node", node)["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def pods(self) -> dict[str, dict[str, Any]]:
        items = self.kubectl.json("get", "pods", "-n", NS)["items"]
        return {p["metadata"]["name"]: p for p in items}

    def running(self) -> dict[str, str]:
        """Running Pods (on a Ready node) -> their node."""
        return {
            name: p["spec"]["nodeName"]
            for name, p in self.pods().items()
            if p["status"].get("phase") == "Running" and self.ready(p["spec"]["nodeName"])
        }

    def instance_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.kubectl.json(
            "get", "instances.akri.sh", self.instance, "-n", NS
        )["spec"]
        return spec

    def instance_nodes(self) -> list[str]:
        """The Instance's nodes, sorted ([] before it exists)."""
        out = self.kubectl("get", "instances.akri.sh", "-n", NS, "-o", "json")
        for item in json.loads(out)["items"]:
            if item["metadata"]["name"] == self.instance:
                return sorted(item["spec"].get("nodes", []))
        return []

    def held(self) -> dict[str, str]:
        """deviceUsage's taken slots -> the node holding each."""
        usage = self.instance_spec().get("deviceUsage", {})
        return {slot: holder for slot, holder in usage.items() if holder}

    # -- acting -----------------------------------------------------------------------------
    def pod(self, name: str, node: str) -> None:
        pod = busybox_pod(name, NS, "sleep 3600", limits={self.resource: 1})
        pod["spec"] |= {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [EXTRA_NODE_TOLERATION],
        }
        self.kubectl.apply(pod)

    def check_budget(self) -> None:
        """What must hold at every moment: no more Pods running than the capacity, each of
        them on a slot its node holds, every failed Pod failed at admission."""
        running = self.running()
        assert len(running) <= CAPACITY, running
        holders = list(self.held().values())
        for node in set(running.values()):
            assert holders.count(node) >= list(running.values()).count(node), (running, holders)
        for name, p in self.pods().items():
            if p["status"].get("phase") == "Failed":
                assert p["status"].get("reason") == "UnexpectedAdmissionError", (name, p["status"])


def _node_command(*args: str) -> None:
    proc = run_cluster_command("node", *args, capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def fleet(
    multi_node_cluster: list[dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    f = Fleet(multi_node_cluster, tmp_path_factory.mktemp("multinode"))
    fresh_namespace(f.kubectl, NS)
    for agent in f.agents:
        agent.start()
    f.start_controller()
    try:
        f.kubectl.apply(debug_echo_configuration(CONFIG, NS, [DESCRIPTION], CAPACITY))
        until(lambda: f.instance_nodes() == sorted(f.names), 60, "every node in the Instance")
        f.wait_converged()
        yield f
    finally:
        clear_namespace(f.kubectl, NS)
        f.stop_controller()
        for agent in f.agents:
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                agent.stop()


def test_every_node_sees_the_shared_device(fleet: Fleet) -> None:
    spec = fleet.instance_spec()
    assert spec["shared"] is True
    assert fleet.instance_nodes() == sorted(fleet.names)
    assert not fleet.held()  # every node offers both slots (the fixture waited for that)


def test_of_five_pods_spread_over_the_nodes_exactly_two_run(fleet: Fleet) -> None:
    """Two Pods on two nodes run; once every kubelet has heard which slots the others took,
    three more (one per node) stay Pending: the scheduler finds no node with a free one."""
    for i in range(2):
        fleet.pod(f"p{i}", fleet.names[i])
        fleet.wait_running(f"p{i}")
    assert sorted(fleet.held().values()) == sorted(fleet.names[:2])
    fleet.wait_converged()
    for i in range(2, 5):
        fleet.pod(f"p{i}", fleet.names[i % 3])
    until(
        lambda: all(
            any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))
            for name, p in fleet.pods().items()
            if name in ("p2", "p3", "p4")
        ),
        60,
        "p2..p4 Pending, unschedulable",
    )
    fleet.check_budget()
    assert set(fleet.running()) == {"p0", "p1"}


def test_deleting_a_running_pod_lets_exactly_one_more_run(fleet: Fleet) -> None:
    fleet.kubectl("delete", "pod", "p0", "-n", NS, "--wait=true", "--timeout=60s")
    until(lambda: len(fleet.running()) == CAPACITY, 90, "a waiting Pod took the freed slot")
    newcomer = set(fleet.running()) - {"p1"}
    assert newcomer <= {"p2", "p3", "p4"}, newcomer
    until(lambda: len(fleet.held()) == CAPACITY, 30, "the newcomer's slot claimed")
    fleet.check_budget()


def test_after_a_partition_heals_every_nodes_view_converges(fleet: Fleet) -> None:
    """Node 2 (its kubelet and its agent) is cut off from the API server while node 1's Pod is
    deleted: nodes 1 and 3 see the slot come free, node 2 cannot; no more Pods run than the
    capacity meanwhile; once healed, node 2's kubelet offers the freed slot too and its own Pod
    still runs on the slot it holds."""
    fleet.kubectl("delete", "pods", "--all", "-n", NS, "--wait=true", "--timeout=60s")
    until(lambda: not fleet.held(), 30, "every slot free")
    first, cut, third = fleet.names
    fleet.pod("first", first)
    fleet.pod("cut", cut)
    until(lambda: {"first", "cut"} <= set(fleet.running()), 60, "both Pods running")
    fleet.wait_converged()
    _node_command("partition", cut)
    try:
        fleet.kubectl("delete", "pod", "first", "-n", NS, "--wait=true", "--timeout=60s")
        until(lambda: first not in fleet.held().values(), 30, "node 1's slot freed")
        for node in (first, third):
            until(functools.partial(fleet.converged, node), 60, f"{node} sees the free slot")
        fleet.check_budget()
    finally:
        _node_command("heal", cut)
    fleet.wait_converged()  # node 2 too, now that its agent hears again
    assert "cut" in fleet.running()
    assert list(fleet.held().values()) == [cut]


def test_a_lost_node_frees_its_slot_and_a_pod_then_runs_elsewhere(fleet: Fleet) -> None:
    """Pods on node 1 and on node 2 hold both slots; node 2 is lost (its agent SIGKILLed, its
    kubelet and runtime stopped): it goes NotReady, the controller removes it from the Instance
    after --node-lost-grace and frees its slot, node 1 keeps its own, and a Pod waiting on node
    3 then runs. `node start` and a new agent bring node 2 back into the Instance."""
    fleet.kubectl("delete", "pods", "--all", "-n", NS, "--wait=true", "--timeout=60s")
    until(lambda: not fleet.held(), 30, "every slot free")
    kept, lost, spare = fleet.names
    fleet.pod("keeps", kept)
    fleet.pod("lost", lost)
    until(lambda: {"keeps", "lost"} <= set(fleet.running()), 60, "both Pods running")
    fleet.wait_converged()
    fleet.pod("waits", spare)
    fleet.agents[1].kill()
    _node_command("stop", lost)
    try:
        until(lambda: not fleet.ready(lost), NODE_LOSS_S, f"{lost} NotReady")
        until(
            lambda: lost not in fleet.instance_nodes(),
            60,
            f"the controller removed {lost} from the Instance",
        )
        assert lost not in fleet.held().values()
        assert kept in fleet.held().values()  # the survivor keeps its slot
        until(lambda: "waits" in fleet.running(), 90, f"the waiting Pod runs on {spare}")
        assert sorted(fleet.held().values()) == sorted([kept, spare])
        fleet.check_budget()
    finally:
        _node_command("start", lost)
        fleet.agents[1].start()
    until(lambda: lost in fleet.instance_nodes(), 60, f"{lost} back in the Instance")
