"""Run a component with exactly the RBAC its manifest grants: apply the manifest's
ServiceAccount and (Cluster)Roles and bindings, and get a token for that ServiceAccount from the
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
KINDS = {
    "Namespace": Resource.core("namespaces", "Namespace", namespaced=False),
    "ServiceAccount": Resource.core("serviceaccounts", "ServiceAccount"),
    "ClusterRole": Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False),
    "ClusterRoleBinding": Resource(
        RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
    ),
    "Role": Resource(RBAC, "v1", "roles", "Role"),
    "RoleBinding": Resource(RBAC, "v1", "rolebindings", "RoleBinding"),
}


async def manifest_token(api: Client, manifest: Path, namespace: str, account: str) -> str:
    """Apply `manifest`'s RBAC objects (and Namespace); a bound token of `account`."""
    for doc in yaml.safe_load_all(await trio.Path(manifest).read_text()):
        if doc and doc["kind"] in KINDS:
            await api.apply(KINDS[doc["kind"]], doc, field_manager="akri-trio-tests", force=True)
    path = KINDS["ServiceAccount"].path(namespace, account, "token")
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    answer = await api.request("POST", path, body=request)
    token: str = answer["status"]["token"]
    return token


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
