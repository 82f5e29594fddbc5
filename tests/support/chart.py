"""The Helm chart through Helm's own engine (helm-python-sdk binds Helm v4's Go SDK; no helm
binary): render it to objects, index them, walk their Pod templates."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "k8s" / "helm" / "akri-trio"

Obj = dict[str, Any]


def render(
    values: Mapping[str, Any] | None = None, *, namespace: str = "akri", release: str = "akri"
) -> list[Obj]:
    """Every object the chart makes for `values`, hooks included, CRDs not (Helm installs
    those from crds/ apart from the templates)."""
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(
            dict(values or {}), name=release, namespace=namespace, is_install=True
        )
    objects: list[Obj] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def crds() -> list[Obj]:
    with helm_python.Chart.load(CHART) as chart:
        return [yaml.safe_load(c["data"]) for c in chart.crds]


def by_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def one(objects: list[Obj], kind: str, name: str) -> Obj:
    found = by_kind(objects, kind)
    assert name in found, f"no {kind} {name}; have {sorted(found)}"
    return found[name]


def pod_spec(obj: Obj) -> Obj:
    """The Pod template's spec of a DaemonSet, Deployment or Job."""
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


def workloads(objects: list[Obj]) -> Iterator[Obj]:
    return (o for o in objects if o["kind"] in ("DaemonSet", "Deployment", "Job"))


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}
