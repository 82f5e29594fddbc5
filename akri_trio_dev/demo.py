"""The README's demo: the whole Akri flow on a real local Kubernetes node.

Runs as `scripts/just demo` (or `python -m akri_trio_dev.demo`):
1. a real cluster with a node (etcd, apiserver, controller-manager, scheduler, containerd,
   kubelet), built from source on the first run; started if it is not running, left running;
2. Akri's CRDs, then the akri-trio agent (embedded debugEcho discovery handler) and the
   akri-trio controller as host processes (a DaemonSet and a Deployment in a real cluster,
   see k8s/), both watching only the demo's namespace, `akri-demo`;
3. a debugEcho Configuration with a busybox broker and Services
   (k8s/examples/debug-echo-broker.yaml): two fake devices become two Instances and three
   kubelet resources, the controller starts a broker Pod for each Instance (its log shows the
   device's properties, which Allocate put in its env) and a Service for each Instance and one
   for the Configuration; `kubectl describe` shows the controller's Events;
4. a Pod that asks for two devices of the Configuration gets the two slots the brokers left;
5. cleanup of what the demo made: its Pod and its Configuration (the agent removes the
   Instances, the controller's brokers and Services go with them). The cluster keeps running
   (`scripts/just cluster-down` stops it).

`python -m akri_trio_dev.demo --allocation dra` runs the same story in DRA mode (issue 15): the
agent serves the kubelet's DRA plugin instead of device plugins and publishes its node's
ResourceSlice, the controller keeps the Configuration's DeviceClass and gives each broker a
ResourceClaim, and the Pod of step 4 asks for any one device of the Configuration through a
ResourceClaimTemplate; the scheduler allocates, and the claims show which device each holds.

It touches and waits for its own objects only: the Instances of its Configuration in its
namespace, never other Instances the cluster holds (stuck ones of other users included).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from akri_trio import dra
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster.exports import parse_exports

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "k8s" / "examples" / "debug-echo-broker.yaml"
CONFIG = "akri-debug-echo-foo"
NAMESPACE = "akri-demo"
APP_POD = "two-devices"
BROKERS = f"akri.sh/configuration={CONFIG}"
TEMPLATE = "any-device"  # DRA mode: the app Pod's ResourceClaimTemplate
DRA_POD = "one-device"  # DRA mode: the app Pod


def _step(title: str) -> None:
    print(f"\n==> {title}", flush=True)


def _cluster(*args: str) -> str:
    proc = run_cluster_command(*args, stdout=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(
            f"python -m akri_trio_dev cluster {' '.join(args)} failed ({proc.returncode})"
        )
    return proc.stdout


def _until(check: Callable[[], bool], what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


class Kubectl:
    def __init__(self, env: dict[str, str]) -> None:
        self.path = env["KUBECTL"]
        self.env = {**os.environ, "KUBECONFIG": env["KUBECONFIG"]}

    def show(self, *args: str, stdin: str | None = None) -> None:
        print(f"$ kubectl {' '.join(args)}", flush=True)
        subprocess.run([self.path, *args], env=self.env, input=stdin, text=True, check=True)

    def output(self, *args: str) -> str:
        proc = subprocess.run(
            [self.path, *args], env=self.env, text=True, capture_output=True, check=True
        )
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.output(*args, "-o", "json"))

    def maybe_json(self, *args: str) -> Any:
        """The object, or None when kubectl fails (not found)."""
        try:
            return self.json(*args)
        except subprocess.CalledProcessError:
            return None

    def quiet(self, *args: str) -> None:
        subprocess.run([self.path, *args], env=self.env, capture_output=True, check=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        pass  # not up yet
    return None


def _pod(name: str, resource: str, count: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "app",
                        "image": "docker.io/library/busybox:latest",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "env | grep ^DEBUG_ECHO | sort; sleep 3600"],
                        "resources": {"limits": {resource: str(count)}},
                    }
                ],
            },
        }
    )


def _claim_template() -> str:
    """DRA mode: one device of the Configuration's DeviceClass, any of its Instances."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
        "spec": {"spec": dra.claim_spec(CONFIG, NAMESPACE)},
    }
    return json.dumps(body)


def _claim_pod(name: str) -> str:
    """`_pod` asking for the template's claim instead of an extended resource."""
    pod = json.loads(_pod(name, "unused", 1))
    pod["spec"]["resourceClaims"] = [{"name": "device", "resourceClaimTemplateName": TEMPLATE}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "device"}]}
    return json.dumps(pod)


def allocation_args(allocation: str, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The agent's and the controller's extra flags for `allocation`."""
    if allocation != "dra":
        return [], []
    agent = [
        "--allocation", "dra",
        "--kubelet-root-dir", env["AKRI_TRIO_KUBELET_ROOT_DIR"],
        "--cdi-dir", env["AKRI_TRIO_CDI_DIR"],
    ]  # fmt: skip
    return agent, ["--allocation", "dra"]


def ours(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The demo's own among `instances`: those of its Configuration in its namespace (being
    deleted or not). The only ones it waits for."""
    return [
        i
        for i in instances
        if i["metadata"].get("namespace") == NAMESPACE
        and i.get("spec", {}).get("configurationName") == CONFIG
    ]


def _ours(k: Kubectl) -> list[dict[str, Any]]:
    return ours(k.json("get", "akrii", "-n", NAMESPACE)["items"])


def _brokers(k: Kubectl, phase: str | None = None) -> list[dict[str, Any]]:
    pods = k.json("get", "pods", "-n", NAMESPACE, "-l", BROKERS)["items"]
    return [p for p in pods if phase is None or p.get("status", {}).get("phase") == phase]


def _services(k: Kubectl) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = k.json(
        "get", "services", "-n", NAMESPACE, "-l", "controller=akri.sh"
    )["items"]
    return items


def _namespace(k: Kubectl) -> None:
    """The demo's namespace, made if missing; one still being deleted is waited for first."""

    def terminating() -> bool:
        ns = k.maybe_json("get", "namespace", NAMESPACE)
        return ns is not None and ns.get("status", {}).get("phase") == "Terminating"

    _until(lambda: not terminating(), f"namespace {NAMESPACE} (being deleted) to go", 120)
    if k.maybe_json("get", "namespace", NAMESPACE) is None:
        k.show("create", "namespace", NAMESPACE)


def _remove_ours(k: Kubectl, what: str) -> None:
    """Delete the demo's Pod and Configuration and wait until its Instances, broker Pods and
    Services are gone (the agent and the controller run meanwhile: the agent releases its
    finalizers on the Instances)."""
    k.quiet("delete", "pod", APP_POD, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    k.quiet("delete", "pod", DRA_POD, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    k.quiet("delete", "resourceclaimtemplate", TEMPLATE, "-n", NAMESPACE, "--ignore-not-found")
    k.quiet("delete", "-n", NAMESPACE, "-f", str(EXAMPLE), "--wait=true", "--timeout=60s")
    _until(lambda: not _ours(k), what, 60)
    _until(lambda: not _brokers(k) and not _services(k), "its broker Pods and Services to go", 60)


@contextmanager
def _process(name: str, args: list[str], env: dict[str, str], work: Path) -> Iterator[None]:
    """`akri-trio <args>` as a process for the duration; SIGTERM (then SIGKILL) afterwards."""
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115  (lives as long as the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "akri_trio", *args],
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=log,
    )
    print(f"{name}: pid {proc.pid}, log {work / (name + '.log')}")
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m akri_trio_dev.demo", description=__doc__)
    p.add_argument(
        "--allocation",
        choices=("device-plugin", "dra"),
        default="device-plugin",
        help="how Pods get devices: device plugins (default) or DRA (needs Kubernetes >= 1.34 "
        "and a runtime with CDI, as the local cluster has)",
    )
    allocation = p.parse_args(argv).allocation
    _step("starting a real local Kubernetes with one node (the first run builds it)")
    print(_cluster("up", "--node"), end="")
    env = parse_exports(_cluster("env"))
    node = env["AKRI_TRIO_NODE_NAME"]
    k = Kubectl(env)

    _step("installing the akri.sh/v0 CRDs")
    k.show("apply", "-f", str(REPO / "k8s" / "crds"))
    k.show(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/configurations.akri.sh",
        "crd/instances.akri.sh",
    )
    _step(f"the demo's own namespace: {NAMESPACE}")
    _namespace(k)

    _step(
        f"starting the akri-trio agent for node {node} (embedded debugEcho handler) and the "
        f"akri-trio controller, both watching only {NAMESPACE}"
    )
    work = Path(tempfile.mkdtemp(prefix="akri-demo-"))
    agent_port = _free_port()
    agent = [
        "agent",
        "--node-name", node,
        "--namespace", NAMESPACE,
        "--discovery-handlers-directory", str(work / "akri"),
        "--enable-debug-echo",
        "--debug-echo-availability", str(work / "availability"),
        "--metrics-port", str(agent_port),
    ]  # fmt: skip
    controller = [
        "controller",
        "--namespace", NAMESPACE,
        "--no-leader-elect",
        "--metrics-port", str(_free_port()),
    ]  # fmt: skip
    agent_extra, controller_extra = allocation_args(allocation, env)
    agent += agent_extra
    controller += controller_extra
    with _process("agent", agent, k.env, work), _process("controller", controller, k.env, work):
        try:
            # Leftovers of an interrupted earlier demo (its own objects only), removed while
            # the agent runs, so the story starts from a clean slate.
            _remove_ours(k, "the Instances an earlier demo left to go")
            _story(k, node, agent_port, work, allocation)
        finally:
            _step("cleaning up what the demo made (the cluster keeps running)")
            _remove_ours(k, "the demo's Instances to go")
    print(f"\nUse the cluster with:  export KUBECONFIG={env['KUBECONFIG']}")
    print("Stop it with:          scripts/just cluster-down")
    return 0


def _story(k: Kubectl, node: str, agent_port: int, work: Path, allocation: str) -> None:
    _step("applying a debugEcho Configuration: two fake devices, capacity 2, a busybox broker")
    k.show("apply", "-n", NAMESPACE, "-f", str(EXAMPLE))
    _until(lambda: len(_ours(k)) == 2, "two Instances")
    k.show("get", "akric,akrii", "-n", NAMESPACE)
    if allocation == "dra":
        _dra_published(k, work)
    else:
        # Pods admitted before the plugins are registered would fail admission: wait for the
        # agent to say so (the node's allocatable lags behind, and may be stale).
        _until(
            lambda: _metric(agent_port, "akri_device_plugins_registered") == 3,
            "the three device plugins to register with the kubelet",
        )

    _step("the controller starts a broker Pod for each Instance, pinned to the node that sees it")
    _until(lambda: len(_brokers(k, "Running")) == 2, "two broker Pods Running", 120)
    k.show("get", "pods", "-n", NAMESPACE, "-l", BROKERS, "-o", "wide")
    broker = sorted(p["metadata"]["name"] for p in _brokers(k))[0]
    given = "DRA plugin (a CDI spec)" if allocation == "dra" else "Allocate"
    _step(f"a broker's env: the properties of its device, given by the agent's {given}")
    k.show("logs", broker, "-n", NAMESPACE)

    _step("Services: one in front of each Instance's brokers, one for the whole Configuration")
    _until(lambda: len(_services(k)) == 3, "three Services")
    k.show("get", "services", "-n", NAMESPACE, "-l", "controller=akri.sh")

    instance = _brokers(k)[0]["metadata"]["labels"]["akri.sh/instance"]
    _step(f"what the controller did, in the Events of `kubectl describe akrii {instance}`")
    _until(
        lambda: "BrokerCreated" in k.output("describe", "akrii", instance, "-n", NAMESPACE),
        "the controller's Events",
        30,
    )
    described = k.output("describe", "akrii", instance, "-n", NAMESPACE)
    print(described[described.index("Events:") :], end="")

    if allocation == "dra":
        _dra_pod(k)
        return
    resource = f"akri.sh/{CONFIG}"

    def offered() -> bool:
        allocatable = k.json("get", "node", node)["status"]["allocatable"]
        return int(allocatable.get(resource, "0")) >= 2

    _until(offered, f"the node to offer {resource}")
    _step(f"a Pod that asks for any two devices ({resource}: 2) gets the slots the brokers left")
    k.show("apply", "-f", "-", stdin=_pod(APP_POD, resource, 2))
    k.show("wait", "--for=condition=Ready", "--timeout=90s", f"pod/{APP_POD}", "-n", NAMESPACE)
    k.show("logs", APP_POD, "-n", NAMESPACE)

    _step("every slot and who holds it, in each Instance's deviceUsage")
    k.show(
        "get",
        "akrii",
        "-n",
        NAMESPACE,
        "-o",
        "custom-columns=INSTANCE:.metadata.name,DEVICE-USAGE:.spec.deviceUsage",
    )


def _dra_published(k: Kubectl, work: Path) -> None:
    """DRA mode: the kubelet registered the agent's plugin; the class and the node's slice."""
    registered = f"the kubelet registered DRA driver {dra.DRIVER}"
    _until(
        lambda: registered in (work / "agent.log").read_text(),
        "the kubelet to register the agent's DRA plugin",
    )
    device_class = dra.device_class_name(CONFIG, NAMESPACE)
    _step(f"the controller's DeviceClass {device_class}, and the agent's ResourceSlice")
    _until(lambda: k.maybe_json("get", "deviceclass", device_class) is not None, "the class")
    k.show("get", "deviceclass", device_class)
    k.show(
        "get",
        "resourceslices",
        "-o",
        "custom-columns=SLICE:.metadata.name,POOL:.spec.pool.name,NODE:.spec.nodeName,"
        "DEVICES:.spec.devices[*].name",
    )


def _dra_pod(k: Kubectl) -> None:
    """DRA mode: a Pod with a claim for any device of the Configuration; every claim."""
    _step("a Pod that asks for any one device of the Configuration, through a claim template")
    k.show("apply", "-f", "-", stdin=_claim_template())
    k.show("apply", "-f", "-", stdin=_claim_pod(DRA_POD))
    k.show("wait", "--for=condition=Ready", "--timeout=90s", f"pod/{DRA_POD}", "-n", NAMESPACE)
    k.show("logs", DRA_POD, "-n", NAMESPACE)
    _step("every claim and the device the scheduler allocated to it")
    k.show(
        "get",
        "resourceclaims",
        "-n",
        NAMESPACE,
        "-o",
        "custom-columns=CLAIM:.metadata.name,POD:.status.reservedFor[*].name,"
        "DEVICE:.status.allocation.devices.results[*].device",
    )


if __name__ == "__main__":
    sys.exit(main())
