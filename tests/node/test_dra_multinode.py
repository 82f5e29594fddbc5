"""DRA mode across three real kubelets: a shared device's pool, allocated by the real scheduler to
Pods on different nodes within its capacity, each claim prepared by its own node's agent, and a
node loss that frees its claims' capacity.

One agent per node runs as a process (`--allocation dra`, debugEcho shared: every node sees the
one device) with that node's kubelet root, CDI directory and API link from `cluster env --node`;
the controller runs in DRA mode with a short `--node-lost-grace`. The controller publishes the
Instance's pool on a node selector of the three hostnames; a ResourceClaimTemplate of the test
asks for one device of the Instance. The story runs in file order: the pool selects the three
nodes; of three Pods pinned to the three nodes exactly two are allocated and run, on different
nodes, each with the device's env from its own node's agent; the third waits, unschedulable; a
node holding a claim is lost (`cluster node stop`, its agent SIGKILLed): the controller takes
it out of the Instance and the pool and deletes its Pod that holds the shared device, whose
claim is then released, and the waiting Pod is allocated and runs; `node start` and a new agent
bring the node back into the pool. Last, the same story with Pods written for device-plugin
mode (`akri.sh/<instance>: 1` in their limits), allocated through the Instance's DeviceClass.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from akri_trio import dra
from akri_trio.model import naming
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster.layout import EXTRA_NODE_TOLERATION
from tests.support.kubectl import Kubectl, busybox_pod, claim_pod
from tests.support.node_agent import (
    AgentProcess,
    clear_namespace,
    debug_echo_configuration,
    fresh_namespace,
)
from tests.support.polling import until
from tests.support.releases import skip_without

NS = "akri-dra-multinode"
CONFIG = "dra-mn"
DESCRIPTION = "dra-mn-0"
CAPACITY = 2
TEMPLATE = "dra-mn-one"
NODE_LOST_GRACE = "5"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = "trap 'exit 0' TERM; env | grep ^DEBUG_ECHO; sleep 3600 & wait"
# Room for the controller-manager's default 50 s node grace (a cluster started before the
# shortened one was configured) plus the controller's grace.
NODE_LOSS_S = 150


class Fleet:
    """Three nodes, a DRA agent process on each, the controller, and the shared pool."""

    def __init__(self, nodes: list[dict[str, str]], tmp: Path) -> None:
        self.nodes = nodes
        self.names = [n["AKRI_TRIO_NODE_NAME"] for n in nodes]
        self.kubectl = Kubectl(nodes[0])
        self.instance = naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, None))
        self.pool = dra.shared_pool(NS, self.instance)
        self.agents = [self._agent(n, tmp / f"node-{i}") for i, n in enumerate(nodes, 1)]
        self.tmp = tmp
        self.controller: subprocess.Popen[bytes] | None = None

    def _agent(self, node: Mapping[str, str], tmp: Path) -> AgentProcess:
        tmp.mkdir()
        args = [
            *("--node-name", node["AKRI_TRIO_NODE_NAME"], "--namespace", NS),
            # The API server through the node's own link, as a node's agent would reach it.
            *("--kubeconfig", node["AKRI_TRIO_NODE_KUBECONFIG"]),
            *("--allocation", "dra"),
            *("--kubelet-root-dir", node["AKRI_TRIO_KUBELET_ROOT_DIR"]),
            *("--cdi-dir", node["AKRI_TRIO_CDI_DIR"]),
            *("--discovery-handlers-directory", str(tmp / "akri")),
            *("--enable-debug-echo", "--debug-echo-shared"),
            *("--debug-echo-availability", str(tmp / "availability")),
            *("--metrics-port", "-1"),
        ]
        return AgentProcess(self.kubectl, tmp / "agent.log", args)

    def start_controller(self) -> None:
        log = open(self.tmp / "controller.log", "ab")  # noqa: SIM115  (closed with the process)
        self.controller = subprocess.Popen(
            [
                *(sys.executable, "-m", "akri_trio", "controller", "--namespace", NS),
                *("--allocation", "dra", "--no-leader-elect", "--metrics-port", "-1"),
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
    def registered(self, agent: AgentProcess) -> bool:
        return f"the kubelet registered DRA driver {dra.DRIVER}" in agent.this_run()

    def pool_nodes(self) -> list[str]:
        """The hostnames the shared pool's slices select, sorted ([] while it has none)."""
        items = self.kubectl.json("get", "resourceslices")["items"]
        found: set[str] = set()
        for s in items:
            if dra.pool_name_of(s) != self.pool or not s["spec"].get("devices"):
                continue
            for term in s["spec"]["nodeSelector"]["nodeSelectorTerms"]:
                for expr in term["matchExpressions"]:
                    found.update(expr["values"])
        return sorted(found)

    def instance_nodes(self) -> list[str]:
        items = self.kubectl.json("get", "instances.akri.sh", "-n", NS)["items"]
        for item in items:
            if item["metadata"]["name"] == self.instance:
                return sorted(item["spec"].get("nodes", []))
        return []

    def ready(self, node: str) -> bool:
        conds = self.kubectl.json("get", "node", node)["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def pods(self) -> dict[str, dict[str, Any]]:
        items = self.kubectl.json("get", "pods", "-n", NS)["items"]
        return {p["metadata"]["name"]: p for p in items}

    def running(self) -> dict[str, str]:
        """Running Pods on a Ready node -> their node."""
        return {
            name: p["spec"]["nodeName"]
            for name, p in self.pods().items()
            if p["status"].get("phase") == "Running" and self.ready(p["spec"]["nodeName"])
        }

    def allocated(self) -> dict[str, str]:
        """The claims allocated from the pool -> the Pod each is reserved for."""
        out = {}
        for claim in self.kubectl.json("get", "resourceclaims", "-n", NS)["items"]:
            status = claim.get("status", {})
            results = (status.get("allocation") or {}).get("devices", {}).get("results", [])
            if any(r["pool"] == self.pool for r in results):
                reserved = [r["name"] for r in status.get("reservedFor", [])]
                out[claim["metadata"]["name"]] = ",".join(reserved)
        return out

    def claim(self, pod: str) -> tuple[str, str]:
        """The name and uid of `pod`'s claim."""
        (status,) = self.pods()[pod]["status"]["resourceClaimStatuses"]
        claim = self.kubectl.json("get", "resourceclaim", status["resourceClaimName"], "-n", NS)
        return str(claim["metadata"]["name"]), str(claim["metadata"]["uid"])

    def unschedulable(self, pod: str) -> bool:
        conditions = self.pods()[pod]["status"].get("conditions", [])
        return any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in conditions
        )

    def env(self, pod: str) -> dict[str, str]:
        out = self.kubectl("logs", pod, "-n", NS, check=False)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    # -- acting -----------------------------------------------------------------------------
    def pod(self, name: str, node: str, *, extended: bool = False) -> None:
        """A Pod with a claim from the template (`extended`: asking for `akri.sh/<instance>`
        in its limits instead), pinned to `node` by its hostname label (a Pod that sets
        spec.nodeName itself would bypass the scheduler and its allocation)."""
        if extended:
            pod = busybox_pod(name, NS, SCRIPT, {naming.resource_name(self.instance): 1})
        else:
            pod = claim_pod(name, NS, SCRIPT, TEMPLATE)
        pod["spec"] |= {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [EXTRA_NODE_TOLERATION],
        }
        self.kubectl.apply(pod)

    def check_capacity(self) -> None:
        """Never more claims allocated, nor Pods running, than the capacity."""
        allocated = self.allocated()
        assert len(allocated) <= CAPACITY, allocated
        assert len(self.running()) <= CAPACITY, self.running()


def _node_command(*args: str) -> None:
    proc = run_cluster_command("node", *args, capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def fleet(
    multi_node_cluster: list[dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    f = Fleet(multi_node_cluster, tmp_path_factory.mktemp("dra-multinode"))
    fresh_namespace(f.kubectl, NS)
    f.kubectl.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": NS},
            "spec": {"spec": dra.claim_spec(CONFIG, NS, f.instance)},
        }
    )
    for agent in f.agents:
        agent.start()
    f.start_controller()
    try:
        f.kubectl.apply(debug_echo_configuration(CONFIG, NS, [DESCRIPTION], CAPACITY))
        for agent in f.agents:
            until(functools.partial(f.registered, agent), 120, "each kubelet registered its agent")
        yield f
    finally:
        clear_namespace(f.kubectl, NS, CONFIG)
        f.stop_controller()
        for agent in f.agents:
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                agent.stop()
        f.kubectl("delete", "resourceclaimtemplate", TEMPLATE, "-n", NS, check=False)
        classes = (dra.device_class_name(CONFIG, NS), dra.instance_class_name(f.instance, NS))
        f.kubectl("delete", "deviceclass", *classes, check=False)


def test_the_shared_pool_selects_every_node(fleet: Fleet) -> None:
    until(lambda: fleet.instance_nodes() == sorted(fleet.names), 60, "every node in the Instance")
    until(lambda: fleet.pool_nodes() == sorted(fleet.names), 60, "the pool on the three nodes")
    # one pool, written by the controller; no node pool of the agents holds the device
    items = fleet.kubectl.json("get", "resourceslices")["items"]
    node_pools = {dra.node_pool(n, NS) for n in fleet.names}
    assert not [s for s in items if dra.pool_name_of(s) in node_pools and s["spec"].get("devices")]


def test_of_three_pods_on_three_nodes_exactly_two_are_allocated_and_run(fleet: Fleet) -> None:
    """The scheduler allocates the device to the Pods on nodes 1 and 2, each node's kubelet
    prepares its own claim through its own agent (the CDI spec gives the device's env); the
    Pod on node 3 waits, unschedulable, and gets no claim allocated."""
    first, second, third = fleet.names
    fleet.pod("p1", first)
    fleet.pod("p2", second)
    until(lambda: set(fleet.running()) == {"p1", "p2"}, 90, "p1 and p2 Running")
    assert fleet.running() == {"p1": first, "p2": second}
    assert sorted(fleet.allocated().values()) == ["p1", "p2"]
    cdi_dirs = [Path(n["AKRI_TRIO_CDI_DIR"]) for n in fleet.nodes]
    for i, pod in enumerate(("p1", "p2")):
        assert until(functools.partial(fleet.env, pod))["DEBUG_ECHO_DESCRIPTION"] == DESCRIPTION
        # prepared by its own node's agent: the claim's CDI spec is in that node's directory
        claim, uid = fleet.claim(pod)
        assert f"prepared claim {NS}/{claim}" in fleet.agents[i].this_run()
        holders = [j for j, d in enumerate(cdi_dirs) if any(uid in f.name for f in d.iterdir())]
        assert holders == [i], (pod, uid, holders)
    fleet.pod("p3", third)
    until(functools.partial(fleet.unschedulable, "p3"), 60, "p3 unschedulable")
    fleet.check_capacity()
    assert set(fleet.running()) == {"p1", "p2"}


def test_a_lost_node_frees_its_claims_and_the_waiting_pod_runs(fleet: Fleet) -> None:
    """Node 2 is lost (its agent SIGKILLed, its kubelet and runtime stopped): it goes NotReady,
    the controller takes it out of the Instance and the pool and deletes its Pod holding the
    shared device (so that Pod's claim is released), node 1's Pod keeps its own claim, and p3
    on node 3 is allocated and runs. `node start` and a new agent bring node 2 back into the
    pool."""
    first, lost, third = fleet.names
    fleet.agents[1].kill()
    _node_command("stop", lost)
    try:
        until(lambda: not fleet.ready(lost), NODE_LOSS_S, f"{lost} NotReady")
        until(lambda: lost not in fleet.instance_nodes(), 60, f"{lost} out of the Instance")
        until(lambda: fleet.pool_nodes() == sorted([first, third]), 60, f"{lost} out of the pool")
        # its Pod can never end by itself (its kubelet is gone): the controller deletes it
        until(lambda: "p2" not in fleet.pods(), 60, f"p2, on {lost}, deleted")
        until(lambda: "p3" in fleet.running(), 120, f"p3 allocated and Running on {third}")
        assert sorted(fleet.allocated().values()) == ["p1", "p3"]
        assert fleet.running() == {"p1": first, "p3": third}
        fleet.check_capacity()
    finally:
        _node_command("start", lost)
        fleet.agents[1].start()
    until(lambda: fleet.pool_nodes() == sorted(fleet.names), 90, f"{lost} back in the pool")


def test_pods_written_for_device_plugins_share_the_device_across_nodes(fleet: Fleet) -> None:
    """With the template's Pods gone, three Pods asking for `akri.sh/<instance>: 1`, one per
    node: the scheduler makes and allocates a claim for two of them through the Instance's
    DeviceClass, their own nodes' agents prepare them, the third waits; when one of the two
    ends, the third is allocated and runs."""
    skip_without(fleet.nodes[0], "DRAExtendedResource")
    # Node 2 is back from the last test: Ready, and its new agent's plugin registered.
    until(lambda: all(map(fleet.ready, fleet.names)), 120, "every node Ready")
    for agent in fleet.agents:
        until(functools.partial(fleet.registered, agent), 120, "each kubelet registered its agent")
    fleet.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=1", "--wait=true")
    until(lambda: not fleet.allocated(), 60, "the template's claims released")
    first, second, third = fleet.names
    fleet.pod("e1", first, extended=True)
    fleet.pod("e2", second, extended=True)
    until(lambda: set(fleet.running()) == {"e1", "e2"}, 90, "e1 and e2 Running")
    assert sorted(fleet.allocated().values()) == ["e1", "e2"]
    for pod in ("e1", "e2"):
        assert until(functools.partial(fleet.env, pod))["DEBUG_ECHO_DESCRIPTION"] == DESCRIPTION
    fleet.pod("e3", third, extended=True)
    until(functools.partial(fleet.unschedulable, "e3"), 60, "e3 unschedulable")
    fleet.check_capacity()
    fleet.kubectl("delete", "pod", "e1", "-n", NS, "--grace-period=1", "--wait=true")
    until(lambda: "e3" in fleet.running(), 120, f"e3 allocated and Running on {third}")
    assert fleet.running() == {"e2": second, "e3": third}
    assert sorted(fleet.allocated().values()) == ["e2", "e3"]
    fleet.check_capacity()
