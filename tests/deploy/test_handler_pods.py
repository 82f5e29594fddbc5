"""A standalone discovery handler as a Pod: the chart's debugEcho DaemonSet (`debugEcho.discovery`,
upstream's keys) beside an agent Pod that embeds no handler. With useNetworkConnection the
handler serves on POD_IP:10000 in its own network namespace and registers that address with the
agent over the registration socket in the host directory both mount; the agent (on the host
network here, see tests/support/release.py) discovers through it, and the devices become
Instances and device plugins on the node.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from akri_trio.model import naming
from tests.support.release import Release, release

pytestmark = pytest.mark.node

CONFIG = "shiph-echo"
DESCRIPTIONS = ("hd0", "hd1")
HANDLER = "akri-debug-echo-discovery"


@pytest.fixture(scope="module")
def rel(
    node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    with release(node_cluster, "shiph", tmp_path_factory.mktemp("chart")) as r:
        r.components = ("akri-agent", HANDLER)
        r.install(
            {
                "controller": {"enabled": False},
                "debugEcho": {
                    "configuration": {
                        "enabled": True,
                        "name": CONFIG,
                        "capacity": 1,
                        # only the handler Pod says so (from this key): an agent's embedded
                        # debugEcho would make unshared Instances
                        "shared": True,
                        "discoveryDetails": {"descriptions": list(DESCRIPTIONS)},
                    },
                    "discovery": {"enabled": True, "useNetworkConnection": True},
                },
            }
        )
        yield r


def instances(rel: Release) -> set[str]:
    return {naming.instance_name(CONFIG, naming.device_hash(d, None)) for d in DESCRIPTIONS}


def test_the_handler_runs_as_a_pod_of_its_own(rel: Release) -> None:
    pod = rel.until(lambda: rel.ready_pod(HANDLER), "the handler Pod Ready", seconds=120)
    spec = pod["spec"]
    assert not spec.get("hostNetwork")  # its own network namespace: POD_IP is its own
    assert spec["automountServiceAccountToken"] is False  # it talks to the agent only
    (c,) = spec["containers"]
    assert c["args"] == ["discovery-handler", "debugEcho"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    agent = rel.until(lambda: rel.ready_pod("akri-agent"), "the agent Pod Ready", seconds=120)
    env = {e["name"] for e in agent["spec"]["containers"][0].get("env") or []}
    assert "ENABLE_DEBUG_ECHO" not in env and "AKRI_EMBEDDED_HANDLERS" not in env


def test_its_devices_become_instances(rel: Release) -> None:
    pod = rel.until(lambda: rel.ready_pod(HANDLER), "the handler Pod Ready", seconds=120)
    ip = pod["status"]["podIP"]
    agent = rel.until(lambda: rel.ready_pod("akri-agent"), "the agent Pod Ready", seconds=120)
    # the agent took the registration of the handler's own address
    rel.until(
        lambda: (
            f"discovery handler debugEcho registered at http://{ip}:10000"
            in rel.logs(agent["metadata"]["name"])
        ),
        f"the handler registered at {ip}:10000",
    )
    rel.until(lambda: set(rel.usage()) == instances(rel), "the handler's devices as Instances")
    for inst in rel.get("instances.akri.sh", "-n", rel.namespace)["items"]:
        assert inst["spec"]["shared"] is True  # as the handler Pod was configured
        assert inst["spec"]["nodes"] == [rel.node]
        assert inst["spec"]["configurationName"] == CONFIG
    expected = {f"akri.sh/{i}": "1" for i in instances(rel)}
    rel.until(
        lambda: rel.allocatable(set(expected)) == expected, "the Instances' plugins on the node"
    )


def test_over_its_socket_after_an_upgrade(rel: Release) -> None:
    """Without useNetworkConnection the new handler Pod serves on a socket in the directory it
    shares with the agent, and the Instances stay."""
    rel.upgrade({"debugEcho": {"discovery": {"useNetworkConnection": False}}})
    agent = rel.until(lambda: rel.ready_pod("akri-agent"), "the agent Pod Ready", seconds=120)
    rel.until(
        lambda: (
            "discovery handler debugEcho registered at /var/lib/akri/debugEcho.sock"
            in rel.logs(agent["metadata"]["name"])
        ),
        "the handler registered over its socket",
        seconds=120,
    )
    (pod,) = rel.pods(HANDLER)
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env") or []}
    assert "POD_IP" not in env
    assert set(rel.usage()) == instances(rel)
    assert (rel.handlers_dir / "debugEcho.sock").is_socket()  # the host directory both mount


def test_uninstall_leaves_nothing(rel: Release) -> None:
    rel.uninstall()
    assert rel.get("instances.akri.sh", "-n", rel.namespace)["items"] == []
    rel.until(lambda: not rel.left(), "the namespace emptied")
    # the handler removed its socket on SIGTERM, the agent its registration socket
    rel.until(lambda: not list(rel.handlers_dir.glob("*.sock")), "the sockets removed")
