"""What the node tests share: the agent as a real process (so restarts are real), the debugEcho
Configuration they run, and a namespace to start from and to leave clean."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.kubectl import Kubectl

CRDS = Path(__file__).parents[2] / "k8s" / "crds"


class AgentProcess:
    """`akri-trio agent <args>` with the cluster's kubeconfig, logging to `log`."""

    def __init__(self, kubectl: Kubectl, log: Path, args: Sequence[str]) -> None:
        self.environ = {**kubectl.environ, "PYTHONUNBUFFERED": "1"}
        self.log = log
        self.args = list(args)
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0  # the log's size when this run started

    def start(self) -> None:
        self.started_at = self.log.stat().st_size if self.log.exists() else 0
        log = open(self.log, "ab")  # noqa: SIM115  (closed with the process)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "akri_trio", "agent", *self.args],
            env=self.environ,
            stdout=log,
            stderr=log,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            assert self.process.wait(timeout=15) == 0, self.tail()
            self.process = None

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def this_run(self) -> str:
        """What the current run has logged so far."""
        with open(self.log, "rb") as f:
            f.seek(self.started_at)
            return f.read().decode(errors="replace")


def debug_echo_configuration(
    name: str, namespace: str, descriptions: Sequence[str], capacity: int
) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "discoveryHandler": {
                "name": "debugEcho",
                "discoveryDetails": yaml.safe_dump({"descriptions": list(descriptions)}),
            },
            "capacity": capacity,
        },
    }


def fresh_namespace(kubectl: Kubectl, namespace: str) -> None:
    """The akri.sh CRDs installed and `namespace` there, without the Pods or Configurations an
    interrupted earlier run left (they would hold devices)."""
    kubectl("apply", "-f", str(CRDS))
    kubectl(
        "wait", "--for=condition=Established", "crd/configurations.akri.sh", "crd/instances.akri.sh"
    )
    kubectl("create", "namespace", namespace, check=False)
    clear_namespace(kubectl, namespace)


def clear_namespace(kubectl: Kubectl, namespace: str, configuration: str = "--all") -> None:
    """Delete the namespace's Pods, then its Configuration(s), waiting for both."""
    kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    kubectl(
        "delete",
        "configurations.akri.sh",
        configuration,
        "-n",
        namespace,
        "--wait=true",
        "--timeout=30s",
        check=False,
    )
