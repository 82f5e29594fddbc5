"""Chaos on the real node: every component dies while Pods keep claiming and releasing devices.

For two rounds (ten faults, a few seconds apart) a fault loop takes turns killing the agent
(SIGKILL), killing the standalone discovery handler (SIGKILL), restarting the kubelet, and
restarting the API server and etcd (each SIGKILLed, then `cluster up` starts them again), while
claimant threads keep creating Pods that ask for one device (instance-level or
configuration-level), let them run a moment and delete them. Then the faults stop, everything is
up again, two Pods hold devices, and the books must balance: no slot held twice, no slot held for
a Pod that is not running (nothing leaked), every Instance is a device the handler discovers. The
counts are printed (bench/RESULTS.md keeps them).

Destructive: it restarts the shared cluster's processes, so it runs in CI's single session and not
beside other developers' tests.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from akri_trio.model import naming
from akri_trio_dev import run_cluster_command
from tests.support.kubectl import Kubectl, busybox_pod, free_port
from tests.support.node_agent import held_by_pods, sigkill_component
from tests.support.polling import until

pytestmark = pytest.mark.node

NS = "akri-chaos"
CONFIG = "chaos-echo"
DESCRIPTIONS = ("c0", "c1")
FAULT_ROUNDS = 2  # each round injects every kind of fault once
FAULT_GAP = 7.0  # seconds between two faults
CLAIMANTS = 3
POD_WAIT = 25.0  # a claimant gives a Pod this long to start before it deletes it


class Proc:
    """One of the test's own processes (the agent, the handler), restartable."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, env, log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = open(self.log, "ab")  # noqa: SIM115  (closed with the process)
        self.popen = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=out)

    def kill(self) -> None:
        if self.popen is not None:
            self.popen.kill()
            self.popen.wait(timeout=15)
            self.popen = None

    def stop(self) -> None:
        if self.popen is not None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=15)
            self.popen = None


class Chaos:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env = env
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.cluster_dir = Path(env["AKRI_TRIO_CLUSTER_DIR"])
        self.kubelet_root = Path(env.get("AKRI_TRIO_KUBELET_ROOT_DIR", "/var/lib/kubelet"))
        self.kubectl = Kubectl(env)
        self.tmp = tmp
        handlers = tmp / "akri"
        handlers.mkdir()
        self.availability = tmp / "availability"
        self.availability.write_text("")
        base = {**self.kubectl.environ, "PYTHONUNBUFFERED": "1"}
        self.metrics_port = free_port()
        self.agent = Proc(
            [
                *(sys.executable, "-m", "akri_trio", "agent", "--node-name", self.node),
                *("--namespace", NS, "--discovery-handlers-directory", str(handlers)),
                *("--metrics-port", str(self.metrics_port)),
                *("--reclaim-period", "1", "--reclaim-grace", "3"),
            ],
            base,
            tmp / "agent.log",
        )
        self.handler = Proc(
            [sys.executable, "-m", "akri_trio", "discovery-handler", "debugEcho"],
            {
                **base,
                "DISCOVERY_HANDLERS_DIRECTORY": str(handlers),
                "DEBUG_ECHO_AVAILABILITY_PATH": str(self.availability),
            },
            tmp / "handler.log",
        )
        self.instances = {
            naming.instance_name(CONFIG, naming.device_hash(d, self.node)) for d in DESCRIPTIONS
        }
        self.faults: dict[str, int] = {}
        self.claims = {"made": 0, "running": 0, "not-started": 0, "api-errors": 0}
        self.lock = threading.Lock()

    # --- reading the books ----------------------------------------------------------------

    def usage(self) -> dict[str, dict[str, str]]:
        items = self.kubectl.json("get", "instances.akri.sh", "-n", NS)["items"]
        return {i["metadata"]["name"]: i["spec"].get("deviceUsage", {}) for i in items}

    def running_pods(self) -> set[str]:
        pods = self.kubectl.json("get", "pods", "-n", NS)["items"]
        return {p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"}

    def anomalies(self) -> list[str]:
        """Everything wrong with the books right now (empty: they balance)."""
        usage = self.usage()
        found: list[str] = []
        if set(usage) != self.instances:
            found.append(f"Instances {sorted(usage)} != discovered {sorted(self.instances)}")
        running = self.running_pods()
        sock = self.kubelet_root / "pod-resources" / "kubelet.sock"
        held = {p: r for p, r in held_by_pods(sock, NS).items() if p in running}
        # Which slot each running Pod's device stands for, by the Instances' books.
        vdev_slot = {
            value: slot
            for slots in usage.values()
            for slot, value in slots.items()
            if value.startswith("C:")
        }
        slot_holders: dict[str, list[str]] = {}
        for pod, resources in held.items():
            for resource, ids in resources.items():
                for device in ids:
                    if resource == f"akri.sh/{CONFIG}":
                        slot = vdev_slot.get(f"C:{device}:{self.node}")
                        if slot is None:
                            found.append(f"{pod} holds vdev {device} that no slot records")
                            continue
                    else:
                        slot = device
                        instance = resource.removeprefix("akri.sh/")
                        if usage.get(instance, {}).get(slot) != self.node:
                            found.append(f"{pod} holds {slot} but deviceUsage does not record it")
                    slot_holders.setdefault(slot, []).append(pod)
        found += [f"slot {s} held twice: {ps}" for s, ps in slot_holders.items() if len(ps) > 1]
        for instance, slots in usage.items():
            for slot, value in slots.items():
                if value and slot not in slot_holders:
                    found.append(f"slot {slot} of {instance} leaked ({value!r}, no running Pod)")
        return found

    # --- claimants ------------------------------------------------------------------------

    def claimant(self, index: int, stop: threading.Event) -> None:
        resources = [f"akri.sh/{i}" for i in sorted(self.instances)] + [f"akri.sh/{CONFIG}"]
        for n in itertools.count():
            if stop.is_set():
                return
            name = f"claim-{index}-{n}"
            resource = resources[(index + n) % len(resources)]
            try:
                self.kubectl.apply(busybox_pod(name, NS, "sleep 3600", {resource: 1}))
            except AssertionError:  # the API server is down: try again shortly
                self._count("api-errors")
                stop.wait(1)
                continue
            self._count("made")
            phase = self._wait_started(name, stop)
            self._count("running" if phase == "Running" else "not-started")
            if phase == "Running":
                stop.wait(1.5)
            self.kubectl("delete", "pod", name, "-n", NS, "--wait=false", check=False)

    def _wait_started(self, name: str, stop: threading.Event) -> str:
        deadline = time.monotonic() + POD_WAIT
        phase = ""
        while time.monotonic() < deadline and not stop.is_set():
            out = self.kubectl(
                "get", "pod", name, "-n", NS, "-o", "jsonpath={.status.phase}", check=False
            )
            phase = out.strip()
            if phase in ("Running", "Failed", "Succeeded"):
                return phase
            stop.wait(0.5)
        return phase

    def _count(self, what: str) -> None:
        with self.lock:
            self.claims[what] += 1

    # --- faults ---------------------------------------------------------------------------

    def fault_loop(self, rounds: int) -> None:
        faults: list[tuple[str, Callable[[], None]]] = [
            ("agent killed", self._kill_agent),
            ("kubelet restarted", self._restart_kubelet),
            ("handler killed", self._kill_handler),
            ("apiserver restarted", lambda: self._restart_control_plane("kube-apiserver")),
            ("etcd restarted", lambda: self._restart_control_plane("etcd")),
        ]
        for name, inject in faults * rounds:
            inject()
            self.faults[name] = self.faults.get(name, 0) + 1
            time.sleep(FAULT_GAP)

    def _kill_agent(self) -> None:
        self.agent.kill()
        time.sleep(0.5)
        self.agent.start()

    def _kill_handler(self) -> None:
        self.handler.kill()
        time.sleep(0.5)
        self.handler.start()

    def _restart_kubelet(self) -> None:
        sigkill_component(self.cluster_dir, "kubelet")
        self._cluster_up()

    def _restart_control_plane(self, name: str) -> None:
        sigkill_component(self.cluster_dir, name)
        self._cluster_up()

    def _cluster_up(self) -> None:
        run_cluster_command("up", "--node", check=True, capture_output=True, timeout=300)

    def clean(self) -> None:
        self.kubectl(
            "delete", "pods", "--all", "-n", NS, "--wait=true", "--timeout=90s", check=False
        )


@pytest.fixture
def chaos(node_cluster: dict[str, str], tmp_path: Path) -> Iterator[Chaos]:
    c = Chaos(node_cluster, tmp_path)
    repo = Path(__file__).parents[2]
    c.kubectl("apply", "-f", str(repo / "k8s" / "crds"))
    c.kubectl(
        "wait", "--for=condition=Established", "crd/configurations.akri.sh", "crd/instances.akri.sh"
    )
    c.kubectl("create", "namespace", NS, check=False)
    c.clean()
    c.kubectl("delete", "configurations.akri.sh", "--all", "-n", NS, "--wait=true", check=False)
    c.agent.start()
    c.handler.start()
    config = {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": CONFIG, "namespace": NS},
        "spec": {
            "discoveryHandler": {
                "name": "debugEcho",
                "discoveryDetails": yaml.safe_dump({"descriptions": list(DESCRIPTIONS)}),
            },
            "capacity": 2,
        },
    }
    c.kubectl("apply", "-f", "-", stdin=json.dumps(config))
    until(lambda: set(c.usage()) == c.instances, seconds=60, what="both Instances")
    try:
        yield c
    finally:
        c.clean()
        c.kubectl("delete", "configurations.akri.sh", CONFIG, "-n", NS, "--wait=true", check=False)
        c.handler.stop()
        c.agent.stop()


def test_chaos_leaves_no_slot_doubled_or_leaked(chaos: Chaos) -> None:
    stop = threading.Event()
    claimants = [
        threading.Thread(target=chaos.claimant, args=(i, stop), daemon=True)
        for i in range(CLAIMANTS)
    ]
    for t in claimants:
        t.start()
    try:
        chaos.fault_loop(FAULT_ROUNDS)
    finally:
        stop.set()
        for t in claimants:
            t.join(timeout=POD_WAIT + 30)
    # Calm: everything up, every claimant's Pod gone, then two Pods that hold devices.
    chaos._cluster_up()
    chaos.clean()
    holders = {"hold-a": f"akri.sh/{sorted(chaos.instances)[0]}", "hold-b": f"akri.sh/{CONFIG}"}

    def pods_running() -> bool:
        for name, resource in holders.items():
            if chaos.kubectl("get", "pod", name, "-n", NS, check=False) == "":
                chaos.kubectl.apply(busybox_pod(name, NS, "sleep 3600", {resource: 1}))
        phases = {
            p["metadata"]["name"]: p["status"].get("phase")
            for p in chaos.kubectl.json("get", "pods", "-n", NS)["items"]
        }
        for name, phase in phases.items():
            if phase == "Failed":  # admitted while a plugin was re-registering: try again
                chaos.kubectl("delete", "pod", name, "-n", NS, "--wait=true", check=False)
        return all(phases.get(n) == "Running" for n in holders)

    until(pods_running, seconds=120, what="the two holders Running")
    # The books balance once the reclaimer has had its grace (a few seconds) to free what the
    # deleted Pods held; anything still wrong after that is an anomaly.
    try:
        until(lambda: not chaos.anomalies(), seconds=60, what="books balance")
        anomalies: list[str] = []
    except AssertionError:
        anomalies = chaos.anomalies()
    print(
        f"\nchaos: faults {sum(chaos.faults.values())} {chaos.faults}; claims {chaos.claims}; "
        f"anomalies {len(anomalies)}"
    )
    assert not anomalies, anomalies
    assert sum(chaos.faults.values()) == 5 * FAULT_ROUNDS
    assert chaos.claims["running"] > 0
