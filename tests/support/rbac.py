"""Run a component with exactly the RBAC its manifest grants: apply the manifest's Namespaces,
ServiceAccount, (Cluster)Roles and bindings, and get a token for that ServiceAccount from the
TokenRequest API, as the kubelet gets one for a Pod."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import yaml

from akri_trio.kube.client import Client, Resource
from akri_trio.kube.config import KubeConfig

RBAC = "rbac.authorization.k8s.io"
RBAC_KINDS = {
    "Namespace": Resource.core("namespaces", "Namespace", namespaced=False),
    "ServiceAccount": Resource.core("serviceaccounts", "ServiceAccount"),
    "ClusterRole": Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False),
    "ClusterRoleBinding": Resource(
        RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
    ),
    "Role": Resource(RBAC, "v1", "roles", "Role"),
    "RoleBinding": Resource(RBAC, "v1", "rolebindings", "RoleBinding"),
}


async def apply_rbac(api: Client, manifest: Path) -> None:
    """Apply the manifest's RBAC objects, and the Namespaces they are in (a manifest that
    shares its namespace with another leaves the Namespace object to that one)."""
    docs = [d for d in yaml.safe_load_all(await trio.Path(manifest).read_text()) if d]
    for ns in sorted({d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}):
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        await api.apply(
            RBAC_KINDS["Namespace"], namespace, field_manager="akri-trio-tests", force=True
        )
    for doc in docs:
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


async def manifest_token(api: Client, manifest: Path, namespace: str, account: str) -> str:
    """Apply `manifest`'s RBAC objects; a bound token of `account`."""
    await apply_rbac(api, manifest)
    return await account_token(api, namespace, account)


@asynccontextmanager
async def manifest_client(
    admin: Client, cluster: Mapping[str, str], manifest: Path, namespace: str, account: str
) -> AsyncIterator[Client]:
    """A client authenticating as `account`, with only what `manifest` grants it."""
    config = KubeConfig(
        server=cluster["AKRI_TRIO_APISERVER"],
        token=await manifest_token(admin, manifest, namespace, account),
        ca_pem=await trio.Path(cluster["AKRI_TRIO_CA_CERT"]).read_bytes(),
    )
    async with Client.open(config) as client:
        yield client
