"""akri-trio as Pods on the real node: the image built offline and imported into containerd
(cached by content hash), the Helm chart installed with Helm v4's engine, the agent's Pod
offering debugEcho devices to the kubelet, a DaemonSet restart that loses no slot, the webhook's
Pod refusing a bad Configuration, an upgrade, and an uninstall that leaves nothing behind.

The test cluster's Pods cannot reach the API server through the `kubernetes` Service (no
kube-proxy, and the API server publishes no endpoints for it), so the release runs with
kubernetesApiOverride: host network and the API server's loopback address. Everything is
scoped to this run (its own namespace, release, handler directory and metrics port, an agent
watching only that namespace), since other test sessions share the node. For the same reason
the chart goes in without its crds/ (as `helm install --skip-crds` would): the shared cluster
has the CRDs already, possibly a newer version from another branch, which Helm v4's
server-side apply of crds/ would rightly refuse to take over.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python
import pytest

from akri_trio.cluster.image import ensure_image
from akri_trio.model import naming
from tests.support.chart import CHART
from tests.support.kubectl import Kubectl, busybox_pod, free_port
from tests.support.polling import until

pytestmark = pytest.mark.node

CONFIG = "ship-echo"
DESCRIPTIONS = ("ship0", "ship1")


class Release:
    """One install of the chart and the kubectl view of what it made."""

    def __init__(self, env: dict[str, str], image: str, chart: Path) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.env = env
        self.name = self.namespace = f"ship-{suffix}"
        self.node = env["AKRI_TRIO_NODE_NAME"]
        self.handlers_dir = Path(f"/var/lib/akri-{self.name}")
        api = urlsplit(env["AKRI_TRIO_APISERVER"])
        repository, tag = image.rsplit(":", 1)
        webhook_port = free_port()
        self.values: dict[str, Any] = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "kubernetesApiOverride": {"enabled": True, "host": api.hostname, "port": api.port},
            "agent": {
                "allowDebugEcho": True,
                "watchNamespace": self.namespace,
                "metricsPort": free_port(),
                "host": {"discoveryHandlers": str(self.handlers_dir)},
            },
            # the controller's command is not in this tree yet
            "controller": {"enabled": False},
            # by URL: this API server cannot reach Services; only this run's namespace, and
            # Ignore so the sample Configuration of this same install is not refused while the
            # webhook Pod starts (a denial is still a denial)
            "webhookConfiguration": {
                "enabled": True,
                "replicas": 1,
                "port": webhook_port,
                "url": f"https://127.0.0.1:{webhook_port}/validate",
                "certIPs": ["127.0.0.1"],
                "failurePolicy": "Ignore",
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                },
            },
            "cleanupHook": {"namespaces": [self.namespace], "timeoutSeconds": 60},
            "debugEcho": {
                "configuration": {
                    "enabled": True,
                    "name": CONFIG,
                    "capacity": 2,
                    "shared": False,
                    "discoveryDetails": {"descriptions": list(DESCRIPTIONS)},
                }
            },
        }
        self.chart = chart
        self.kubectl = Kubectl(env)
        self.helm = helm_python.Config(kubeconfig_path=env["KUBECONFIG"], namespace=self.namespace)
        self.installed = False
        self.instances = {
            d: naming.instance_name(CONFIG, naming.device_hash(d, self.node)) for d in DESCRIPTIONS
        }

    def get(self, *args: str) -> Any:
        return self.kubectl.json("get", *args)

    def install(self) -> None:
        self.helm.install(
            self.chart, self.name, self.values, namespace=self.namespace, create_namespace=True
        )
        self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            self.helm.uninstall(self.name, wait="watcher", timeout=180)
            self.installed = False

    def pods(self, name: str = "akri-agent") -> list[dict[str, Any]]:
        pods = self.get("pods", "-n", self.namespace, "-l", f"app.kubernetes.io/name={name}")
        return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready_agent(self, name: str = "akri-agent") -> dict[str, Any] | None:
        for pod in self.pods(name):
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return pod
        return None

    def allocatable(self) -> dict[str, str]:
        ours = {f"akri.sh/{i}" for i in self.instances.values()} | {f"akri.sh/{CONFIG}"}
        node = self.get("node", self.node)
        return {k: v for k, v in node["status"]["allocatable"].items() if k in ours}

    def usage(self) -> dict[str, dict[str, str]]:
        items = self.get("instances.akri.sh", "-n", self.namespace)["items"]
        return {i["metadata"]["name"]: i["spec"].get("deviceUsage", {}) for i in items}

    def consumer(self, name: str, instance: str) -> None:
        script = "env | grep ^DEBUG_ECHO; sleep 3600"
        self.kubectl.apply(busybox_pod(name, self.namespace, script, {f"akri.sh/{instance}": 1}))

    def phase(self, pod: str) -> str:
        return str(self.get("pod", pod, "-n", self.namespace).get("status", {}).get("phase"))

    def diagnostics(self) -> str:
        out = [self.kubectl("get", "all", "-n", self.namespace, "-o", "wide", check=False)]
        for pod in self.pods() + self.pods("akri-webhook"):
            name = pod["metadata"]["name"]
            out.append(self.kubectl("logs", "-n", self.namespace, name, "--tail=60", check=False))
        return "\n".join(out)


@pytest.fixture(scope="module")
def release(
    node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    image = ensure_image()
    chart = tmp_path_factory.mktemp("chart") / "akri-trio"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("crds"))
    rel = Release(node_cluster, image, chart)
    try:
        rel.install()
        yield rel
    finally:
        try:
            rel.kubectl("delete", "pods", "-n", rel.namespace, "first", "second", check=False)
            rel.uninstall()
        finally:
            rel.kubectl("delete", "namespace", rel.name, "--wait=false", check=False)
            subprocess.run(["rm", "-rf", str(rel.handlers_dir)], check=False)


def test_agent_pod_offers_the_devices(release: Release) -> None:
    try:
        until(release.ready_agent, what="the agent Pod Ready", seconds=120)
        expected = {f"akri.sh/{i}": "2" for i in release.instances.values()}
        expected[f"akri.sh/{CONFIG}"] = "2"  # "any of them": capacity virtual devices
        until(lambda: release.allocatable() == expected, what="the plugins on the node")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{release.diagnostics()}") from None
    instances = release.get("instances.akri.sh", "-n", release.namespace)["items"]
    assert {i["metadata"]["name"] for i in instances} == set(release.instances.values())
    for inst in instances:
        assert inst["spec"]["nodes"] == [release.node]
        assert inst["spec"]["configurationName"] == CONFIG
    agent = release.ready_agent()
    assert agent is not None
    spec = agent["spec"]
    assert spec["hostNetwork"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_new_agent_pod_loses_no_slot(release: Release) -> None:
    instance = release.instances[DESCRIPTIONS[0]]
    release.consumer("first", instance)
    until(lambda: release.phase("first") == "Running", what="the first consumer Running")
    held = release.usage()[instance]
    assert list(held.values()) == [release.node]  # one slot claimed; free slots are absent

    old = release.ready_agent()
    assert old is not None
    release.kubectl("delete", "pod", "-n", release.namespace, old["metadata"]["name"])
    new = until(
        lambda: (
            (p := release.ready_agent()) and p["metadata"]["uid"] != old["metadata"]["uid"] and p
        ),
        what="a new agent Pod Ready",
        seconds=120,
    )
    assert new["metadata"]["name"] != old["metadata"]["name"]
    # the slot the running consumer holds is still held, and nothing else is claimed
    until(lambda: release.allocatable().get(f"akri.sh/{instance}") == "2", what="the plugin back")
    assert release.usage()[instance] == held
    assert release.phase("first") == "Running"
    # and the other slot is still free: a second consumer gets it
    release.consumer("second", instance)
    until(lambda: release.phase("second") == "Running", what="the second consumer Running")
    assert sorted(release.usage()[instance].values()) == [release.node, release.node]
    release.kubectl(
        "delete", "pod", "-n", release.namespace, "first", "second", "--wait=true", "--timeout=60s"
    )


def test_the_webhook_pod_refuses_a_bad_configuration(release: Release) -> None:
    until(lambda: release.ready_agent("akri-webhook"), what="the webhook Pod Ready", seconds=120)
    bad = {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": "ship-bad", "namespace": release.namespace},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": "descriptions: [b]"},
            "brokerSpec": {
                "brokerPodSpec": {
                    "containers": [{"name": "b", "image": "x", "imagePullPolcy": "Never"}]
                }
            },
        },
    }
    with pytest.raises(AssertionError, match=r"denied the request(.|\n)*imagePullPolcy"):
        release.kubectl.apply(bad)
    assert release.get("configurations.akri.sh", "-n", release.namespace)["items"] != []


def test_upgrade_changes_the_sample_configuration(release: Release) -> None:
    """An upgrade goes through the webhook (UPDATE) and the agent follows it."""
    values = copy.deepcopy(release.values)
    details = values["debugEcho"]["configuration"]["discoveryDetails"]
    details["descriptions"] = [*DESCRIPTIONS, "ship2"]
    release.helm.upgrade(release.chart, release.name, values, namespace=release.namespace)
    until(lambda: len(release.usage()) == 3, what="a third Instance after the upgrade")
    config = release.get("configurations.akri.sh", CONFIG, "-n", release.namespace)
    assert "ship2" in config["spec"]["discoveryHandler"]["discoveryDetails"]


def test_uninstall_leaves_nothing(release: Release) -> None:
    ns = release.namespace
    # a Configuration the release did not make: only the pre-delete hook removes it (and must,
    # while the agent still runs to release its Instances' finalizers)
    extra = {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": "ship-extra", "namespace": ns},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": "descriptions: [x9]"},
            "capacity": 1,
        },
    }
    release.kubectl.apply(extra)
    until(
        lambda: any(name.startswith("ship-extra-") for name in release.usage()),
        what="the extra Configuration's Instance",
    )
    release.uninstall()
    assert release.get("configurations.akri.sh", "-n", ns)["items"] == []
    assert release.get("instances.akri.sh", "-n", ns)["items"] == []

    def left() -> list[tuple[str, str]]:
        kinds = "all,serviceaccounts,roles,rolebindings,secrets,configmaps"
        return [
            (o["kind"], o["metadata"]["name"])
            for o in release.get(kinds, "-n", ns)["items"]
            # the namespace's own ServiceAccount and CA bundle
            if o["metadata"]["name"] not in ("default", "kube-root-ca.crt")
        ]

    # the DaemonSet is gone when uninstall returns; its Pod stops on SIGTERM right after
    until(lambda: not left(), what="the namespace emptied", seconds=60)
    cluster_wide = release.get("clusterroles,clusterrolebindings")["items"]
    assert [
        o["metadata"]["name"] for o in cluster_wide if release.name in o["metadata"]["name"]
    ] == []
    # no device plugin of this run's Configurations is left on the node. (Not checked through the
    # node's allocatable: on a shared node, another session's agent watching every namespace
    # serves these Configurations too while they exist, and the kubelet's bookkeeping of two
    # agents registering one resource is not ours to test.)
    plugins = Path(release.env["AKRI_TRIO_DEVICE_PLUGIN_DIR"])
    until(
        lambda: (
            not [
                p for p in plugins.glob("*.sock") if p.name.startswith(("ship-echo", "ship-extra"))
            ]
        ),
        what="this run's plugin sockets removed",
    )
    assert not [p for p in release.handlers_dir.glob("*.sock")]
