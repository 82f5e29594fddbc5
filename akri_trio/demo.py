"""The README's demo: devices discovered and used, on a real local Kubernetes node.

Runs as `scripts/just demo` (or `python -m akri_trio.demo`):
1. a real cluster with a node (etcd, apiserver, controller-manager, scheduler, containerd,
   kubelet), built from source on the first run;
2. Akri's CRDs and the akri-trio agent on the node (a host process here; a DaemonSet in a
   real cluster, see k8s/agent.yaml), with the embedded debugEcho discovery handler;
3. a debugEcho Configuration: two fake devices become two Instances and three kubelet
   resources (one per device, one for "any of them");
4. a Pod that asks for one device and a Pod that asks for two of the Configuration: their logs
   show the env vars Allocate gave them — two *different* devices for the second;
5. cleanup of what the demo made (the cluster keeps running; `scripts/just cluster-down`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from akri_trio.cluster.exports import parse_exports

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "k8s" / "examples" / "debug-echo.yaml"
CONFIG = "akri-debug-echo-foo"


def _step(title: str) -> None:
    print(f"\n==> {title}", flush=True)


def _cluster(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "akri_trio", "cluster", *args], stdout=subprocess.PIPE, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"akri-trio cluster {' '.join(args)} failed ({proc.returncode})")
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

    def json(self, *args: str) -> Any:
        out = subprocess.run(
            [self.path, *args, "-o", "json"],
            env=self.env,
            text=True,
            capture_output=True,
            check=True,
        ).stdout
        return json.loads(out)

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
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "broker",
                        "image": "docker.io/library/busybox:latest",
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "env | grep ^DEBUG_ECHO | sort; sleep 3600"],
                        "resources": {"limits": {resource: str(count)}},
                    }
                ],
            },
        }
    )


def main() -> int:
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

    _step(f"starting the akri-trio agent for node {node} (embedded debugEcho handler)")
    work = Path(tempfile.mkdtemp(prefix="akri-demo-"))
    metrics_port = _free_port()
    log = open(work / "agent.log", "wb")  # noqa: SIM115  (lives as long as the agent)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "akri_trio",
            "agent",
            "--node-name",
            node,
            "--discovery-handlers-directory",
            str(work / "akri"),
            "--enable-debug-echo",
            "--debug-echo-availability",
            str(work / "availability"),
            "--metrics-port",
            str(metrics_port),
        ],
        env={**k.env, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=log,
    )
    print(f"agent pid {agent.pid}, log {work / 'agent.log'}")
    try:
        # Leftovers of an interrupted earlier demo: remove them while the agent runs (it
        # releases its finalizers on their Instances), so the story starts from a clean slate.
        k.quiet("delete", "pod", "one-device", "two-devices", "--wait=true", "--timeout=60s")
        k.quiet("delete", "-f", str(EXAMPLE), "--wait=true", "--timeout=60s")
        _until(lambda: not k.json("get", "akrii")["items"], "leftover Instances to go", 60)
        _step("applying a debugEcho Configuration: two fake devices, capacity 2")
        k.show("apply", "-f", str(EXAMPLE))
        _until(lambda: len(k.json("get", "akrii")["items"]) == 2, "two Instances")
        k.show("get", "akric,akrii")
        # Pods admitted before the plugins are registered would fail admission: wait for the
        # agent to say so (the node's allocatable lags behind, and may be stale).
        _until(
            lambda: _metric(metrics_port, "akri_device_plugins_registered") == 3,
            "the three device plugins to register with the kubelet",
        )
        ours = {f"akri.sh/{CONFIG}"} | {
            f"akri.sh/{i['metadata']['name']}" for i in k.json("get", "akrii")["items"]
        }

        def offered() -> bool:
            allocatable = k.json("get", "node", node)["status"]["allocatable"]
            return all(int(allocatable.get(r, "0")) > 0 for r in ours)

        _until(offered, "the node to offer the three resources")
        allocatable = k.json("get", "node", node)["status"]["allocatable"]
        print("node allocatable:", {r: allocatable[r] for r in sorted(ours)})

        instance = k.json("get", "akrii")["items"][0]["metadata"]["name"]
        _step(f"a Pod that asks for one specific device: akri.sh/{instance}: 1")
        k.show("apply", "-f", "-", stdin=_pod("one-device", f"akri.sh/{instance}", 1))
        _step(f"a Pod that asks for any two devices: akri.sh/{CONFIG}: 2")
        k.show("apply", "-f", "-", stdin=_pod("two-devices", f"akri.sh/{CONFIG}", 2))
        k.show(
            "wait", "--for=condition=Ready", "--timeout=90s", "pod/one-device", "pod/two-devices"
        )
        k.show("logs", "one-device")
        k.show("logs", "two-devices")
        _step("the slots they hold, in each Instance's deviceUsage")
        k.show(
            "get",
            "akrii",
            "-o",
            "custom-columns=INSTANCE:.metadata.name,DEVICE-USAGE:.spec.deviceUsage",
        )
    finally:
        _step("cleaning up what the demo made (the cluster keeps running)")
        k.quiet("delete", "pod", "one-device", "two-devices", "--wait=true", "--timeout=60s")
        k.quiet("delete", "-f", str(EXAMPLE), "--wait=true", "--timeout=60s")
        # The agent releases its Instances (and its finalizers on them) before it stops.
        _until(lambda: not k.json("get", "akrii")["items"], "the Instances to go", 60)
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        log.close()
    print(f"\nUse the cluster with:  export KUBECONFIG={env['KUBECONFIG']}")
    print("Stop it with:          scripts/just cluster-down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
