"""`kubectl apply -k k8s/` deploys what the Helm chart deploys with its defaults (the CRDs, the
agent and the controller with their RBAC; the webhook is off by default in both): rendered with
the cluster's own kubectl (`kubectl kustomize`, offline) and compared object by object with the
chart, for people who install without Helm."""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import crds, one, pod_spec, render
from tests.support.kubectl import Kubectl

pytestmark = pytest.mark.k8s  # for `cluster env`'s KUBECTL, built with the cluster

REPO = Path(__file__).resolve().parents[2]
# Helm-only: the pre-delete hook, the webhook (on by default in the chart; without Helm it is
# applied on its own, after its certificate: k8s/webhook.yaml), and the Lease made so that
# uninstall removes it (the controller makes it where nobody did).
CHART_ONLY = {"akri-teardown", "akri-webhook-configuration"}
CHART_ONLY_OBJECTS = {("Lease", "akri-controller")}
# The workloads, and the parts of their Pod spec that must be the chart's (the rest is labels).
WORKLOADS = [("DaemonSet", "akri-agent-daemonset"), ("Deployment", "akri-controller-deployment")]
POD_KEYS = ("serviceAccountName", "nodeSelector", "tolerations", "securityContext", "volumes")
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")


@pytest.fixture(scope="module")
def kustomized(cluster: dict[str, str]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [cluster["KUBECTL"], "kustomize", str(REPO / "k8s")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _comparable(container: dict[str, Any]) -> dict[str, Any]:
    keys = ("args", "env", "ports", "securityContext", "volumeMounts")
    probes = {p: container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    return {**{k: container.get(k) for k in keys}, **probes}


def test_same_objects_as_the_chart_defaults(kustomized: list[dict[str, Any]]) -> None:
    ours = {(o["kind"], o["metadata"]["name"]) for o in kustomized}
    chart = {
        (o["kind"], o["metadata"]["name"])
        for o in render()
        if o["metadata"]["labels"]["app.kubernetes.io/name"] not in CHART_ONLY
    } - CHART_ONLY_OBJECTS
    crd_names = {("CustomResourceDefinition", c["metadata"]["name"]) for c in crds()}
    assert ours == chart | crd_names | {("Namespace", "akri")}
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in kustomized}
    for crd in crds():
        assert by_key["CustomResourceDefinition", crd["metadata"]["name"]] == crd


@pytest.mark.parametrize(("kind", "name"), WORKLOADS)
def test_workloads_match_the_chart(kustomized: list[dict[str, Any]], kind: str, name: str) -> None:
    mine_obj, chart_obj = one(kustomized, kind, name), one(render(), kind, name)
    assert mine_obj["spec"].get("replicas") == chart_obj["spec"].get("replicas")
    ours, chart = pod_spec(mine_obj), pod_spec(chart_obj)
    for key in POD_KEYS:
        assert ours.get(key) == chart.get(key), key
    (mine,) = ours["containers"]
    (theirs,) = chart["containers"]
    assert _comparable(mine) == _comparable(theirs)
    assert mine["resources"] == theirs["resources"]
    assert mine["image"] == theirs["image"] == "akri-trio:0.1.0"


def test_rbac_matches_the_chart(kustomized: list[dict[str, Any]]) -> None:
    """Every RBAC object grants what the chart's of the same name does (which objects there are
    is test_same_objects_as_the_chart_defaults')."""
    chart = render()
    for obj in kustomized:
        if obj["kind"] in RBAC_KINDS:
            chart_obj = one(chart, obj["kind"], obj["metadata"]["name"])
            assert obj["metadata"].get("namespace") == chart_obj["metadata"].get("namespace")
            for key in ("rules", "roleRef", "subjects"):
                assert obj.get(key) == chart_obj.get(key), (obj["metadata"]["name"], key)


def test_the_api_server_accepts_every_object(
    kustomized: list[dict[str, Any]], cluster: dict[str, str]
) -> None:
    """A server-side dry run of everything but the CRDs (which the tests install anyway), moved
    to a namespace of the test's own: the API server validates each object and stores none."""
    kubectl = Kubectl(cluster)
    ns = f"kz-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        docs = []
        for obj in copy.deepcopy(kustomized):
            if obj["kind"] in ("Namespace", "CustomResourceDefinition"):
                continue
            if obj["metadata"].get("namespace") == "akri":
                obj["metadata"]["namespace"] = ns
            for subject in obj.get("subjects") or []:
                subject["namespace"] = ns
            docs.append(obj)
        out = kubectl(
            "apply",
            "--dry-run=server",
            "-f",
            "-",
            stdin=json.dumps({"kind": "List", "apiVersion": "v1", "items": docs}),
        )
        assert out.count("(server dry run)") == len(docs)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
