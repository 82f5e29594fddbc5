"""k8s/webhook.yaml's RBAC is enough: the webhook process, given only a token of the manifest's
ServiceAccount (from the TokenRequest API, as the kubelet gets one for a Pod), fetches the
cluster's OpenAPI document and lists the Configurations, becomes ready and judges with those
schemas.

Every authenticated user may read /openapi/v2 through the default `system:discovery` binding,
so the process alone cannot tell whether the manifest's ClusterRole matters. A
SubjectAccessReview without the `system:authenticated` group can: it shows that the
ClusterRole by itself grants the document, and that the ServiceAccount may do nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from akri_trio.kube import Client
from tests.support.rbac import account_token, apply_rbac
from tests.webhook import live
from tests.webhook.test_server import admission_review, with_unknown_container_field

pytestmark = pytest.mark.k8s

MANIFEST = Path(__file__).parents[2] / "k8s" / "webhook.yaml"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


def _manifest_account() -> tuple[str, str]:
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if doc["kind"] == "ServiceAccount":
            return doc["metadata"]["namespace"], doc["metadata"]["name"]
    raise AssertionError("no ServiceAccount in the manifest")


NAMESPACE, ACCOUNT = _manifest_account()


@pytest.fixture
def admin(api: Client) -> Client:
    """The cluster admin's client (the shared `api`), beside the service accounts' ones."""
    return api


async def _allowed(api: Client, user: str, groups: list[str], **attributes: Any) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, **attributes},
    }
    answer = await api.request("POST", ACCESS_REVIEWS, body=review)
    return bool(answer["status"].get("allowed"))


async def test_webhook_runs_with_a_token_of_the_manifest_account(
    admin: Client, cluster: dict[str, str], tmp_path: Path
) -> None:
    await apply_rbac(admin, MANIFEST)
    kubeconfig = tmp_path / "webhook.kubeconfig"
    user = {"token": await account_token(admin, NAMESPACE, ACCOUNT)}
    server = {"server": cluster["AKRI_TRIO_APISERVER"]}
    server["certificate-authority"] = cluster["AKRI_TRIO_CA_CERT"]
    await trio.Path(kubeconfig).write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": server}],
                "users": [{"name": "webhook", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "webhook"}}],
                "current-context": "c",
            }
        )
    )
    certs = tmp_path / "certs"
    await trio.to_thread.run_sync(live.make_certs, certs, "rbac.webhook.akri-trio.test")
    log = tmp_path / "webhook.log"
    process = await trio.to_thread.run_sync(live.start_webhook, certs, kubeconfig, log)
    try:
        port = await live.listening_port(process, log)
        ca_pem = await trio.Path(certs / "ca.crt").read_bytes()
        await live.wait_ready(port, ca_pem, log)  # /openapi/v2 fetched with that token
        async with httpx.AsyncClient(verify=live.trusting(ca_pem)) as http:
            answer = await http.post(
                f"https://127.0.0.1:{port}/validate",
                content=json.dumps(admission_review(with_unknown_container_field())),
            )
        response = answer.json()["response"]
        assert response["allowed"] is False
        assert "containers[0].imagePullPolcy: unknown field" in response["status"]["message"]
    finally:
        await trio.to_thread.run_sync(live.stop_webhook, process)
    assert process.returncode == 0


async def test_the_cluster_role_alone_grants_the_openapi_document(admin: Client) -> None:
    await apply_rbac(admin, MANIFEST)
    # The ServiceAccount's groups minus system:authenticated, which system:discovery binds.
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"]
    openapi = {"nonResourceAttributes": {"path": "/openapi/v2", "verb": "get"}}
    ours = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    assert await _allowed(admin, ours, groups, **openapi)
    # The control: an account the manifest does not bind is refused the same request.
    assert not await _allowed(admin, f"system:serviceaccount:{NAMESPACE}:nobody", groups, **openapi)


async def test_the_account_may_list_and_watch_configurations(admin: Client) -> None:
    """The webhook's name check watches every Configuration (names only matter across
    namespaces)."""
    await apply_rbac(admin, MANIFEST)
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"]
    ours = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    for verb in ("list", "watch"):
        attributes = {"group": "akri.sh", "resource": "configurations", "verb": verb}
        assert await _allowed(admin, ours, groups, resourceAttributes=attributes)


@pytest.mark.parametrize(
    "attributes",
    [
        {"group": "akri.sh", "resource": "configurations", "verb": "update", "namespace": "a"},
        {"group": "akri.sh", "resource": "instances", "verb": "list"},
        {"group": "", "resource": "secrets", "verb": "get", "namespace": "kube-system"},
        {"group": "", "resource": "pods", "verb": "create", "namespace": "akri"},
    ],
    ids=["update-configurations", "list-instances", "get-secrets", "create-pods"],
)
async def test_the_account_may_do_nothing_else(admin: Client, attributes: dict[str, str]) -> None:
    await apply_rbac(admin, MANIFEST)
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"]
    groups.append("system:authenticated")
    ours = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    assert not await _allowed(admin, ours, groups, resourceAttributes=attributes)
