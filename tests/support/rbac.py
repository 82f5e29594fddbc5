"""Running a component with exactly the RBAC its manifest grants: apply the manifest's RBAC
objects and get a token of its ServiceAccount from the TokenRequest API, as the kubelet gets
one for a Pod."""

from __future__ import annotations

from pathlib import Path

import trio
import yaml

from akri_trio.kube.client import Client, Resource

RBAC_KINDS = {
    "Namespace": Resource.core("namespaces", "Namespace", namespaced=False),
    "ServiceAccount": Resource.core("serviceaccounts", "ServiceAccount"),
    "ClusterRole": Resource(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
    ),
    "ClusterRoleBinding": Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
}


async def apply_rbac(api: Client, manifest: Path) -> None:
    """Apply the manifest's Namespace, ServiceAccount, ClusterRole and ClusterRoleBinding."""
    for doc in yaml.safe_load_all(await trio.Path(manifest).read_text()):
        if doc["kind"] in RBAC_KINDS:
            await api.apply(
                RBAC_KINDS[doc["kind"]], doc, field_manager="akri-trio-tests", force=True
            )


async def account_token(api: Client, namespace: str, account: str) -> str:
    """A bound token of the ServiceAccount, valid for an hour."""
    path = RBAC_KINDS["ServiceAccount"].path(namespace, account, "token")
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    answer = await api.request("POST", path, body=request)
    token: str = answer["status"]["token"]
    return token
