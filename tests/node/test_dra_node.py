"""DRA mode on a real node: the agent's ResourceSlices, the real scheduler allocating claims and
the real kubelet preparing them through the agent's DRA plugin and containerd's CDI (issue 15).

The agent runs as a real process scoped to this module's namespace, with the embedded debugEcho
handler; the test creates the Configuration's DeviceClass itself from `dra.device_class`. One
Configuration (capacity 2, two devices) serves the whole story, which runs in file order:
publish, consume, share, refuse, free, survive an agent restart, go offline and come back
within the offline grace.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from akri_trio import dra
from akri_trio.dra.checkpoint import decode
from akri_trio.model import naming
from tests.support.kubectl import Kubectl, claim_pod
from tests.support.node_agent import (
    AgentProcess,
    clear_namespace,
    debug_echo_configuration,
    dra_class_and_template,
    fresh_namespace,
    restart_kubelet,
)
from tests.support.polling import until

pytestmark = pytest.mark.node

NS = "akri-dra-node-e2e"
CONFIG = "dra-echo"
DESCRIPTIONS = ("d0", "d1")
TEMPLATE = "dra-echo-d0"  # a ResourceClaimTemplate: one device of the d0 Instance


class Env:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env = env
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.kubectl = Kubectl(env)
        self.root = Path(env["AKRI_TRIO_KUBELET_ROOT_DIR"])
        self.cdi = Path(env["AKRI_TRIO_CDI_DIR"])
        self.availability = tmp / "availability"
        self.tmp = tmp
        self.agent = AgentProcess(
            self.kubectl,
            tmp / "agent.log",
            [
                "--node-name",
                self.node,
                "--namespace",
                NS,
                "--allocation",
                "dra",
                "--kubelet-root-dir",
                str(self.root),
                "--cdi-dir",
                str(self.cdi),
                "--discovery-handlers-directory",
                str(tmp / "akri"),
                "--enable-debug-echo",
                "--debug-echo-availability",
                str(self.availability),
                "--metrics-port",
                "-1",
            ],
        )
        self.instances = {
            d: naming.instance_name(CONFIG, naming.device_hash(d, self.node)) for d in DESCRIPTIONS
        }
        self.pool = dra.node_pool(self.node, NS)
        self.consumable = dra.takes_consumable_capacity(
            json.loads(
                self.kubectl(
                    "create",
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                    stdin=json.dumps(dra.probe_slice()),
                )
            )
        )

    def start_agent(self) -> None:
        self.agent.start()

    def wait_registered(self) -> None:
        """Until the kubelet says it registered this run's plugin (before that a Pod's claim
        cannot be prepared and the kubelet keeps retrying)."""
        line = f"the kubelet registered DRA driver {dra.DRIVER}"
        until(lambda: line in self.agent.this_run(), what="the kubelet registered the plugin")

    def stop_agent(self) -> None:
        self.agent.stop()

    def slices(self) -> list[dict[str, Any]]:
        items = self.kubectl.json("get", "resourceslices")["items"]
        return [s for s in items if dra.pool_name_of(s) == self.pool]

    def devices(self) -> dict[str, dict[str, Any]]:
        """This module's pool at its newest generation: device name -> device."""
        slices = self.slices()
        newest = max((dra.generation_of(s) for s in slices), default=0)
        return {
            d["name"]: d
            for s in slices
            if dra.generation_of(s) == newest
            for d in s["spec"].get("devices", [])
        }

    def pod(self, name: str) -> None:
        script = "env | grep ^DEBUG_ECHO | sort; sleep 3600"
        self.kubectl.apply(claim_pod(name, NS, script, TEMPLATE))

    def pod_json(self, name: str) -> dict[str, Any]:
        return dict(self.kubectl.json("get", "pod", name, "-n", NS))

    def pod_phase(self, name: str) -> str:
        return str(self.pod_json(name).get("status", {}).get("phase", ""))

    def claim_uid(self, pod: str) -> str:
        (status,) = self.pod_json(pod)["status"]["resourceClaimStatuses"]
        claim = self.kubectl.json("get", "resourceclaim", status["resourceClaimName"], "-n", NS)
        return str(claim["metadata"]["uid"])

    def logs(self, name: str) -> dict[str, str]:
        out = self.kubectl("logs", name, "-n", NS)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def delete_pods(self, *names: str, wait: bool = True) -> None:
        self.kubectl(
            "delete", "pod", "-n", NS, f"--wait={str(wait).lower()}", "--timeout=60s", *names
        )

    def checkpoint(self) -> dict[str, Any]:
        path = self.root / "plugins" / dra.DRIVER / "checkpoint.json"
        return dict(decode(path.read_text())) if path.exists() else {}

    def spec_exists(self, uid: str) -> bool:
        return (self.cdi / dra.spec_file_name(uid)).exists()


@pytest.fixture(scope="module")
def e2e(node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    env = Env(node_cluster, tmp_path_factory.mktemp("dra-node-e2e"))
    fresh_namespace(env.kubectl, NS)
    dra_class_and_template(env.kubectl, NS, CONFIG, TEMPLATE, env.instances["d0"])
    env.start_agent()
    env.kubectl.apply(debug_echo_configuration(CONFIG, NS, DESCRIPTIONS, capacity=2))
    try:
        env.wait_registered()  # inside: an agent that never registers is stopped too
        yield env
    finally:
        clear_namespace(env.kubectl, NS, CONFIG, dra_class=True)
        env.stop_agent()


def test_the_node_pool_publishes_each_instance(e2e: Env) -> None:
    names = {
        dra.device_name(inst, slot)
        for inst in e2e.instances.values()
        for slot in ((None,) if e2e.consumable else (0, 1))
    }
    devices = until(
        lambda: e2e.devices() if set(e2e.devices()) == names else None,
        what=f"devices {sorted(names)}",
    )
    for description, inst in e2e.instances.items():
        attributes = devices[dra.device_name(inst, None if e2e.consumable else 0)]["attributes"]
        assert attributes["akri.sh/instance"] == {"string": inst}
        assert attributes["akri.sh/configuration"] == {"string": CONFIG}
        assert attributes["akri.sh/namespace"] == {"string": NS}
        assert attributes["akri.sh/DEBUG_ECHO_DESCRIPTION"] == {"string": description}
    (one,) = e2e.slices()  # two devices: one slice
    assert one["spec"]["nodeName"] == e2e.node


def test_a_pod_with_a_claim_runs_with_the_devices_env(e2e: Env) -> None:
    e2e.pod("first")
    until(lambda: e2e.pod_phase("first") == "Running", seconds=90, what="first Running")
    digest = e2e.instances["d0"].rsplit("-", 1)[1].upper()
    assert e2e.logs("first") == {
        "DEBUG_ECHO_DESCRIPTION": "d0",
        f"DEBUG_ECHO_DESCRIPTION_{digest}": "d0",
    }
    uid = e2e.claim_uid("first")
    assert e2e.spec_exists(uid)
    assert uid in e2e.checkpoint()


def test_a_second_pod_shares_the_instance_and_a_third_waits(e2e: Env) -> None:
    e2e.pod("second")
    until(lambda: e2e.pod_phase("second") == "Running", seconds=90, what="second Running")
    assert e2e.logs("second")["DEBUG_ECHO_DESCRIPTION"] == "d0"
    e2e.pod("third")

    def unschedulable() -> str:
        events = e2e.kubectl.json(
            "get", "events", "-n", NS, "--field-selector", "involvedObject.name=third"
        )["items"]
        return " ".join(e["message"] for e in events if e["reason"] == "FailedScheduling")

    reason = until(unschedulable, seconds=60, what="the scheduler's reason for third")
    assert "cannot allocate all claims" in reason
    assert e2e.pod_phase("third") == "Pending"


def test_deleting_a_pod_unprepares_and_frees_its_share(e2e: Env) -> None:
    uid = e2e.claim_uid("first")
    e2e.delete_pods("first")
    until(lambda: not e2e.spec_exists(uid), seconds=30, what="first's CDI spec removed")
    assert uid not in e2e.checkpoint()
    until(lambda: e2e.pod_phase("third") == "Running", seconds=90, what="third Running")


def test_agent_restart_between_prepare_and_unprepare_loses_nothing(e2e: Env) -> None:
    kept, dropped = e2e.claim_uid("third"), e2e.claim_uid("second")
    e2e.stop_agent()
    e2e.delete_pods("second", wait=False)  # the kubelet cannot unprepare: no plugin
    e2e.start_agent()
    e2e.wait_registered()
    until(lambda: not e2e.spec_exists(dropped), seconds=90, what="second's spec removed")
    until(lambda: dropped not in e2e.checkpoint(), seconds=10, what="second's record removed")
    assert e2e.spec_exists(kept) and kept in e2e.checkpoint()
    e2e.pod("fourth")  # third + fourth: the Instance's capacity, so second's share was freed
    until(lambda: e2e.pod_phase("fourth") == "Running", seconds=90, what="fourth Running")
    assert e2e.pod_phase("third") == "Running"


def _offline_taints(e2e: Env) -> dict[str, list[dict[str, str]]]:
    return {
        name: [{"key": t["key"], "effect": t["effect"]} for t in d.get("taints", [])]
        for name, d in e2e.devices().items()
    }


@pytest.mark.k8s_feature("DRADeviceTaints")
def test_offline_taints_the_devices_and_online_within_the_grace_untaints_them(e2e: Env) -> None:
    """debugEcho OFFLINE: the Instances go, their devices stay in the pool tainted NoSchedule
    (the grace is 300 s); the Pods running on them keep running with their claims. ONLINE
    within the grace: the same devices, untainted, the same claims."""
    names = set(e2e.devices())
    claims = {pod: e2e.claim_uid(pod) for pod in ("third", "fourth")}
    e2e.availability.write_text("OFFLINE")

    def every_device_tainted() -> dict[str, list[dict[str, str]]] | None:
        t = _offline_taints(e2e)
        return t if t and all(t.values()) else None

    taints = until(
        every_device_tainted,
        seconds=30,
        what="every device tainted akri.sh/offline",
    )
    assert set(taints) == names
    assert all(t == [dra.OFFLINE_TAINT] for t in taints.values())
    assert all(e2e.pod_phase(pod) == "Running" for pod in claims)
    e2e.availability.write_text("")
    until(
        lambda: (t := _offline_taints(e2e)) and set(t) == names and not any(t.values()),
        seconds=30,
        what="the devices published untainted again",
    )
    assert {pod: e2e.claim_uid(pod) for pod in claims} == claims
    assert all(e2e.pod_phase(pod) == "Running" for pod in claims)


def test_kubelet_restart_republishes_the_node_pool(e2e: Env) -> None:
    """Destructive (restarts the node's kubelet, which wipes the node's ResourceSlices at
    start), like test_agent_node's kubelet restart test."""
    until(lambda: e2e.slices(), what="the pool is published")
    before = {s["metadata"]["uid"] for s in e2e.slices()}
    restart_kubelet(e2e.env)
    until(
        lambda: e2e.slices() and not before & {s["metadata"]["uid"] for s in e2e.slices()},
        seconds=90,
        what="the pool published again after the kubelet wiped it",
    )
    e2e.delete_pods("third", "fourth")
    e2e.pod("after-kubelet")
    until(
        lambda: e2e.pod_phase("after-kubelet") == "Running",
        seconds=90,
        what="a pod with a claim runs after the kubelet restart",
    )
