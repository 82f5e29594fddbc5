"""What the multi-node tests share: one agent process per real node, the controller as a
process, one shared device whose slots are one budget for the whole fleet, and the checks that
must hold of it on any node at any moment.

Each agent reaches the API server through its node's own link (`cluster env --node`'s
kubeconfig), so `cluster node partition` cuts it off with its kubelet, as a DaemonSet Pod on a
real node would be. The handler an agent runs is the caller's (`handler_args`): debugEcho shared
for most tests, the embedded opcua handler with a real OPC UA server for one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from akri_trio.model import naming
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster.layout import EXTRA_NODE_TOLERATION
from tests.support.kubectl import Kubectl, busybox_pod
from tests.support.node_agent import AgentProcess, clear_namespace, fresh_namespace
from tests.support.polling import until

REPO = Path(__file__).resolve().parents[2]
# Room for the controller-manager's default 50 s node grace (a cluster started before the
# shortened one was configured) plus the controller's grace.
NODE_LOSS_S = 150
NODE_LOST_GRACE = "5"


def node_command(*args: str) -> None:
    """`cluster node ARGS` (stop, start, partition, heal ...), which must succeed."""
    proc = run_cluster_command("node", *args, capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def debug_echo_args(availability: Path) -> list[str]:
    """Agent flags for debugEcho, shared: every node sees the one device."""
    return [
        *("--enable-debug-echo", "--debug-echo-shared"),
        *("--debug-echo-availability", str(availability)),
    ]


class Fleet:
    """Three nodes, an agent process on each, the controller, and one shared Instance."""

    def __init__(
        self,
        nodes: list[dict[str, str]],
        tmp: Path,
        *,
        namespace: str,
        configuration: str,
        device_id: str,
        capacity: int,
        handler_args: Sequence[str],
    ) -> None:
        self.nodes = nodes
        self.names = [n["AKRI_TRIO_NODE_NAME"] for n in nodes]
        self.namespace = namespace
        self.configuration = configuration
        self.capacity = capacity
        self.kubectl = Kubectl(nodes[0])
        self.instance = naming.instance_name(configuration, naming.device_hash(device_id, None))
        self.resource = naming.resource_name(self.instance)
        self.tmp = tmp
        self.agents = [
            self._agent(n, tmp / f"node-{i}", handler_args) for i, n in enumerate(nodes, 1)
        ]
        self.controller: subprocess.Popen[bytes] | None = None

    def _agent(
        self, node: Mapping[str, str], tmp: Path, handler_args: Sequence[str]
    ) -> AgentProcess:
        tmp.mkdir()
        args = [
            *("--node-name", node["AKRI_TRIO_NODE_NAME"], "--namespace", self.namespace),
            # The API server through the node's own link, as a node's agent would reach it.
            *("--kubeconfig", node["AKRI_TRIO_NODE_KUBECONFIG"]),
            *("--device-plugin-dir", node["AKRI_TRIO_DEVICE_PLUGIN_DIR"]),
            *("--pod-resources-socket", node["AKRI_TRIO_POD_RESOURCES_SOCKET"]),
            *("--discovery-handlers-directory", str(tmp / "akri")),
            *handler_args,
            *("--metrics-port", "-1", "--reclaim-period", "1", "--reclaim-grace", "3"),
        ]
        return AgentProcess(self.kubectl, tmp / "agent.log", args)

    def start_controller(self) -> None:
        log = open(self.tmp / "controller.log", "ab")  # noqa: SIM115  (closed with the process)
        self.controller = subprocess.Popen(
            [
                *(sys.executable, "-m", "akri_trio", "controller"),
                *("--namespace", self.namespace, "--no-leader-elect", "--metrics-port", "-1"),
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

    @contextlib.contextmanager
    def running_with(self, configuration: Mapping[str, Any]) -> Iterator[Fleet]:
        """A clean namespace, every agent and the controller started, `configuration` applied
        and the shared Instance on every node, each offering every slot; on the way out the
        namespace is cleared and the processes stopped."""
        fresh_namespace(self.kubectl, self.namespace)
        for agent in self.agents:
            agent.start()
        self.start_controller()
        try:
            self.kubectl.apply(configuration)
            until(
                lambda: self.instance_nodes() == sorted(self.names),
                90,
                "every node in the Instance",
            )
            self.wait_converged()
            yield self
        finally:
            clear_namespace(self.kubectl, self.namespace)
            self.stop_controller()
            for agent in self.agents:
                with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                    agent.stop()

    # -- reading the cluster ----------------------------------------------------------------
    def allocatable(self, node: str) -> int:
        status = self.kubectl.json("get", "node", node)["status"]
        return int(status.get("allocatable", {}).get(self.resource, "0"))

    def converged(self, node: str) -> bool:
        """The node's kubelet offers every slot no other node holds (allocatable counts the
        slots its own Pods use too; the agents mark the others' slots unhealthy)."""
        others = sum(1 for holder in self.held().values() if holder != node)
        return self.allocatable(node) == self.capacity - others

    def wait_converged(self) -> None:
        """Until every node's view of the shared device agrees with its deviceUsage."""
        for node in self.names:
            until(functools.partial(self.converged, node), 60, f"{node}'s view converged")

    def wait_running(self, pod: str) -> None:
        until(functools.partial(lambda p: p in self.running(), pod), 60, f"{pod} running")

    def ready_nodes(self) -> set[str]:
        items = self.kubectl.json("get", "nodes")["items"]
        return {
            n["metadata"]["name"]
            for n in items
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions", [])
            )
        }

    def ready(self, node: str) -> bool:
        return node in self.ready_nodes()

    def pods(self) -> dict[str, dict[str, Any]]:
        items = self.kubectl.json("get", "pods", "-n", self.namespace)["items"]
        return {p["metadata"]["name"]: p for p in items}

    def running(self) -> dict[str, str]:
        """Running Pods (on a Ready node) -> their node."""
        ready = self.ready_nodes()
        return {
            name: p["spec"]["nodeName"]
            for name, p in self.pods().items()
            if p["status"].get("phase") == "Running" and p["spec"].get("nodeName") in ready
        }

    def instance_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.kubectl.json(
            "get", "instances.akri.sh", self.instance, "-n", self.namespace
        )["spec"]
        return spec

    def instance_nodes(self) -> list[str]:
        """The Instance's nodes, sorted ([] before it exists)."""
        out = self.kubectl("get", "instances.akri.sh", "-n", self.namespace, "-o", "json")
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
        """A Pod on `node` asking for one slot of the shared device."""
        pod = busybox_pod(name, self.namespace, "sleep 3600", limits={self.resource: 1})
        pod["spec"] |= {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [EXTRA_NODE_TOLERATION],
        }
        self.kubectl.apply(pod)

    def delete_pods(self, *names: str) -> None:
        which = list(names) or ["--all"]
        self.kubectl("delete", "pods", *which, "-n", self.namespace, "--wait=true", "--timeout=60s")

    def check_budget(self) -> None:
        """What must hold at every moment: no more Pods running than the capacity, each of
        them on a slot its node holds, every failed Pod failed at admission."""
        running = self.running()
        assert len(running) <= self.capacity, running
        holders = list(self.held().values())
        for node in set(running.values()):
            assert holders.count(node) >= list(running.values()).count(node), (running, holders)
        for name, p in self.pods().items():
            if p["status"].get("phase") == "Failed":
                assert p["status"].get("reason") == "UnexpectedAdmissionError", (name, p["status"])


# -- the stories every shared device of capacity 2 must tell -----------------------------------


def five_pods_two_run(fleet: Fleet) -> None:
    """Two Pods on two nodes run; once every kubelet has heard which slots the others took,
    three more (one per node) stay Pending: the scheduler finds no node with a free one."""
    assert fleet.capacity == 2
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


def one_more_runs_after_a_delete(fleet: Fleet) -> None:
    """After `five_pods_two_run`: deleting p0 lets exactly one of the waiting Pods run."""
    fleet.delete_pods("p0")
    until(lambda: len(fleet.running()) == 2, 90, "a waiting Pod took the freed slot")
    newcomer = set(fleet.running()) - {"p1"}
    assert newcomer <= {"p2", "p3", "p4"}, newcomer
    until(lambda: len(fleet.held()) == 2, 30, "the newcomer's slot claimed")
    fleet.check_budget()
