"""Switching a running node from device-plugin mode to DRA mode and back on the real node: no
slot is held twice at any moment, the broker comes back with a claim (and, back, without one),
a Pod of the mode left keeps its slot until it ends, and the node's device-plugin resource goes
to 0; back in device-plugin mode a Pod of DRA mode holds its slot as the node's
`DX:<claim>:<node>` until it ends, cleanly (the agent serves its claim's unprepare), and the
DeviceClasses DRA mode left are deleted.

The agent (debugEcho embedded as `swEcho`, see tests/support/echo_agent.py) and the controller
run as real processes watching only this module's namespace, first in device-plugin mode, then
restarted with `--allocation dra` (what `helm upgrade --set allocation=dra` does to their
Pods), then restarted in device-plugin mode again. One Instance of capacity 2: a broker and a
user's Pod hold both slots before each switch. A sampler records, every half second through it
all, how many hold the device: the deviceUsage slots plus the claims allocated it for a Pod
that still exists (a claim and its `D:` record count once), never above 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from akri_trio import dra
from akri_trio.model import naming
from tests.support.holders import Holders
from tests.support.kubectl import Kubectl, busybox_pod
from tests.support.node_agent import fresh_namespace
from tests.support.polling import until
from tests.support.releases import lacks, skip

pytestmark = pytest.mark.node

NS = f"switch-node-{secrets.token_hex(3)}"
ECHO = "swEcho"
CONFIG = "sw-echo"
DESCRIPTION = "sw0"
CAPACITY = 2
REPO = Path(__file__).resolve().parents[2]
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"


class Env(Holders):
    """The module's processes, and the holders of its one Instance."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.node = env["AKRI_TRIO_NODE_NAME"]
        super().__init__(
            Kubectl(env),
            NS,
            naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, self.node)),
        )
        self.cluster = env
        self.proc_env = {**os.environ, "KUBECONFIG": env["KUBECONFIG"], "PYTHONUNBUFFERED": "1"}
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, args: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115  (closed with the process)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", *args], cwd=REPO, env=self.proc_env, stdout=log, stderr=log
        )

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def start(self, allocation: str) -> None:
        mode = ["--allocation", allocation]
        # Both modes: device-plugin mode reads the claims DRA mode left there.
        dra_args = [
            "--kubelet-root-dir", self.cluster["AKRI_TRIO_KUBELET_ROOT_DIR"],
            "--cdi-dir", self.cluster["AKRI_TRIO_CDI_DIR"],
        ]  # fmt: skip
        self.spawn(
            "agent",
            [
                "tests.support.echo_agent",
                "--echo-name", ECHO,
                "--node-name", self.node,
                "--namespace", NS,
                *mode, *dra_args,
                "--discovery-handlers-directory", str(self.tmp / "akri"),
                "--debug-echo-availability", str(self.tmp / "availability"),
                "--metrics-port", "-1",
                "--reclaim-period", "1",
                "--reclaim-grace", "3",
            ],
        )  # fmt: skip
        self.spawn(
            "controller",
            [
                "akri_trio", "controller", *mode,
                "--namespace", NS,
                "--no-leader-elect",
                "--metrics-port", "-1",
            ],
        )  # fmt: skip

    def brokers(self) -> list[dict[str, Any]]:
        items = self.get("pods", "-n", NS, "-l", naming.LABEL_INSTANCE).get("items", [])
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def allocatable(self) -> str | None:
        node = self.get("node", self.node)
        value = (node.get("status") or {}).get("allocatable", {}).get(f"akri.sh/{self.instance}")
        return None if value is None else str(value)


def _config() -> dict[str, Any]:
    container = {
        "name": "broker",
        "image": "docker.io/library/busybox:latest",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SLEEP],
        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
    }
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": CONFIG, "namespace": NS},
        "spec": {
            "discoveryHandler": {
                "name": ECHO,
                "discoveryDetails": yaml.safe_dump({"descriptions": [DESCRIPTION]}),
            },
            "capacity": CAPACITY,
            "brokerSpec": {
                "brokerPodSpec": {"containers": [container], "terminationGracePeriodSeconds": 1}
            },
        },
    }


@pytest.fixture(scope="module")
def env(node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(node_cluster, tmp_path_factory.mktemp("switch-node"))
    fresh_namespace(e.kubectl, NS)
    try:
        e.start("device-plugin")
        with e.sampling():
            yield e
    finally:
        e.kubectl("delete", "pods", "--all", "-n", NS, "--wait=true", "--timeout=60s", check=False)
        e.kubectl(
            "delete", "configurations.akri.sh", "--all", "-n", NS, "--wait=false", check=False
        )
        with contextlib.suppress(AssertionError):
            until(
                lambda: not e.get("instances.akri.sh", "-n", NS).get("items", [1]),
                seconds=30,
                what="the Instance gone",
            )
        for name in list(e.procs):
            e.stop(name)
        e.kubectl("delete", "deviceclass", dra.device_class_name(CONFIG, NS), check=False)
        e.kubectl("delete", "deviceclass", dra.instance_class_name(e.instance, NS), check=False)
        e.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def test_in_device_plugin_mode_a_broker_and_a_pod_hold_both_slots(env: Env) -> None:
    config = json.dumps(_config())
    until(lambda: env.kubectl("apply", "-f", "-", stdin=config, check=False), what="applied")
    (broker,) = until(env.brokers, seconds=120, what="the broker Pod")
    name = broker["metadata"]["name"]
    until(lambda: env.phase(name) == "Running", seconds=120, what="the broker Running")
    pod = busybox_pod("user-dp", NS, SLEEP, {f"akri.sh/{env.instance}": 1})
    until(lambda: env.kubectl("apply", "-f", "-", stdin=json.dumps(pod), check=False))
    until(lambda: env.phase("user-dp") == "Running", seconds=120, what="user-dp Running")
    assert len(env.usage()) == CAPACITY


def test_after_the_switch_the_broker_comes_back_with_a_claim(env: Env) -> None:
    (old,) = env.brokers()
    env.stop("controller")
    env.stop("agent")
    env.start("dra")
    # The node's device-plugin resource is gone from what the scheduler counts.
    until(lambda: env.allocatable() in (None, "0"), seconds=120, what="akri.sh resource at 0")

    def new_broker() -> dict[str, Any] | None:
        brokers = [b for b in env.brokers() if b["metadata"]["uid"] != old["metadata"]["uid"]]
        return brokers[0] if len(brokers) == 1 else None

    broker = until(new_broker, seconds=180, what="the broker made again")
    name = broker["metadata"]["name"]
    assert [c["name"] for c in broker["spec"]["resourceClaims"]] == ["akri"]
    # It runs once the old broker's slot is freed (the reclaimer), with the other still held.
    until(lambda: env.phase(name) == "Running", seconds=180, what="the new broker Running")
    assert env.phase("user-dp") == "Running"
    assert list(env.usage().values()) == [env.node]  # user-dp's slot, still held


@pytest.mark.k8s_feature("DRAExtendedResource")  # the Pod asks for akri.sh/<instance>
def test_a_new_pod_waits_for_the_slot_the_old_pod_holds(env: Env) -> None:
    pod = busybox_pod("user-dra", NS, SLEEP, {f"akri.sh/{env.instance}": 1})
    until(lambda: env.kubectl("apply", "-f", "-", stdin=json.dumps(pod), check=False))
    env.wait_unschedulable("user-dra", "user-dp holds the slot")
    env.kubectl("delete", "pod", "user-dp", "-n", NS, "--wait=true", "--timeout=60s")
    until(lambda: env.phase("user-dra") == "Running", seconds=180, what="user-dra Running")
    assert env.usage() == {}


def test_back_in_device_plugin_mode_the_claims_hold_their_slots_as_the_nodes(env: Env) -> None:
    (old,) = env.brokers()
    env.stop("controller")
    env.stop("agent")
    env.start("device-plugin")
    # No DeviceClass left: nothing asking for akri.sh/... is allocated through DRA any more.
    classes = (dra.device_class_name(CONFIG, NS), dra.instance_class_name(env.instance, NS))
    until(
        lambda: not any(env.get("deviceclass", c) for c in classes),
        seconds=60,
        what="the DeviceClasses deleted",
    )

    def new_broker() -> dict[str, Any] | None:
        brokers = [b for b in env.brokers() if b["metadata"]["uid"] != old["metadata"]["uid"]]
        return brokers[0] if len(brokers) == 1 else None

    # The DRA broker ends (its claim unprepared by this agent), a device-plugin one takes its
    # slot, and user-dra keeps its own, recorded as this node's.
    broker = until(new_broker, seconds=180, what="the broker made again")
    name = broker["metadata"]["name"]
    assert "resourceClaims" not in broker["spec"]
    uids = {p["metadata"]["uid"] for p in env.get("pods", "-n", NS).get("items", [])}
    assert old["metadata"]["uid"] not in uids  # gone, not stuck Terminating (same name)
    until(lambda: env.phase(name) == "Running", seconds=180, what="the new broker Running")
    missing = lacks(env.cluster, "DRAExtendedResource")
    if missing:  # no user-dra: it asks for akri.sh/<instance>
        skip(f"user-dra's slot was not checked: {missing}")
    assert env.phase("user-dra") == "Running"
    # DX: the claim was made for user-dra's akri.sh/<instance>, which the scheduler counts.
    (claim,) = env.allocated()
    assert sorted(env.usage().values()) == sorted([env.node, f"DX:{claim}:{env.node}"])


@pytest.mark.k8s_feature("DRAExtendedResource")  # user-dra asks for akri.sh/<instance>
def test_a_dra_pod_ends_cleanly_and_a_device_plugin_pod_takes_its_slot(env: Env) -> None:
    pod = busybox_pod("user-dp2", NS, SLEEP, {f"akri.sh/{env.instance}": 1})
    until(lambda: env.kubectl("apply", "-f", "-", stdin=json.dumps(pod), check=False))
    env.wait_unschedulable("user-dp2", "user-dra holds the slot")
    # Ends (not stuck Terminating): the device-plugin-mode agent unprepares its claim.
    env.kubectl("delete", "pod", "user-dra", "-n", NS, "--wait=true", "--timeout=60s")
    until(lambda: env.phase("user-dp2") == "Running", seconds=180, what="user-dp2 Running")
    assert list(env.usage().values()) == [env.node, env.node]
    registration = Path(env.cluster["AKRI_TRIO_KUBELET_ROOT_DIR"], "plugins_registry")
    until(
        lambda: not (registration / f"{dra.DRIVER}-reg.sock").exists(),
        seconds=30,
        what="the agent's DRA plugin stopped, its last claim unprepared",
    )


def test_no_slot_was_held_twice(env: Env) -> None:
    assert env.samples > 10
    assert env.most == CAPACITY, env.when_most  # both slots were held, never more
