"""brokerInfo on a real node: a Job broker (busybox, made by the controller) writes files into
the directory the agent mounted into it, and they show up in its Instance's brokerInfo.

The agent (debugEcho embedded as `biEcho`, see tests/support/echo_agent.py, with
`--broker-info-dir`) and the controller run as real processes watching only this module's
namespace. The Job's script writes a report, a progress file it removes later, a file over the
per-file limit and one that is not UTF-8; the test watches the Instance and the Configuration's
status through it all, and after the Job has completed and its slot was freed. Then a new
Configuration generation's Job replaces that report with its own.
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

from akri_trio.model import naming
from tests.support.kubectl import Kubectl
from tests.support.polling import until

pytestmark = pytest.mark.node

NS = f"bi-node-{secrets.token_hex(3)}"
ECHO = "biEcho"
CONFIG = "bi-echo-job"
DESCRIPTION = "fw0"
BUSYBOX = "docker.io/library/busybox:latest"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
cd "$AKRI_BROKER_INFO"
echo -n 1.2.3 > .firmware.tmp && mv .firmware.tmp firmware
echo -n flashing > progress
head -c 100 /dev/zero | tr '\\0' x > big
printf '\\377\\376' > raw
sleep 8
rm progress
sleep 6
"""


class Env:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.kubectl = Kubectl(env)
        self.proc_env = {**os.environ, "KUBECONFIG": env["KUBECONFIG"], "PYTHONUNBUFFERED": "1"}
        self.tmp = tmp
        self.root = tmp / "broker-info"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.instance = naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, self.node))

    def spawn(self, name: str, args: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115  (closed with the process)
        self.procs.append(
            subprocess.Popen(
                [sys.executable, "-m", *args], cwd=REPO, env=self.proc_env, stdout=log, stderr=log
            )
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def ensure_schema(self) -> None:
        """Other sessions' tests on the shared cluster re-apply CRDs from their own checkouts;
        put ours (with brokerInfo) back when it is missing."""
        out = self.kubectl("get", "crd", "instances.akri.sh", "-o", "json")
        spec = json.loads(out)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        if "brokerInfo" not in spec["properties"]["spec"]["properties"]:
            self.kubectl("apply", "-f", str(REPO / "k8s" / "crds" / "instance.yaml"))

    def broker_info(self) -> dict[str, str]:
        self.ensure_schema()
        return dict(self.instance_json().get("spec", {}).get("brokerInfo") or {})

    def instance_json(self) -> dict[str, Any]:
        """The Instance, or {} while it does not exist."""
        get = ("get", "instances.akri.sh", self.instance, "-n", NS, "-o", "json")
        out = self.kubectl(*get, check=False)
        return dict(json.loads(out)) if out else {}

    def condition(self) -> dict[str, Any] | None:
        out = self.kubectl("get", "configurations.akri.sh", CONFIG, "-n", NS, "-o", "json")
        for entry in (json.loads(out).get("status") or {}).get("nodes") or []:
            if entry.get("node") == self.node:
                for cond in entry.get("conditions") or []:
                    if cond["type"] == "BrokerInfoValid":
                        return dict(cond)
        return None


@pytest.fixture(scope="module")
def env(node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(node_cluster, tmp_path_factory.mktemp("bi-node"))
    e.kubectl("apply", "-f", str(REPO / "k8s" / "crds"))
    e.kubectl("wait", "--for=condition=Established", "crd/instances.akri.sh")
    e.kubectl("create", "namespace", NS)
    until(
        lambda: e.kubectl("get", "serviceaccount", "default", "-n", NS, check=False),
        what="the namespace's default ServiceAccount",
    )
    try:
        e.spawn(
            "agent",
            [
                "tests.support.echo_agent",
                "--echo-name", ECHO,
                "--node-name", e.node,
                "--namespace", NS,
                "--discovery-handlers-directory", str(e.tmp / "akri"),
                "--debug-echo-availability", str(e.tmp / "availability"),
                "--metrics-port", "-1",
                "--reclaim-period", "1",
                "--reclaim-grace", "3",
                "--broker-info-dir", str(e.root),
                "--broker-info-period", "0.5",
                "--broker-info-max-file-bytes", "64",
            ],
        )  # fmt: skip
        e.spawn(
            "controller",
            [
                "akri_trio", "controller",
                "--namespace", NS,
                "--no-leader-elect",
                "--metrics-port", "-1",
            ],
        )  # fmt: skip
        yield e
    finally:
        e.kubectl(
            "delete", "configurations.akri.sh", "--all", "-n", NS, "--wait=false", check=False
        )
        # The agent takes its finalizers off the Instances; stopped first, it would leave the
        # namespace Terminating for good.
        with contextlib.suppress(AssertionError):
            until(lambda: not e.instance_json(), seconds=30, what="the Instance gone")
        e.stop_all()
        e.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def _config(script: str) -> dict[str, Any]:
    container = {
        "name": "broker",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
    }
    template = {
        "spec": {
            "containers": [container],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
        }
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
            "capacity": 1,
            "brokerSpec": {"brokerJobSpec": {"template": template, "backoffLimit": 0}},
        },
    }


def test_a_job_broker_reports_through_brokerinfo(env: Env) -> None:
    config = _config(SCRIPT)
    env.ensure_schema()
    env.kubectl("apply", "-f", "-", stdin=json.dumps(config))
    firmware, progress = f"{env.node}/firmware", f"{env.node}/progress"

    # While the Job runs: its files, under this node's key; the two bad ones skipped.
    report = until(
        lambda: (info := env.broker_info()).get(progress) and info,
        seconds=120,
        what="the running Job's files in brokerInfo",
    )
    assert report == {firmware: "1.2.3", progress: "flashing"}
    cond = until(env.condition, what="the BrokerInfoValid condition")
    assert cond["status"] == "False", cond
    assert "'big': over 64 bytes" in cond["message"]
    assert "'raw': not UTF-8" in cond["message"]
    until(
        lambda: any(
            e["reason"] == "BrokerInfoSkipped" and "'raw': not UTF-8" in e["message"]
            for e in json.loads(env.kubectl("get", "events", "-n", NS, "-o", "json"))["items"]
        ),
        what="a BrokerInfoSkipped Event on the Configuration",
    )

    # A removed file leaves the map.
    until(lambda: env.broker_info() == {firmware: "1.2.3"}, what="progress removed")

    # The Job completes, the reclaimer frees its slot: the report outlives the Job.
    until(
        lambda: not env.instance_json()["spec"].get("deviceUsage"),  # the Instance stays
        seconds=90,
        what="the Job's slot freed",
    )
    until(
        lambda: not list((env.root / NS / env.instance).glob(f"{env.instance}-*.g*")),
        what="the workload directory ended",
    )
    # (A short wait: another session's CRD without brokerInfo may have pruned it meanwhile; the
    # agent writes it again.)
    until(lambda: env.broker_info() == {firmware: "1.2.3"}, seconds=10, what="the report kept")


def test_a_new_generation_replaces_the_old_report(env: Env) -> None:
    script = 'echo -n 2.0.0 > "$AKRI_BROKER_INFO/firmware"; echo -n ok > "$AKRI_BROKER_INFO/result"'
    env.ensure_schema()
    env.kubectl("apply", "-f", "-", stdin=json.dumps(_config(script)))
    want = {f"{env.node}/firmware": "2.0.0", f"{env.node}/result": "ok"}
    until(lambda: env.broker_info() == want, seconds=120, what="the new Job's report alone")
    cond = until(
        lambda: (c := env.condition()) and c["status"] == "True" and c,
        what="BrokerInfoValid True again",
    )
    assert cond["reason"] == "Valid"
