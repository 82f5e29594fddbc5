"""brokerInfo in DRA mode on a real node: a broker Pod (busybox, made by the controller with a
claim from its Instance's ResourceClaimTemplate) writes files into the directory the agent's
kubelet plugin mounted into it through the claim's CDI spec, and they show up in its claim's
`status.devices[].data` and in its Instance's brokerInfo, with device-plugin mode's limits.

The agent (`--allocation dra --broker-info-dir`, debugEcho embedded as `draBiEcho`, see
tests/support/echo_agent.py) and the controller (`--allocation dra`) run as real processes
watching only this module's namespace. The broker writes a report, a progress file it removes
later, and what an agent must refuse: a file over the per-file limit, one that is not UTF-8, a
symbolic link to the node's /etc/passwd and a FIFO (which would block a reader).
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
from tests.support.kubectl import Kubectl
from tests.support.node_agent import fresh_namespace
from tests.support.polling import until

pytestmark = pytest.mark.node

NS = f"bi-dra-node-{secrets.token_hex(3)}"
ECHO = "draBiEcho"
CONFIG = "bi-dra"
DESCRIPTION = "fw0"
BUSYBOX = "docker.io/library/busybox:latest"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
cd "$AKRI_BROKER_INFO"
echo -n 1.2.3 > .firmware.tmp && mv .firmware.tmp firmware
echo -n flashing > progress
head -c 100 /dev/zero | tr '\\0' x > big
printf '\\377\\376' > raw
ln -s /etc/passwd passwd
mkfifo pipe
sleep 20
rm progress
sleep 3600
"""
REFUSED = (
    "'big': over 64 bytes",
    "'passwd': a symbolic link",
    "'pipe': not a regular file",
    "'raw': not UTF-8",
)


class Env:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.cluster = env
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

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

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
        crd = self.get("crd", "instances.akri.sh")
        if not crd:
            return
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        if "brokerInfo" not in spec["properties"]["spec"]["properties"]:
            self.kubectl("apply", "-f", str(REPO / "k8s" / "crds" / "instance.yaml"))

    def instance_broker_info(self) -> dict[str, str]:
        self.ensure_schema()
        inst = self.get("instances.akri.sh", self.instance, "-n", NS)
        return dict((inst.get("spec") or {}).get("brokerInfo") or {})

    def get(self, *args: str) -> dict[str, Any]:
        """`kubectl get ... -o json`, or {} (missing, or the API server restarting: other
        sessions restart the shared control plane)."""
        out = self.kubectl("get", *args, "-o", "json", check=False)
        return dict(json.loads(out)) if out else {}

    def broker(self) -> dict[str, Any] | None:
        items = self.get("pods", "-n", NS, "-l", naming.LABEL_INSTANCE).get("items", [])
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return live[0] if len(live) == 1 else None

    def claim(self) -> dict[str, Any] | None:
        pod = self.broker()
        statuses = ((pod or {}).get("status") or {}).get("resourceClaimStatuses") or []
        if len(statuses) != 1:
            return None
        return self.get("resourceclaim", statuses[0]["resourceClaimName"], "-n", NS) or None

    def claim_broker_info(self) -> dict[str, str]:
        """The broker's claim's status.devices data of driver akri.sh (one device)."""
        claim = self.claim() or {}
        entries = [
            e for e in (claim.get("status") or {}).get("devices") or [] if e["driver"] == dra.DRIVER
        ]
        if len(entries) != 1:
            return {}
        return dict((entries[0].get("data") or {}).get("brokerInfo") or {})

    def condition(self) -> dict[str, Any] | None:
        config = self.get("configurations.akri.sh", CONFIG, "-n", NS)
        for entry in (config.get("status") or {}).get("nodes") or []:
            if entry.get("node") == self.node:
                for cond in entry.get("conditions") or []:
                    if cond["type"] == "BrokerInfoValid":
                        return dict(cond)
        return None


def _config() -> dict[str, Any]:
    container = {
        "name": "broker",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", SCRIPT],
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
            "capacity": 1,
            "brokerSpec": {
                "brokerPodSpec": {"containers": [container], "terminationGracePeriodSeconds": 1}
            },
        },
    }


@pytest.fixture(scope="module")
def env(node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(node_cluster, tmp_path_factory.mktemp("bi-dra-node"))
    fresh_namespace(e.kubectl, NS)
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
                "--allocation", "dra",
                "--kubelet-root-dir", node_cluster["AKRI_TRIO_KUBELET_ROOT_DIR"],
                "--cdi-dir", node_cluster["AKRI_TRIO_CDI_DIR"],
                "--discovery-handlers-directory", str(e.tmp / "akri"),
                "--debug-echo-availability", str(e.tmp / "availability"),
                "--metrics-port", "-1",
                "--broker-info-dir", str(e.root),
                "--broker-info-period", "0.5",
                "--broker-info-max-file-bytes", "64",
            ],
        )  # fmt: skip
        e.spawn(
            "controller",
            [
                "akri_trio", "controller",
                "--allocation", "dra",
                "--namespace", NS,
                "--no-leader-elect",
                "--metrics-port", "-1",
            ],
        )  # fmt: skip
        yield e
    finally:
        e.kubectl("delete", "pods", "--all", "-n", NS, "--wait=true", "--timeout=60s", check=False)
        e.kubectl(
            "delete", "configurations.akri.sh", "--all", "-n", NS, "--wait=false", check=False
        )
        # The agent takes its finalizers off the Instances; stopped first, it would leave the
        # namespace Terminating for good.
        with contextlib.suppress(AssertionError):
            until(
                lambda: not e.get("instances.akri.sh", "-n", NS).get("items", [1]),
                seconds=30,
                what="the Instance gone",
            )
        e.stop_all()
        e.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def test_a_broker_s_files_reach_its_claim_and_its_instance(env: Env) -> None:
    env.ensure_schema()
    config = json.dumps(_config())
    until(lambda: env.kubectl("apply", "-f", "-", stdin=config, check=False), what="applied")
    firmware, progress = f"{env.node}/firmware", f"{env.node}/progress"
    want = {firmware: "1.2.3", progress: "flashing"}

    until(lambda: env.claim_broker_info() == want, seconds=180, what="the files in the claim")
    assert env.instance_broker_info() == want or until(
        lambda: env.instance_broker_info() == want, what="the files in the Instance"
    )
    claim = env.claim()
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    (entry,) = claim["status"]["devices"]
    assert (entry["pool"], entry["device"]) == (result["pool"], result["device"])

    # A removed file leaves both.
    until(lambda: env.claim_broker_info() == {firmware: "1.2.3"}, seconds=60, what="claim")
    until(lambda: env.instance_broker_info() == {firmware: "1.2.3"}, what="Instance")


def test_what_device_plugin_mode_refuses_is_refused(env: Env) -> None:
    cond = until(env.condition, what="the BrokerInfoValid condition")
    assert cond["status"] == "False", cond
    for refused in REFUSED:
        assert refused in cond["message"], cond
    assert "root:" not in json.dumps(env.claim_broker_info())  # /etc/passwd never read
    assert set(env.claim_broker_info()) == {f"{env.node}/firmware"}
    assert set(env.instance_broker_info()) == {f"{env.node}/firmware"}
