"""kubectl against the test cluster, and the busybox Pods node tests run: one wrapper instead of
one per test module."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Mapping
from typing import Any


class Kubectl:
    """The cluster's own kubectl (`cluster env`'s KUBECTL) with its admin kubeconfig."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.binary = env["KUBECTL"]
        self.environ = {**os.environ, "KUBECONFIG": env["KUBECONFIG"]}

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self.binary, *args], env=self.environ, input=stdin, capture_output=True, text=True
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, obj: Mapping[str, Any]) -> None:
        self("apply", "-f", "-", stdin=json.dumps(obj))


def busybox_pod(
    name: str, namespace: str, script: str, limits: Mapping[str, int | str] | None = None
) -> dict[str, Any]:
    """A Pod running `script` in the node's offline busybox image, never restarted."""
    container: dict[str, Any] = {
        "name": "c",
        "image": "docker.io/library/busybox:latest",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    }
    if limits:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [container],
        },
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def claim_pod(name: str, namespace: str, script: str, template: str) -> dict[str, Any]:
    """A busybox Pod whose container gets the devices of one claim made from `template` (a
    ResourceClaimTemplate)."""
    pod = busybox_pod(name, namespace, script)
    pod["spec"]["resourceClaims"] = [{"name": "claim", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "claim"}]}
    return pod
