"""k8s/webhook.yaml holds together: a locked-down Pod running `akri-trio webhook` with the TLS
Secret mounted where its flags point, probes on the routes the server has, a Service reaching
its port, and a ClusterRole granting the OpenAPI document and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from akri_trio.webhook.cli import parse_serve_args
from akri_trio.webhook.server import route

MANIFEST = Path(__file__).parents[2] / "k8s" / "webhook.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def test_pod_is_locked_down(docs: dict[str, dict[str, Any]]) -> None:
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}


def test_command_flags_point_at_the_mounted_secret(docs: dict[str, dict[str, Any]]) -> None:
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "akri-trio:latest"
    assert container["command"] == ["akri-trio", "webhook"]
    args = parse_serve_args(container["args"])
    mounts = {m["name"]: Path(m["mountPath"]) for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    tls = next(name for name, v in volumes.items() if "secret" in v)
    assert args.tls_cert_file == mounts[tls] / "tls.crt"
    assert args.tls_key_file == mounts[tls] / "tls.key"
    (port,) = container["ports"]
    assert port["containerPort"] == args.port


def test_probes_use_routes_the_server_answers(docs: dict[str, dict[str, Any]]) -> None:
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    (port,) = container["ports"]
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert (get["scheme"], get["port"]) == ("HTTPS", port["name"])
        assert route("GET", get["path"], b"", None).status != 404
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_service_reaches_the_pods(docs: dict[str, dict[str, Any]]) -> None:
    deployment, service = docs["Deployment"], docs["Service"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    assert port["targetPort"] == container["ports"][0]["name"]


def test_rbac_grants_only_the_openapi_document_and_reading_configurations(
    docs: dict[str, dict[str, Any]],
) -> None:
    assert docs["ClusterRole"]["rules"] == [
        {"nonResourceURLs": ["/openapi/v2", "/openapi/v2/*"], "verbs": ["get"]},
        {"apiGroups": ["akri.sh"], "resources": ["configurations"], "verbs": ["list", "watch"]},
    ]
    account = docs["ServiceAccount"]["metadata"]
    assert docs["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
