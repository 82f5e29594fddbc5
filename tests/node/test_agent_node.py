"""The agent on a real node: a real kubelet, containerd and pods (issue: agent, §6).

The agent runs as a real process (so restarts are real), with the embedded debugEcho handler
and a short reclaim grace; Pods are real busybox containers whose logs show what Allocate gave
them. One module-scoped Configuration (capacity 2, two devices) serves the whole story, which
runs in file order: offer, consume, map, refuse, reclaim, survive restarts, go offline.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from akri_trio.model import naming
from tests.support.kubectl import Kubectl, busybox_pod, free_port
from tests.support.node_agent import (
    AgentProcess,
    clear_namespace,
    debug_echo_configuration,
    fresh_namespace,
    restart_kubelet,
)
from tests.support.polling import until

pytestmark = pytest.mark.node

NS = "akri-node-e2e"
CONFIG = "e2e-echo"
DESCRIPTIONS = ("d0", "d1")


class Env:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env = env
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self._kubectl = Kubectl(env)
        self.availability = tmp / "availability"
        self.metrics_port = free_port()
        self.agent = AgentProcess(
            self._kubectl,
            tmp / "agent.log",
            [
                "--node-name",
                self.node,
                "--discovery-handlers-directory",
                str(tmp / "akri"),
                "--enable-debug-echo",
                "--debug-echo-availability",
                str(self.availability),
                "--metrics-port",
                str(self.metrics_port),
                "--reclaim-period",
                "1",
                "--reclaim-grace",
                "3",
            ],
        )
        self.instances = {
            d: naming.instance_name(CONFIG, naming.device_hash(d, self.node)) for d in DESCRIPTIONS
        }

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self._kubectl(*args, stdin=input, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def start_agent(self) -> None:
        self.agent.start()

    def stop_agent(self) -> None:
        self.agent.stop()

    def metric(self, name: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"metric {name} not exported")

    def wait_registered(self, plugins: int = 3) -> None:
        """Until the agent's plugins are registered with the kubelet: a Pod admitted before
        that fails with UnexpectedAdmissionError (the node's allocatable lags behind)."""

        def registered() -> bool:
            try:
                return self.metric("akri_device_plugins_registered") == plugins
            except OSError:  # the metrics server is not up yet
                return False

        until(registered, what=f"{plugins} plugins registered")

    def allocatable(self) -> dict[str, str]:
        """This test's akri.sh resources (the kubelet keeps every extended resource it ever saw,
        at 0 once its plugin is gone, so other tests' leftovers are filtered out)."""
        node = self.json("get", "node", self.node)
        ours = {f"akri.sh/{i}" for i in self.instances.values()} | {f"akri.sh/{CONFIG}"}
        return {k: v for k, v in node["status"]["allocatable"].items() if k in ours}

    def usage(self) -> dict[str, dict[str, str]]:
        items = self.json("get", "instances.akri.sh", "-n", NS)["items"]
        return {i["metadata"]["name"]: i["spec"].get("deviceUsage", {}) for i in items}

    def pod(self, name: str, resources: dict[str, int]) -> None:
        script = "env | grep ^DEBUG_ECHO | sort; sleep 3600"
        self._kubectl.apply(busybox_pod(name, NS, script, resources))

    def pod_phase(self, name: str) -> str:
        return str(self.json("get", "pod", name, "-n", NS).get("status", {}).get("phase", ""))

    def logs(self, name: str) -> dict[str, str]:
        out = self.kubectl("logs", name, "-n", NS)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def delete_pods(self, *names: str) -> None:
        self.kubectl("delete", "pod", "-n", NS, "--wait=true", "--timeout=60s", *names)


@pytest.fixture(scope="module")
def e2e(node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    env = Env(node_cluster, tmp_path_factory.mktemp("node-e2e"))
    fresh_namespace(env._kubectl, NS)
    env.start_agent()
    env._kubectl.apply(debug_echo_configuration(CONFIG, NS, DESCRIPTIONS, capacity=2))
    env.wait_registered()
    try:
        yield env
    finally:
        clear_namespace(env._kubectl, NS, CONFIG)
        env.stop_agent()


def test_node_offers_instance_and_configuration_resources(e2e: Env) -> None:
    expected = {f"akri.sh/{i}": "2" for i in e2e.instances.values()} | {f"akri.sh/{CONFIG}": "2"}
    until(lambda: e2e.allocatable() == expected, what=f"allocatable == {expected}")


def test_pod_gets_one_device_with_its_env(e2e: Env) -> None:
    inst = e2e.instances["d0"]
    e2e.pod("one", {f"akri.sh/{inst}": 1})
    until(lambda: e2e.pod_phase("one") == "Running", what="pod one Running")
    digest = inst.rsplit("-", 1)[1].upper()
    assert e2e.logs("one") == {
        "DEBUG_ECHO_DESCRIPTION": "d0",
        f"DEBUG_ECHO_DESCRIPTION_{digest}": "d0",
    }
    assert list(e2e.usage()[inst].values()) == [e2e.node]


def test_pod_asking_two_of_the_configuration_gets_two_devices(e2e: Env) -> None:
    e2e.pod("two", {f"akri.sh/{CONFIG}": 2})
    until(lambda: e2e.pod_phase("two") == "Running", what="pod two Running")
    hashed = {k: v for k, v in e2e.logs("two").items() if k.startswith("DEBUG_ECHO_DESCRIPTION_")}
    assert sorted(hashed.values()) == ["d0", "d1"]  # two different devices


def test_three_of_two_devices_does_not_start(e2e: Env) -> None:
    e2e.pod("three", {f"akri.sh/{CONFIG}": 3})
    time.sleep(5)
    assert e2e.pod_phase("three") in ("Pending", "Failed")
    e2e.delete_pods("three")


def test_deleted_pods_slots_are_reclaimed(e2e: Env) -> None:
    assert any(e2e.usage().values())
    e2e.delete_pods("one", "two")
    until(lambda: not any(e2e.usage().values()), seconds=30, what="deviceUsage empty")
    expected = {f"akri.sh/{i}": "2" for i in e2e.instances.values()} | {f"akri.sh/{CONFIG}": "2"}
    until(lambda: e2e.allocatable() == expected, what="all slots offered again")


def test_kubelet_restart_brings_the_plugins_back(e2e: Env) -> None:
    registrations = e2e.metric("akri_device_plugin_registrations_total")
    restart_kubelet(e2e.env)
    # The new kubelet wipes the plugin sockets: all three plugins must register again (a Pod
    # admitted before that fails with UnexpectedAdmissionError: the kubelet's own race).
    until(
        lambda: e2e.metric("akri_device_plugin_registrations_total") >= registrations + 3,
        what="the plugins registered again",
    )
    inst = e2e.instances["d1"]
    e2e.pod("after-kubelet", {f"akri.sh/{inst}": 1})
    until(
        lambda: e2e.pod_phase("after-kubelet") == "Running",
        seconds=90,
        what="a pod runs after the kubelet restart",
    )
    e2e.delete_pods("after-kubelet")


def test_agent_restart_loses_and_doubles_no_claim(e2e: Env) -> None:
    inst = e2e.instances["d0"]
    e2e.pod("keeper", {f"akri.sh/{inst}": 1})
    until(lambda: e2e.pod_phase("keeper") == "Running", what="keeper Running")
    before = e2e.usage()[inst]
    e2e.stop_agent()
    e2e.start_agent()
    e2e.wait_registered()
    e2e.pod("second", {f"akri.sh/{inst}": 1})
    until(lambda: e2e.pod_phase("second") == "Running", seconds=90, what="second Running")
    after = e2e.usage()[inst]
    assert set(before.items()) < set(after.items())  # the keeper's claim survived
    assert sorted(after) == [f"{inst}-0", f"{inst}-1"]  # and the second got the other slot
    e2e.delete_pods("keeper", "second")


def test_offline_removes_devices_and_restore_brings_them_back(e2e: Env) -> None:
    e2e.availability.write_text("OFFLINE")
    until(lambda: not e2e.usage(), seconds=30, what="Instances gone")
    until(lambda: all(v == "0" for v in e2e.allocatable().values()), what="allocatable 0")
    e2e.availability.write_text("")
    e2e.wait_registered()
    until(lambda: len(e2e.usage()) == 2, seconds=30, what="Instances back")
    expected = {f"akri.sh/{i}": "2" for i in e2e.instances.values()} | {f"akri.sh/{CONFIG}": "2"}
    until(lambda: e2e.allocatable() == expected, what="resources offered again")
