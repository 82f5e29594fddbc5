"""One install of the Helm chart on the test node (Helm v4's engine through helm-python-sdk), and
the kubectl view of what it made: what tests/deploy's Pod tests share.

The test cluster's Pods cannot reach the API server through the `kubernetes` Service (no
kube-proxy, and the API server publishes no endpoints for it), so a release runs with
kubernetesApiOverride: host network and the API server's loopback address. Everything is scoped
to the run (its own namespace, release name, handler directory and metrics ports, an agent and a
controller watching only that namespace), since other test sessions share the node. For the
same reason the chart goes in without its crds/ (as `helm install --skip-crds` would): the
shared cluster may hold a newer version from another branch, which Helm v4's server-side apply
of crds/ would rightly refuse to take over; the fixture applies this tree's CRDs itself first.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python

from akri_trio_dev.cluster.image import ensure_image
from tests.support.chart import CHART
from tests.support.kubectl import Kubectl, free_port
from tests.support.polling import until

Obj = dict[str, Any]


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`, maps key by key (as Helm merges values files)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Release:
    """A release named after its namespace, `prefix-<random>`."""

    def __init__(self, env: dict[str, str], image: str, chart: Path, prefix: str) -> None:
        self.env = env
        self.name = self.namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.handlers_dir = Path(f"/var/lib/akri-{self.name}")
        self.chart = chart
        self.kubectl = Kubectl(env)
        self.helm = helm_python.Config(kubeconfig_path=env["KUBECONFIG"], namespace=self.namespace)
        self.installed = False
        # whose logs a failed wait shows (app.kubernetes.io/name of their Pods)
        self.components: tuple[str, ...] = ("akri-agent",)
        api = urlsplit(env["AKRI_TRIO_APISERVER"])
        repository, tag = image.rsplit(":", 1)
        # what every release of a test needs; a test merges its own values over these
        self.values: dict[str, Any] = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "kubernetesApiOverride": {"enabled": True, "host": api.hostname, "port": api.port},
            "agent": {
                "watchNamespace": self.namespace,
                "metricsPort": free_port(),
                "host": {"discoveryHandlers": str(self.handlers_dir)},
            },
            # one replica: on the host network a second one could not bind the metrics port
            "controller": {
                "replicas": 1,
                "watchNamespace": self.namespace,
                "metricsPort": free_port(),
            },
            "cleanupHook": {"namespaces": [self.namespace], "timeoutSeconds": 60},
            # on by default, but registered through its Service, which this API server cannot
            # reach: a test that wants it registers it by URL (test_pods.py)
            "webhookConfiguration": {"enabled": False},
        }

    def get(self, *args: str) -> Any:
        return self.kubectl.json("get", *args)

    def install(self, values: Mapping[str, Any]) -> None:
        self.values = merged(self.values, values)
        self.helm.install(
            self.chart, self.name, self.values, namespace=self.namespace, create_namespace=True
        )
        self.installed = True

    def upgrade(self, values: Mapping[str, Any]) -> None:
        self.values = merged(self.values, values)
        self.helm.upgrade(self.chart, self.name, self.values, namespace=self.namespace)

    def uninstall(self) -> None:
        if self.installed:
            self.helm.uninstall(self.name, wait="watcher", timeout=180)
            self.installed = False

    def pods(self, name: str) -> list[Obj]:
        """The live (not terminating) Pods of the component `name` (its app.kubernetes.io/name)."""
        pods = self.get("pods", "-n", self.namespace, "-l", f"app.kubernetes.io/name={name}")
        return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]

    def pods_of(self, configuration: str) -> list[Obj]:
        """The Pods the controller made for `configuration` (brokers, Job Pods), terminating
        ones included."""
        label = f"akri.sh/configuration={configuration}"
        return list(self.get("pods", "-n", self.namespace, "-l", label)["items"])

    def ready_pod(self, name: str) -> Obj | None:
        for pod in self.pods(name):
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return pod
        return None

    def usage(self) -> dict[str, dict[str, str]]:
        """deviceUsage of each Instance in the release's namespace, by Instance name."""
        items = self.get("instances.akri.sh", "-n", self.namespace)["items"]
        return {i["metadata"]["name"]: i["spec"].get("deviceUsage", {}) for i in items}

    def allocatable(self, resources: set[str]) -> dict[str, str]:
        """The node's allocatable count of each of `resources` it has."""
        node = self.get("node", self.node)
        return {k: v for k, v in node["status"]["allocatable"].items() if k in resources}

    def phase(self, pod: str) -> str:
        return str(self.get("pod", pod, "-n", self.namespace).get("status", {}).get("phase"))

    def logs(self, pod: str) -> str:
        return self.kubectl("logs", "-n", self.namespace, pod, check=False)

    def until(self, check: Callable[[], Any], what: str, seconds: float = 60) -> Any:
        """`polling.until`, with the namespace's objects and the components' logs in the
        failure."""
        try:
            return until(check, what=what, seconds=seconds)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    def diagnostics(self) -> str:
        out = [self.kubectl("get", "all", "-n", self.namespace, "-o", "wide", check=False)]
        for name in self.components:
            for pod in self.pods(name):
                pod_name = pod["metadata"]["name"]
                out.append(f"--- {pod_name}")
                out.append(
                    self.kubectl("logs", "-n", self.namespace, pod_name, "--tail=60", check=False)
                )
        return "\n".join(out)

    def left(self) -> list[tuple[str, str]]:
        """What is left in the namespace but for what Kubernetes puts in every namespace."""
        kinds = "all,serviceaccounts,roles,rolebindings,secrets,configmaps,leases"
        return [
            (o["kind"], o["metadata"]["name"])
            for o in self.get(kinds, "-n", self.namespace)["items"]
            if o["metadata"]["name"] not in ("default", "kube-root-ca.crt")
        ]


def _apply_crds(kubectl: Kubectl) -> None:
    """This tree's CRDs, as the agent tests install them (server-side, taking over whatever
    another branch applied): a module run alone, or after a test that removed them, finds them
    in place like one run after the others."""
    kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=akri-trio-tests",
        "-f",
        str(CHART.parents[1] / "crds"),
    )
    kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/configurations.akri.sh",
        "crd/instances.akri.sh",
    )


@contextmanager
def release(env: dict[str, str], prefix: str, tmp: Path) -> Iterator[Release]:
    """A Release of this tree's image (built and imported unless the node has it) and chart; on
    the way out uninstalled if still installed, its namespace and handler directory removed."""
    image = ensure_image()
    chart = tmp / "akri-trio"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("crds"))
    rel = Release(env, image, chart, prefix)
    _apply_crds(rel.kubectl)
    try:
        yield rel
    finally:
        try:
            rel.uninstall()
        finally:
            rel.kubectl("delete", "namespace", rel.name, "--wait=false", check=False)
            subprocess.run(["rm", "-rf", str(rel.handlers_dir)], check=False)
