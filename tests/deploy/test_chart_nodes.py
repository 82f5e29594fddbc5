"""The chart's agent DaemonSet on three real nodes: one agent Pod per node, and a shared debugEcho
device whose two slots are one budget for all three.

The release tolerates the extra nodes' taint (`agent.tolerations`), so the DaemonSet puts an
agent on each kubelet; the image is in every node's containerd (`ensure_image` imports it into
each). Each agent Pod mounts the standard kubelet paths, which on an extra node are that node's
own directories (`akri_trio_dev.cluster.flags.node_binds`), as on any real fleet. The nodes of
the local cluster share the host's network namespace, so each agent binds its health and metrics
port on its own node's address (METRICS_HOST from the Pod's IP, through `agent.extraEnv`), and
they share the release's handler directory (only embedded debugEcho runs; a registration socket
is replaced atomically and removed only by its owner).

The story runs in file order: every node's agent serves the one Instance; of five Pods spread
over the nodes exactly two run; deleting one lets exactly one more run; the uninstall leaves
nothing on any node.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from akri_trio.model import naming
from akri_trio_dev.cluster.layout import EXTRA_NODE_TOLERATION
from tests.support.kubectl import busybox_pod
from tests.support.polling import until
from tests.support.release import Release, release

CONFIG = "fleet-echo"
DESCRIPTION = "fleet0"
CAPACITY = 2
INSTANCE = naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, None))
RESOURCE = f"akri.sh/{INSTANCE}"
# prints the device's env the node's agent gave it, then waits; exits at once on SIGTERM
CONSUMER_SCRIPT = "trap 'exit 0' TERM; env | grep ^DEBUG_ECHO; sleep 3600 & wait"

VALUES: dict[str, Any] = {
    # the full agent embeds debugEcho; its devices are shared between nodes
    "agent": {
        "full": True,
        "allowDebugEcho": True,
        "tolerations": [EXTRA_NODE_TOLERATION],
        "extraEnv": [
            {"name": "METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        ],
    },
    "debugEcho": {
        "configuration": {
            "enabled": True,
            "name": CONFIG,
            "capacity": CAPACITY,
            "shared": True,
            "discoveryDetails": {"descriptions": [DESCRIPTION]},
        }
    },
}


class Fleet:
    """The release and the three nodes it runs on."""

    def __init__(self, rel: Release, names: list[str]) -> None:
        self.rel = rel
        self.names = names

    def agents(self) -> dict[str, str]:
        """Ready agent Pods: node -> Pod name."""
        return {
            p["spec"]["nodeName"]: p["metadata"]["name"]
            for p in self.rel.pods("akri-agent")
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions") or []
            )
        }

    def instance(self) -> dict[str, Any]:
        items = self.rel.get("instances.akri.sh", "-n", self.rel.namespace)["items"]
        found = [i["spec"] for i in items if i["metadata"]["name"] == INSTANCE]
        return found[0] if found else {}

    def held(self) -> dict[str, str]:
        """deviceUsage's taken slots -> the node holding each."""
        usage = self.instance().get("deviceUsage", {})
        return {slot: holder for slot, holder in usage.items() if holder}

    def allocatable(self, node: str) -> int:
        status = self.rel.get("node", node)["status"]
        return int(status.get("allocatable", {}).get(RESOURCE, "0"))

    def converged(self) -> bool:
        """Every node's kubelet offers exactly the slots no other node holds (allocatable counts
        its own Pods' slots too; an agent marks the others' unhealthy)."""
        held = list(self.held().values())
        return all(
            self.allocatable(node) == CAPACITY - sum(1 for h in held if h != node)
            for node in self.names
        )

    def pods(self) -> dict[str, dict[str, Any]]:
        """The consumer Pods (the release's own Pods carry app.kubernetes.io/name)."""
        items = self.rel.get("pods", "-n", self.rel.namespace, "-l", "consumer")["items"]
        return {p["metadata"]["name"]: p for p in items}

    def running(self) -> dict[str, str]:
        """Running consumers -> their node."""
        return {
            name: p["spec"]["nodeName"]
            for name, p in self.pods().items()
            if p["status"].get("phase") == "Running"
        }

    def consumer(self, name: str, node: str) -> None:
        pod = busybox_pod(name, self.rel.namespace, CONSUMER_SCRIPT, limits={RESOURCE: 1})
        pod["metadata"]["labels"] = {"consumer": "yes"}
        pod["spec"] |= {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [EXTRA_NODE_TOLERATION],
        }
        self.rel.kubectl.apply(pod)

    def check_budget(self) -> None:
        """No more consumers running than the capacity, each on a slot its node holds; a
        consumer that lost the race for a slot at its kubelet failed admission, never ran."""
        running = list(self.running().values())
        assert len(running) <= CAPACITY, running
        holders = list(self.held().values())
        for node in set(running):
            assert holders.count(node) >= running.count(node), (running, holders)
        for name, p in self.pods().items():
            if p["status"].get("phase") == "Failed":
                assert p["status"].get("reason") == "UnexpectedAdmissionError", (name, p["status"])


@pytest.fixture(scope="module")
def fleet(
    multi_node_cluster: list[dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    names = [n["AKRI_TRIO_NODE_NAME"] for n in multi_node_cluster]
    with release(multi_node_cluster[0], "fleet", tmp_path_factory.mktemp("chart")) as rel:
        try:
            rel.install(VALUES)
            yield Fleet(rel, names)
        finally:
            rel.kubectl("delete", "pods", "-n", rel.namespace, "-l", "consumer", check=False)


def test_an_agent_pod_on_every_node_serves_the_shared_instance(fleet: Fleet) -> None:
    rel = fleet.rel
    rel.until(lambda: sorted(fleet.agents()) == sorted(fleet.names), "an agent Ready per node", 180)
    rel.until(
        lambda: sorted(fleet.instance().get("nodes", [])) == sorted(fleet.names),
        "every node in the shared Instance",
    )
    spec = fleet.instance()
    assert spec["shared"] is True and spec["capacity"] == CAPACITY
    # each kubelet heard its own node's agent: both slots offered on every node
    rel.until(
        lambda: [fleet.allocatable(n) for n in fleet.names] == [CAPACITY] * 3,
        "every kubelet offering both slots",
    )


def test_of_five_pods_spread_over_the_nodes_exactly_two_run(fleet: Fleet) -> None:
    """Two consumers on nodes 1 and 2 run, each with the device's env from its own node's
    agent; once every kubelet has heard which slots are taken, three more (one per node) stay
    Pending, unschedulable."""
    first, second, _ = fleet.names
    fleet.consumer("c0", first)
    fleet.consumer("c1", second)
    fleet.rel.until(lambda: set(fleet.running()) == {"c0", "c1"}, "c0 and c1 Running")
    assert sorted(fleet.held().values()) == sorted([first, second])
    env = until(functools.partial(fleet.rel.logs, "c1"), what="c1's output")
    assert f"DEBUG_ECHO_DESCRIPTION={DESCRIPTION}" in env.splitlines()
    fleet.rel.until(fleet.converged, "every node's view of the taken slots")
    for i in range(2, 5):
        fleet.consumer(f"c{i}", fleet.names[i % 3])
    fleet.rel.until(
        lambda: all(
            any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))
            for name, p in fleet.pods().items()
            if name in ("c2", "c3", "c4")
        ),
        "c2..c4 Pending, unschedulable",
    )
    fleet.check_budget()
    assert set(fleet.running()) == {"c0", "c1"}


def test_deleting_a_running_pod_lets_exactly_one_more_run(fleet: Fleet) -> None:
    rel = fleet.rel
    rel.kubectl("delete", "pod", "c0", "-n", rel.namespace, "--wait=true", "--timeout=60s")
    rel.until(lambda: len(fleet.running()) == CAPACITY, "a waiting Pod took the freed slot", 90)
    assert set(fleet.running()) - {"c1"} <= {"c2", "c3", "c4"}
    rel.until(lambda: len(fleet.held()) == CAPACITY, "the newcomer's slot claimed")
    fleet.check_budget()


def test_uninstall_leaves_nothing_on_any_node(
    fleet: Fleet, multi_node_cluster: list[dict[str, str]]
) -> None:
    rel = fleet.rel
    rel.kubectl("delete", "pods", "-n", rel.namespace, "-l", "consumer", "--wait=true")
    rel.uninstall()
    assert rel.get("configurations.akri.sh", "-n", rel.namespace)["items"] == []
    assert rel.get("instances.akri.sh", "-n", rel.namespace)["items"] == []
    until(lambda: not rel.left(), what="the namespace emptied")
    # every node's agent unregistered: no plugin socket of the Configuration in any node's dir
    dirs = [Path(n["AKRI_TRIO_DEVICE_PLUGIN_DIR"]) for n in multi_node_cluster]
    until(
        lambda: not [p for d in dirs for p in d.glob("*.sock") if p.name.startswith(CONFIG)],
        what="the plugin sockets removed on every node",
    )
    assert not list(rel.handlers_dir.glob("*.sock"))
