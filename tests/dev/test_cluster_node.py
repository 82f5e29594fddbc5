"""`python -m akri_trio_dev cluster up --node`: a real kubelet on containerd that runs pods from
local images.

Shares the session's node (conftest `node_cluster`) and never stops it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.k8s, pytest.mark.node]

POD = "cluster-test-hi"


def _kubectl(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [env["KUBECTL"], *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={**os.environ, "KUBECONFIG": env["KUBECONFIG"]},
        timeout=60,
    )


def _get(env: dict[str, str], *args: str) -> Any:
    proc = _kubectl(env, "get", *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_node_is_ready(node_cluster: dict[str, str]) -> None:
    node = _get(node_cluster, "node", node_cluster["AKRI_TRIO_NODE_NAME"])
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_kubelet_sockets_are_at_standard_paths(node_cluster: dict[str, str]) -> None:
    for path in (
        "/var/lib/kubelet/device-plugins/kubelet.sock",
        node_cluster["AKRI_TRIO_POD_RESOURCES_SOCKET"],
    ):
        assert stat.S_ISSOCK(Path(path).stat().st_mode), path
    assert node_cluster["AKRI_TRIO_DEVICE_PLUGIN_DIR"] == "/var/lib/kubelet/device-plugins"


def test_busybox_pod_runs_and_kubectl_logs_shows_its_output(node_cluster: dict[str, str]) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": "docker.io/library/busybox:latest",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo hi; sleep 3600"],
                }
            ],
        },
    }
    _kubectl(
        node_cluster, "delete", "pod", POD, "--ignore-not-found", "--grace-period=0", "--force"
    )
    created = _kubectl(node_cluster, "apply", "-f", "-", stdin=json.dumps(manifest))
    assert created.returncode == 0, created.stderr
    try:
        deadline = time.monotonic() + 60
        phase = ""
        while time.monotonic() < deadline:
            pod = _get(node_cluster, "pod", POD)
            phase = pod["status"].get("phase", "")
            if phase == "Running":
                break
            time.sleep(0.5)
        assert phase == "Running", json.dumps(pod["status"], indent=1)
        assert (
            pod["spec"]["nodeName"] == node_cluster["AKRI_TRIO_NODE_NAME"]
        )  # the scheduler placed it
        logs = ""
        while time.monotonic() < deadline and "hi" not in logs:
            logs = _kubectl(node_cluster, "logs", POD).stdout
            time.sleep(0.2)
        assert logs.strip() == "hi"
    finally:
        deleted = _kubectl(node_cluster, "delete", "pod", POD, "--wait=true", "--timeout=45s")
    assert deleted.returncode == 0, deleted.stderr
    assert _kubectl(node_cluster, "get", "pod", POD).returncode != 0
