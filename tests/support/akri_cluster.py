"""Test helpers over the real cluster: install the CRDs, create and purge akri objects."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from akri_trio.kube.client import Client, Resource
from akri_trio.kube.errors import NotFound
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.polling import until_api

REPO = Path(__file__).resolve().parent.parent.parent
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)
NAMESPACES = Resource.core("namespaces", "Namespace", namespaced=False)


async def install_crds(api: Client) -> None:
    for path in sorted((REPO / "k8s" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        await api.apply(CRDS, crd, field_manager="akri-trio-tests", force=True)
    for name in ("configurations.akri.sh", "instances.akri.sh"):
        await until_api(partial(established, api, name), 30, f"CRD {name} Established")


async def established(api: Client, crd: str) -> bool:
    conditions = ((await api.get(CRDS, crd)).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


async def ensure_namespace(api: Client, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await api.apply(NAMESPACES, body, field_manager="akri-trio-tests")


async def purge_akri(api: Client, namespace: str | None = None, limit_s: float = 30) -> None:
    """Delete every Configuration and Instance (of `namespace`; None: all), stripping
    finalizers of agents that are gone, and wait (at most `limit_s`) until they are gone."""
    for res in (CONFIGURATIONS, INSTANCES):
        listed = await api.list(res, namespace=namespace)
        for obj in listed.items:
            meta = obj["metadata"]
            try:
                if meta.get("finalizers"):
                    await api.merge_patch(
                        res,
                        meta["name"],
                        {"metadata": {"finalizers": None}},
                        namespace=meta["namespace"],
                    )
                await api.delete(res, meta["name"], namespace=meta["namespace"])
            except NotFound:
                pass
    await until_api(
        lambda: akri_gone(api, namespace), limit_s, f"akri objects of {namespace or 'all'} gone"
    )


async def purge_namespace(api: Client, namespace: str, limit_s: float = 120) -> None:
    """Delete our Configurations, then our Instances (stripping finalizers of dead agents)."""
    await purge_akri(api, namespace, limit_s)


async def akri_gone(api: Client, namespace: str | None) -> bool:
    """No Instance and no Configuration (of `namespace`; None: all) left."""
    for res in (INSTANCES, CONFIGURATIONS):
        if (await api.list(res, namespace=namespace)).items:
            return False
    return True


def debug_echo_config(
    name: str,
    namespace: str,
    descriptions: list[str],
    *,
    capacity: int = 2,
    broker_properties: Mapping[str, str] | None = None,
    details: str | None = None,
) -> dict[str, Any]:
    text = details if details is not None else yaml.safe_dump({"descriptions": descriptions})
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": text},
            "capacity": capacity,
            "brokerProperties": dict(broker_properties or {}),
        },
    }
