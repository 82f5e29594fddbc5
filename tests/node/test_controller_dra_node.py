"""DRA mode for a SHARED device on a real node: the controller publishes its pool, the scheduler
allocates from it, the agent's kubelet plugin prepares it (issue 15, the shared case).

The agent (`--allocation dra`, debugEcho shared) and the controller (`--allocation dra`) run as
real processes scoped to this module's namespace; the kubelet, scheduler, controller-manager
and containerd are the cluster's. Nothing here writes a DeviceClass, slice or claim template:
the controller does. The story runs in file order: the class and the shared pool appear, a
broker and a user's Pod run with the device's env, a third consumer waits for capacity, plain
Pods asking Akri's extended resources (`akri.sh/<configuration>`, `akri.sh/<instance>`) in
their limits run with it too, the device goes offline (tainted in its pool) and comes back
(untainted), and the Configuration's deletion removes its classes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from akri_trio import dra
from akri_trio.model import naming
from tests.support.kubectl import Kubectl, busybox_pod
from tests.support.node_agent import (
    AgentProcess,
    clear_namespace,
    debug_echo_configuration,
    fresh_namespace,
)
from tests.support.polling import until

pytestmark = pytest.mark.node

NS = "akri-dra-shared-e2e"
CONFIG = "dra-shared"
DESCRIPTION = "s0"
TEMPLATE = "dra-shared-s0"  # the user's ResourceClaimTemplate: one device of the s0 Instance
SCRIPT = "env | grep ^DEBUG_ECHO | sort; sleep 3600"
REPO = Path(__file__).resolve().parents[2]


class Env:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.kubectl = Kubectl(env)
        self.tmp = tmp
        self.availability = tmp / "availability"
        self.agent = AgentProcess(
            self.kubectl,
            tmp / "agent.log",
            [
                "--node-name", self.node,
                "--namespace", NS,
                "--allocation", "dra",
                "--kubelet-root-dir", env["AKRI_TRIO_KUBELET_ROOT_DIR"],
                "--cdi-dir", env["AKRI_TRIO_CDI_DIR"],
                "--discovery-handlers-directory", str(tmp / "akri"),
                "--enable-debug-echo",
                "--debug-echo-shared",
                "--debug-echo-availability", str(self.availability),
                "--metrics-port", "-1",
            ],
        )  # fmt: skip
        self.controller: subprocess.Popen[bytes] | None = None
        self.instance = naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, None))
        self.pool = dra.shared_pool(NS, self.instance)
        self.device_class = dra.device_class_name(CONFIG, NS)
        self.instance_class = dra.instance_class_name(self.instance, NS)

    def start_controller(self) -> None:
        log = open(self.tmp / "controller.log", "ab")  # noqa: SIM115  (closed with the process)
        self.controller = subprocess.Popen(
            [
                sys.executable, "-m", "akri_trio", "controller",
                "--allocation", "dra",
                "--namespace", NS,
                "--no-leader-elect",
                "--metrics-port", "-1",
            ],
            cwd=REPO,
            env={**self.kubectl.environ, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=log,
        )  # fmt: skip

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.controller.send_signal(signal.SIGTERM)
            self.controller.wait(timeout=15)
            self.controller = None

    def slices(self) -> list[dict[str, Any]]:
        items = self.kubectl.json("get", "resourceslices")["items"]
        return [s for s in items if dra.pool_name_of(s) == self.pool]

    def classes(self) -> list[str]:
        items = self.kubectl.json("get", "deviceclasses")["items"]
        ours = (self.device_class, self.instance_class)
        return [c["metadata"]["name"] for c in items if c["metadata"]["name"] in ours]

    def offline_taints(self) -> list[list[dict[str, str]]]:
        """Per device of the pool, its taints (key and effect)."""
        return [
            [{"key": t["key"], "effect": t["effect"]} for t in d.get("taints", [])]
            for s in self.slices()
            for d in s["spec"]["devices"]
        ]

    def extended_pod(self, name: str, resource: str) -> None:
        """A Pod written for device-plugin mode: Akri's resource in its limits, no claim."""
        pod = busybox_pod(name, NS, SCRIPT)
        pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
        self.kubectl.apply(pod)

    def pod(self, name: str) -> None:
        pod = busybox_pod(name, NS, SCRIPT)
        pod["spec"]["resourceClaims"] = [{"name": "echo", "resourceClaimTemplateName": TEMPLATE}]
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "echo"}]}
        self.kubectl.apply(pod)

    def pod_json(self, name: str) -> dict[str, Any]:
        return dict(self.kubectl.json("get", "pod", name, "-n", NS))

    def phase(self, name: str) -> str:
        return str(self.pod_json(name).get("status", {}).get("phase", ""))

    def brokers(self) -> list[str]:
        items = self.kubectl.json("get", "pods", "-n", NS, "-l", naming.LABEL_INSTANCE)["items"]
        return [p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")]

    def logs(self, name: str) -> dict[str, str]:
        out = self.kubectl("logs", name, "-n", NS)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _broker() -> dict[str, Any]:
    container = {
        "name": "broker",
        "image": "docker.io/library/busybox:latest",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SCRIPT],
        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
    }
    return {"brokerPodSpec": {"containers": [container], "terminationGracePeriodSeconds": 1}}


@pytest.fixture(scope="module")
def e2e(node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    env = Env(node_cluster, tmp_path_factory.mktemp("dra-shared-e2e"))
    fresh_namespace(env.kubectl, NS)
    env.kubectl.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": NS},
            "spec": {"spec": dra.claim_spec(CONFIG, NS, env.instance)},
        }
    )
    env.agent.start()
    env.start_controller()
    config = debug_echo_configuration(CONFIG, NS, (DESCRIPTION,), capacity=2)
    config["spec"]["brokerSpec"] = _broker()
    env.kubectl.apply(config)
    line = f"the kubelet registered DRA driver {dra.DRIVER}"
    try:  # the wait inside: an agent that never registers is stopped too
        until(lambda: line in env.agent.this_run(), what="the kubelet registered the plugin")
        yield env
    finally:
        clear_namespace(env.kubectl, NS, CONFIG)
        env.stop_controller()
        env.agent.stop()
        env.kubectl("delete", "deviceclass", env.device_class, env.instance_class, check=False)
        env.kubectl("delete", "resourceclaimtemplate", TEMPLATE, "-n", NS, check=False)
        for s in env.slices():
            env.kubectl("delete", "resourceslice", s["metadata"]["name"], check=False)


def test_the_controller_publishes_the_class_and_the_shared_pool(e2e: Env) -> None:
    until(e2e.classes, what=f"DeviceClass {e2e.device_class}")
    (one,) = until(e2e.slices, what=f"the shared pool {e2e.pool}")
    assert "nodeName" not in one["spec"]
    (term,) = one["spec"]["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": dra.HOSTNAME_LABEL, "operator": "In", "values": [e2e.node]}
    ]
    for device in one["spec"]["devices"]:
        assert device["attributes"]["akri.sh/instance"] == {"string": e2e.instance}
    # The agent publishes no node pool for a shared Instance.
    node_pool = dra.node_pool(e2e.node, NS)
    items = e2e.kubectl.json("get", "resourceslices")["items"]
    assert not [s for s in items if dra.pool_name_of(s) == node_pool and s["spec"].get("devices")]


def test_the_broker_runs_with_its_claimed_device(e2e: Env) -> None:
    (broker,) = until(e2e.brokers, what="the broker Pod")
    until(lambda: e2e.phase(broker) == "Running", seconds=90, what=f"{broker} Running")
    spec = e2e.pod_json(broker)["spec"]
    assert spec["resourceClaims"][0]["resourceClaimTemplateName"] == f"{e2e.instance}-claim"
    assert until(lambda: e2e.logs(broker)).get("DEBUG_ECHO_DESCRIPTION") == DESCRIPTION


def test_a_users_pod_selecting_the_instance_runs_with_its_env(e2e: Env) -> None:
    e2e.pod("user")
    until(lambda: e2e.phase("user") == "Running", seconds=90, what="user Running")
    assert until(lambda: e2e.logs("user")).get("DEBUG_ECHO_DESCRIPTION") == DESCRIPTION


def test_a_third_consumer_waits_for_capacity(e2e: Env) -> None:
    e2e.pod("third")

    def unschedulable() -> bool:
        conditions = e2e.pod_json("third").get("status", {}).get("conditions", [])
        return any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in conditions
        )

    until(unschedulable, seconds=60, what="the third Pod unschedulable")
    assert e2e.phase("third") == "Pending"
    e2e.kubectl("delete", "pod", "user", "-n", NS, "--wait=true", "--timeout=60s")
    until(lambda: e2e.phase("third") == "Running", seconds=120, what="third Running once freed")
    e2e.kubectl("delete", "pod", "third", "-n", NS, "--wait=false")


@pytest.mark.k8s_feature("DRAExtendedResource")
def test_the_classes_name_akris_extended_resources(e2e: Env) -> None:
    until(lambda: len(e2e.classes()) == 2, what=f"DeviceClass {e2e.instance_class}")
    for name, resource in (
        (e2e.device_class, f"akri.sh/{CONFIG}"),
        (e2e.instance_class, f"akri.sh/{e2e.instance}"),
    ):
        spec = e2e.kubectl.json("get", "deviceclass", name)["spec"]
        assert spec["extendedResourceName"] == resource


@pytest.mark.k8s_feature("DRAExtendedResource")
@pytest.mark.parametrize("level", ["configuration", "instance"])
def test_a_plain_pod_asking_akris_resource_runs_with_the_device(e2e: Env, level: str) -> None:
    """`akri.sh/<configuration>: 1` and `akri.sh/<instance>: 1`, unchanged from device-plugin
    mode: the scheduler allocates the device through the class's claim, the agent prepares it."""
    until(lambda: "third" not in e2e.kubectl("get", "pods", "-n", NS, "-o", "name"), seconds=60)
    name = f"extended-{level}"
    resource = f"akri.sh/{CONFIG if level == 'configuration' else e2e.instance}"
    e2e.extended_pod(name, resource)
    until(lambda: e2e.phase(name) == "Running", seconds=90, what=f"{name} Running")
    assert until(lambda: e2e.logs(name)).get("DEBUG_ECHO_DESCRIPTION") == DESCRIPTION
    status = e2e.pod_json(name)["status"]["extendedResourceClaimStatus"]
    claim = e2e.kubectl.json("get", "resourceclaim", status["resourceClaimName"], "-n", NS)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == dra.DRIVER and result["pool"] == e2e.pool
    e2e.kubectl("delete", "pod", name, "-n", NS, "--wait=true", "--timeout=60s")


@pytest.mark.k8s_feature("DRADeviceTaints")
def test_offline_taints_the_shared_pool_and_online_untaints_it(e2e: Env) -> None:
    """debugEcho OFFLINE: the Instance goes, its device stays in the pool tainted NoSchedule
    for the offline grace (300 s); ONLINE within it: the same device, untainted."""
    e2e.availability.write_text("OFFLINE")
    until(lambda: e2e.offline_taints() == [[dra.OFFLINE_TAINT]], seconds=60, what="tainted")
    e2e.availability.write_text("")
    until(lambda: e2e.offline_taints() == [[]], seconds=60, what="untainted")


def test_deleting_the_configuration_removes_its_classes_and_its_pool(e2e: Env) -> None:
    """Its Instance goes with it, and nothing will bring its devices back: no offline grace
    (that is for a device that may return), the classes and the shared pool go at once."""
    e2e.kubectl("delete", "configurations.akri.sh", CONFIG, "-n", NS, "--wait=true")
    until(lambda: not e2e.classes(), seconds=60, what="the DeviceClasses gone")
    until(lambda: not e2e.slices(), seconds=60, what="the pool gone at once")
