"""Broker Pods across three real kubelets: one per node that sees the device, pinned to it, and
the configuration and instance Services in front of them all.

One agent per real node (debugEcho shared, so every node sees the one device) and the
controller run as processes (tests/support/fleet.py). The Configuration asks for a busybox
broker that uses one slot of the device (capacity 3: one for each node's broker) and tolerates
the extra nodes' taint. The story runs in file order: the controller makes one broker per node
and the kubelet of that node runs it; both Services list the three broker Pods as ready
endpoints; a node that is lost (`cluster node stop`, its agent gone with it) loses its broker
(the controller deletes it once the node is out of the Instance) and its endpoint, while the
other brokers run on untouched; `node start` and a new agent bring its broker back.

A lost node's broker stays Terminating until its kubelet comes back (as any Pod on a node that
is gone does: nobody but its kubelet may say its containers stopped); what matters to its
clients is that no Service sends them there.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from akri_trio.controller import names
from akri_trio.model import naming
from akri_trio_dev.cluster.layout import EXTRA_NODE_TOLERATION
from tests.support.fleet import NODE_LOSS_S, Fleet, debug_echo_args, node_command
from tests.support.node_agent import debug_echo_configuration
from tests.support.polling import until

NS = "akri-multinode-brokers"
CONFIG = "mn-brokers"
DESCRIPTION = "mn-brokers-0"
CAPACITY = 3  # each node's broker takes one slot
BROKER_S = 120  # three brokers started on a loaded machine


def _configuration() -> dict[str, Any]:
    config = debug_echo_configuration(CONFIG, NS, [DESCRIPTION], CAPACITY)
    service = {"type": "ClusterIP", "ports": [{"name": "http", "port": 8080}]}
    config["spec"] |= {
        "brokerSpec": {
            "brokerPodSpec": {
                "terminationGracePeriodSeconds": 1,
                "tolerations": [EXTRA_NODE_TOLERATION],
                "containers": [
                    {
                        "name": "broker",
                        "image": "docker.io/library/busybox:latest",
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "sleep 3600"],
                        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
                    }
                ],
            }
        },
        "instanceServiceSpec": service,
        "configurationServiceSpec": service,
    }
    return config


@pytest.fixture(scope="module")
def fleet(
    multi_node_cluster: list[dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("multinode-brokers")
    f = Fleet(
        multi_node_cluster,
        tmp,
        namespace=NS,
        configuration=CONFIG,
        device_id=DESCRIPTION,
        capacity=CAPACITY,
        handler_args=debug_echo_args(tmp / "availability"),
    )
    with f.running_with(_configuration()):
        yield f


def _brokers(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """The Instance's broker Pods by their target node (the label the controller gives them)."""
    items = fleet.kubectl.json(
        "get", "pods", "-n", NS, "-l", f"{naming.LABEL_INSTANCE}={fleet.instance}"
    )["items"]
    return {p["metadata"]["labels"][naming.LABEL_TARGET_NODE]: p for p in items}


def _running_brokers(fleet: Fleet) -> dict[str, dict[str, Any]] | None:
    """Every node's broker, once each is Running (else None)."""
    brokers = _brokers(fleet)
    running = {
        node: p
        for node, p in brokers.items()
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }
    return running if sorted(running) == sorted(fleet.names) else None


def _ready_endpoints(fleet: Fleet, service: str) -> set[str]:
    """The addresses the Service's EndpointSlices list as ready."""
    slices = fleet.kubectl.json(
        "get", "endpointslices", "-n", NS, "-l", f"kubernetes.io/service-name={service}"
    )["items"]
    return {
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for address in e["addresses"]
    }


def _endpoints_are(fleet: Fleet, service: str, ips: set[str]) -> bool:
    return _ready_endpoints(fleet, service) == ips


def _services(fleet: Fleet) -> tuple[str, str]:
    return names.instance_service_name(fleet.instance), names.configuration_service_name(CONFIG)


def test_one_broker_per_node_each_running_on_its_node(fleet: Fleet) -> None:
    brokers = until(lambda: _running_brokers(fleet), BROKER_S, "a Running broker on every node")
    addresses = {n["AKRI_TRIO_NODE_NAME"]: n["AKRI_TRIO_NODE_ADDRESS"] for n in fleet.nodes}
    for node, pod in brokers.items():
        assert pod["spec"]["nodeName"] == node  # the scheduler put it where it is pinned
        assert pod["status"]["hostIP"] == addresses[node]  # and that node's kubelet runs it
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    # Each broker took its slot of the device on its own node.
    assert sorted(fleet.held().values()) == sorted(fleet.names)


def test_both_services_select_every_broker(fleet: Fleet) -> None:
    brokers = until(lambda: _running_brokers(fleet), BROKER_S, "a Running broker on every node")
    ips = {p["status"]["podIP"] for p in brokers.values()}
    assert len(ips) == 3, ips  # each node's Pod network is its own
    for service in _services(fleet):
        until(partial(_endpoints_are, fleet, service, ips), 60, f"{service}: 3 brokers")


def test_a_lost_nodes_broker_goes_and_the_services_drop_it(fleet: Fleet) -> None:
    """Node 3 is lost (its agent SIGKILLed, its kubelet and runtime stopped): once the
    controller has removed it from the Instance, it deletes the node's broker, and neither
    Service lists it as ready; the other two brokers keep running, the same Pods. `node start`
    and a new agent bring a broker back on node 3 and into both Services."""
    before = until(lambda: _running_brokers(fleet), BROKER_S, "a Running broker on every node")
    lost = fleet.names[2]
    survivors = {node: p["metadata"]["uid"] for node, p in before.items() if node != lost}
    survivor_ips = {p["status"]["podIP"] for node, p in before.items() if node != lost}
    fleet.agents[2].kill()
    node_command("stop", lost)
    try:
        until(lambda: not fleet.ready(lost), NODE_LOSS_S, f"{lost} NotReady")
        until(lambda: lost not in fleet.instance_nodes(), 60, f"{lost} out of the Instance")
        until(
            lambda: (
                _brokers(fleet).get(lost, {}).get("metadata", {}).get("deletionTimestamp")
                or lost not in _brokers(fleet)
            ),
            60,
            f"the broker on {lost} deleted",
        )
        for service in _services(fleet):
            until(
                partial(_endpoints_are, fleet, service, survivor_ips),
                60,
                f"{service} without the lost node's broker",
            )
        after = _brokers(fleet)
        assert {node: after[node]["metadata"]["uid"] for node in survivors} == survivors
        assert all(after[node]["status"]["phase"] == "Running" for node in survivors)
        assert lost not in fleet.held().values()  # its broker's slot is free again
    finally:
        node_command("start", lost)
        fleet.agents[2].start()
    brokers = until(lambda: _running_brokers(fleet), BROKER_S, f"a broker on {lost} again")
    ips = {p["status"]["podIP"] for p in brokers.values()}
    for service in _services(fleet):
        until(partial(_endpoints_are, fleet, service, ips), 60, f"{service}: 3 again")
