"""The controller on a real node: upstream's end-to-end scenario, with real brokers.

The agent (with debugEcho embedded under the name `ctlEcho`, see tests/support/echo_agent.py)
and two controllers run as real processes, watching only this module's namespace; brokers are
busybox Pods on the real kubelet that print their environment. The story runs in file order:
brokers and Services appear, a deleted broker comes back, devices go offline and return, the
leader is killed and the standby takes over, Job brokers run per generation, and deleting the
Configurations removes everything.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from akri_trio.model import naming
from tests.support.polling import until

pytestmark = pytest.mark.node

NS = f"ctl-node-{secrets.token_hex(3)}"
ECHO = "ctlEcho"
CONFIG = "ctl-echo"
JOB_CONFIG = "ctl-echo-job"
DESCRIPTIONS = ("bar0", "bar1")
BUSYBOX = "docker.io/library/busybox:latest"
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 90  # a node under load: slower than the default wait


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _container(command: str) -> dict[str, Any]:
    return {
        "name": "broker",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
    }


def _config(name: str, broker: dict[str, Any], services: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "discoveryHandler": {
            "name": ECHO,
            "discoveryDetails": yaml.safe_dump({"descriptions": list(DESCRIPTIONS)}),
        },
        "capacity": 2,
        "brokerSpec": broker,
    }
    if services:
        service = {"type": "ClusterIP", "ports": [{"name": "grpc", "port": 6052}]}
        spec["instanceServiceSpec"] = service
        spec["configurationServiceSpec"] = service
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


class Env:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env = env
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.proc_env = {**os.environ, "KUBECONFIG": env["KUBECONFIG"], "PYTHONUNBUFFERED": "1"}
        self.tmp = tmp
        self.availability = tmp / "availability"
        self.agent: subprocess.Popen[bytes] | None = None
        self.controllers: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.instances = {
            d: naming.instance_name(CONFIG, naming.device_hash(d, self.node)) for d in DESCRIPTIONS
        }

    # --- processes -----------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115  (closed with the process)
        return subprocess.Popen(
            [sys.executable, "-m", *args], cwd=REPO, env=self.proc_env, stdout=log, stderr=log
        )

    def start_agent(self) -> None:
        self.agent = self._spawn(
            "agent",
            [
                "tests.support.echo_agent",
                "--echo-name", ECHO,
                "--node-name", self.node,
                "--namespace", NS,
                "--discovery-handlers-directory", str(self.tmp / "akri"),
                "--debug-echo-availability", str(self.availability),
                "--metrics-port", "-1",
                "--reclaim-period", "2",
                "--reclaim-grace", "3",
            ],
        )  # fmt: skip

    def start_controller(self, identity: str) -> None:
        self.ports[identity] = _free_port()
        self.controllers[identity] = self._spawn(
            f"controller-{identity}",
            [
                "akri_trio", "controller",
                "--namespace", NS,
                "--lease-namespace", NS,
                "--identity", identity,
                "--metrics-port", str(self.ports[identity]),
            ],
        )  # fmt: skip

    def stop(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-3000:]

    # --- kubectl -------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self.env["KUBECTL"], *args],
            env=self.proc_env,
            input=input,
            capture_output=True,
            text=True,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc.stdout

    def items(self, kind: str, *selector: str) -> list[dict[str, Any]]:
        out = json.loads(self.kubectl("get", kind, "-n", NS, *selector, "-o", "json"))
        return [i for i in out["items"] if not i["metadata"].get("deletionTimestamp")]

    def brokers(self) -> list[dict[str, Any]]:
        return self.items("pods", "-l", f"{naming.LABEL_CONFIGURATION}={CONFIG}")

    def running_brokers(self) -> list[dict[str, Any]]:
        return [p for p in self.brokers() if p.get("status", {}).get("phase") == "Running"]

    def services(self) -> set[str]:
        return {s["metadata"]["name"] for s in self.items("services", "-l", "controller=akri.sh")}

    def instance_names(self) -> set[str]:
        return {i["metadata"]["name"] for i in self.items("instances.akri.sh")}

    def lease_holder(self) -> str:
        out = self.kubectl("get", "lease", "akri-controller", "-n", NS, "-o", "json", check=False)
        return str(json.loads(out)["spec"].get("holderIdentity") or "") if out else ""

    def metrics(self, identity: str) -> str:
        url = f"http://127.0.0.1:{self.ports[identity]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


@pytest.fixture(scope="module")
def e2e(node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    env = Env(node_cluster, tmp_path_factory.mktemp("ctl-node"))
    env.kubectl("apply", "-f", str(REPO / "k8s" / "crds"))
    env.kubectl(
        "wait", "--for=condition=Established", "crd/configurations.akri.sh", "crd/instances.akri.sh"
    )
    env.kubectl("create", "namespace", NS)
    until(
        lambda: env.kubectl("get", "serviceaccount", "default", "-n", NS, check=False),
        what="the namespace's default ServiceAccount",
        seconds=WAIT_S,
    )
    try:
        env.start_agent()
        env.start_controller("ctl-a")
        until(lambda: env.lease_holder() == "ctl-a", seconds=30, what="ctl-a leads")
        env.start_controller("ctl-b")
        yield env
    finally:
        env.kubectl(
            "delete", "configurations.akri.sh", "--all", "-n", NS, "--wait=false", check=False
        )
        for proc in env.controllers.values():
            env.stop(proc)
        env.stop(env.agent)
        env.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def test_brokers_and_services_for_two_devices(e2e: Env) -> None:
    command = "env | grep ^DEBUG_ECHO | sort; sleep 3600"
    pod_spec = {"containers": [_container(command)], "terminationGracePeriodSeconds": 1}
    e2e.kubectl(
        "apply", "-f", "-", input=json.dumps(_config(CONFIG, {"brokerPodSpec": pod_spec}, True))
    )
    until(
        lambda: e2e.instance_names() == set(e2e.instances.values()),
        what="2 Instances",
        seconds=WAIT_S,
    )
    until(lambda: len(e2e.running_brokers()) == 2, what="2 brokers Running", seconds=WAIT_S)
    seen = set()
    for pod in e2e.running_brokers():
        name = pod["metadata"]["name"]
        logs: str = until(
            functools.partial(e2e.kubectl, "logs", name, "-n", NS), what="logs", seconds=WAIT_S
        )
        env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
        seen.add(env["DEBUG_ECHO_DESCRIPTION"])
    assert seen == set(DESCRIPTIONS)
    want = {f"{i}-svc" for i in e2e.instances.values()} | {f"{CONFIG}-svc"}
    until(lambda: e2e.services() == want, what=f"Services {sorted(want)}", seconds=WAIT_S)
    metrics = e2e.metrics("ctl-a")
    assert f'akri_broker_pod_count{{configuration="{CONFIG}",node="{e2e.node}"}} 2' in metrics


def test_deleted_broker_is_recreated(e2e: Env) -> None:
    pod = until(e2e.running_brokers, what="a Running broker", seconds=WAIT_S)[0]
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    e2e.kubectl("delete", "pod", name, "-n", NS, "--wait=false")

    def replaced() -> bool:
        return any(
            p["metadata"]["name"] == name and p["metadata"]["uid"] != uid
            for p in e2e.running_brokers()
        )

    until(replaced, what=f"{name} recreated and Running", seconds=WAIT_S)


def test_offline_removes_everything_and_online_brings_it_back(e2e: Env) -> None:
    e2e.availability.write_text("OFFLINE")
    until(lambda: not e2e.instance_names(), what="Instances gone", seconds=WAIT_S)
    until(lambda: not e2e.brokers(), what="brokers gone", seconds=WAIT_S)
    until(lambda: not e2e.services(), what="Services gone", seconds=WAIT_S)
    e2e.availability.write_text("")
    until(lambda: len(e2e.running_brokers()) == 2, seconds=120, what="brokers back")
    until(lambda: len(e2e.services()) == 3, what="Services back", seconds=WAIT_S)


def test_killing_the_leader_hands_over(e2e: Env) -> None:
    leader = e2e.lease_holder()
    standby = next(i for i in e2e.controllers if i != leader)
    assert "akri_controller_leader 0" in e2e.metrics(standby)
    e2e.controllers[leader].kill()  # SIGKILL: no hand-back, the standby must wait the lease out
    e2e.controllers[leader].wait()
    killed = time.monotonic()
    until(lambda: e2e.lease_holder() == standby, seconds=30, what=f"{standby} leads")
    took = time.monotonic() - killed
    assert took <= 17, f"takeover took {took:.1f} s"
    until(
        lambda: "akri_controller_leader 1" in e2e.metrics(standby),
        what="standby leads",
        seconds=WAIT_S,
    )
    # The new leader does the work: a deleted broker comes back.
    pod = until(e2e.running_brokers, what="a Running broker", seconds=WAIT_S)[0]
    e2e.kubectl("delete", "pod", pod["metadata"]["name"], "-n", NS, "--wait=false")
    until(
        lambda: (
            any(p["metadata"]["uid"] != pod["metadata"]["uid"] for p in e2e.running_brokers())
            and len(e2e.running_brokers()) == 2
        ),
        what="the new leader recreates a deleted broker",
        seconds=WAIT_S,
    )
    e2e.start_controller(leader)  # back as the standby


def test_job_brokers_run_per_generation(e2e: Env) -> None:
    template = {
        "spec": {
            "containers": [_container("env | grep ^DEBUG_ECHO_DESCRIPTION=")],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
        }
    }
    job_spec = {"template": template, "backoffLimit": 3}
    body = _config(JOB_CONFIG, {"brokerJobSpec": job_spec}, False)
    e2e.kubectl("apply", "-f", "-", input=json.dumps(body))

    def jobs() -> list[dict[str, Any]]:
        return e2e.items("jobs", "-l", f"{naming.LABEL_CONFIGURATION}={JOB_CONFIG}")

    def completed(generation: int) -> bool:
        done = [
            j
            for j in jobs()
            if j["metadata"]["name"].endswith(f"-{generation}-job")
            and (j.get("status") or {}).get("succeeded") == 1
        ]
        return len(done) == 2

    generation = json.loads(
        e2e.kubectl("get", "configurations.akri.sh", JOB_CONFIG, "-n", NS, "-o", "json")
    )["metadata"]["generation"]
    until(lambda: completed(generation), seconds=120, what="2 Jobs completed")
    job_spec["backoffLimit"] = 4  # a spec edit: a new generation
    e2e.kubectl("apply", "-f", "-", input=json.dumps(body))
    until(lambda: completed(generation + 1), seconds=120, what="2 Jobs of the new generation")
    until(
        lambda: all(j["metadata"]["name"].endswith(f"-{generation + 1}-job") for j in jobs()),
        what="old-generation Jobs removed",
        seconds=WAIT_S,
    )


def _ready(e2e: Env, node: str, ready: bool) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "Test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    patch = json.dumps({"status": {"conditions": [condition]}})
    e2e.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)


def test_a_lost_node_is_removed_like_any_node(e2e: Env) -> None:
    """A Node of our own (no kubelet behind it), Ready, then NotReady: the leader removes it
    from the Instances and deletes the one it was alone on. The other node the shared Instance
    names is one of ours too (the controller takes a node that does not exist for a deleted
    one); both are tainted so that nothing is scheduled onto them."""
    lost, elsewhere = (f"ctl-test-node-{secrets.token_hex(3)}" for _ in range(2))
    taint = {"key": "akri-trio-test/no-kubelet", "effect": "NoSchedule"}
    for name in (lost, elsewhere):
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        e2e.kubectl("create", "-f", "-", input=json.dumps({**node, "spec": {"taints": [taint]}}))
    try:
        _ready(e2e, lost, True)
        _ready(e2e, elsewhere, True)
        config = {
            "apiVersion": "akri.sh/v0",
            "kind": "Configuration",
            "metadata": {"name": "ctl-lost", "namespace": NS},
            "spec": {"discoveryHandler": {"name": "controllerTestsOnly"}, "capacity": 2},
        }
        made = json.loads(e2e.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(config)))
        owner = {
            "apiVersion": "akri.sh/v0",
            "kind": "Configuration",
            "name": "ctl-lost",
            "uid": made["metadata"]["uid"],
        }

        def instance(name: str, nodes: list[str], usage: dict[str, str]) -> str:
            body = {
                "apiVersion": "akri.sh/v0",
                "kind": "Instance",
                "metadata": {
                    "name": name,
                    "namespace": NS,
                    "finalizers": [lost],
                    "ownerReferences": [owner],
                },
                "spec": {
                    "configurationName": "ctl-lost",
                    "cdiName": f"akri.sh/ctl-lost={name}",
                    "capacity": 2,
                    "shared": True,
                    "nodes": nodes,
                    "deviceUsage": usage,
                },
            }
            return e2e.kubectl("create", "-f", "-", input=json.dumps(body))

        instance(
            "ctl-lost-aaaaaa",
            [lost, elsewhere],
            {"ctl-lost-aaaaaa-0": lost, "ctl-lost-aaaaaa-1": elsewhere},
        )
        instance("ctl-lost-bbbbbb", [lost], {"ctl-lost-bbbbbb-0": f"C:ctl-lost-0:{lost}"})
        time.sleep(2)  # the leader sees the node Ready
        _ready(e2e, lost, False)

        def released() -> dict[str, Any] | None:
            out = e2e.kubectl("get", "instances.akri.sh", "ctl-lost-aaaaaa", "-n", NS, "-o", "json")
            inst: dict[str, Any] = json.loads(out)
            return inst if inst["spec"]["nodes"] == [elsewhere] else None

        inst = until(released, what="the lost node removed", seconds=WAIT_S)
        assert inst["spec"]["deviceUsage"] == {"ctl-lost-aaaaaa-1": elsewhere}
        assert not inst["metadata"].get("finalizers")
        until(
            lambda: "ctl-lost-bbbbbb" not in e2e.instance_names(),
            what="the Instance left with no node deleted",
            seconds=WAIT_S,
        )
    finally:
        e2e.kubectl("delete", "node", lost, elsewhere, "--wait=false", check=False)
        e2e.kubectl("delete", "configurations.akri.sh", "ctl-lost", "-n", NS, check=False)


def test_deleting_the_configuration_removes_everything(e2e: Env) -> None:
    e2e.kubectl("delete", "configurations.akri.sh", CONFIG, JOB_CONFIG, "-n", NS, "--wait=false")
    until(lambda: not e2e.instance_names(), what="Instances gone", seconds=WAIT_S)
    until(
        lambda: not e2e.items("pods", "-l", naming.LABEL_CONFIGURATION),
        what="Pods gone",
        seconds=WAIT_S,
    )
    until(lambda: not e2e.items("jobs"), what="Jobs gone", seconds=WAIT_S)
    until(lambda: not e2e.services(), what="Services gone", seconds=WAIT_S)
