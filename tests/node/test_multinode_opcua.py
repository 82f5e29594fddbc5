"""A real network peer shared by three real kubelets: one OPC UA server, found by the opcua
handler embedded in the agent of every node, is one shared device whose two slots are one
budget for the fleet.

The server is the asyncua one the OPC UA handler tests run (tests/support/opcua_server.py), on
the host, where each node's agent reaches it; the agents and the controller run as processes
(tests/support/fleet.py). The story runs in file order, as with debugEcho
(test_multinode_slots.py): every node is in the one Instance; of five Pods spread over the
nodes exactly two run; deleting one lets exactly one more run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.fleet import Fleet, five_pods_two_run, one_more_runs_after_a_delete
from tests.support.kubectl import free_port
from tests.support.opcua_server import endpoint, serving

NS = "akri-multinode-opcua"
CONFIG = "mn-opcua"
SERVER = "mn-opcua-server"
CAPACITY = 2


def _configuration(port: int) -> dict[str, Any]:
    method = {"standard": {"discoveryUrls": [f"opc.tcp://127.0.0.1:{port}/"]}}
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": CONFIG, "namespace": NS},
        "spec": {
            "discoveryHandler": {
                "name": "opcua",
                "discoveryDetails": yaml.safe_dump({"opcuaDiscoveryMethod": method}),
            },
            "capacity": CAPACITY,
        },
    }


@pytest.fixture(scope="module")
def fleet(
    multi_node_cluster: list[dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("multinode-opcua")
    port = free_port()
    f = Fleet(
        multi_node_cluster,
        tmp,
        namespace=NS,
        configuration=CONFIG,
        device_id=endpoint(SERVER, port),
        capacity=CAPACITY,
        handler_args=["--embedded-handler", "opcua"],
    )
    with serving(tmp, SERVER, port), f.running_with(_configuration(port)):
        yield f


def test_every_node_sees_the_server_as_one_shared_device(fleet: Fleet) -> None:
    """One Instance (named from the server's endpoint URL) lists all three nodes."""
    spec = fleet.instance_spec()
    assert spec["shared"] is True
    assert spec["brokerProperties"]["OPCUA_DISCOVERY_URL"].endswith(f"/akri/{SERVER}/")
    assert fleet.instance_nodes() == sorted(fleet.names)
    assert not fleet.held()


def test_of_five_pods_spread_over_the_nodes_exactly_two_run(fleet: Fleet) -> None:
    five_pods_two_run(fleet)


def test_deleting_a_running_pod_lets_exactly_one_more_run(fleet: Fleet) -> None:
    one_more_runs_after_a_delete(fleet)
