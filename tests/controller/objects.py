"""Configurations, Instances and Pods for the controller's tests, built as the API returns them."""

from __future__ import annotations

from typing import Any

from akri_trio.model.convert import structure
from akri_trio.model.resources import Configuration, Instance

CONFIG = "akri-debug-echo-foo"
INSTANCE = "akri-debug-echo-foo-8120fe"
DELETED_AT = "2024-01-01T00:00:00Z"


def configuration(
    broker: dict[str, Any] | None = None,
    generation: int = 3,
    status: dict[str, Any] | None = None,
    **spec_fields: Any,
) -> Configuration:
    spec: dict[str, Any] = {"discoveryHandler": {"name": "debugEcho"}, "capacity": 2, **spec_fields}
    if broker is not None:
        spec["brokerSpec"] = broker
    meta = {"name": CONFIG, "namespace": "ns", "uid": "c-uid", "generation": generation}
    return structure({"metadata": meta, "spec": spec, "status": status or {}}, Configuration)


def instance(
    name: str = INSTANCE,
    nodes: tuple[str, ...] = ("node-a",),
    shared: bool = True,
    deleting: bool = False,
    usage: dict[str, str] | None = None,
    finalizers: tuple[str, ...] = (),
) -> Instance:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"{name}-uid",
        "finalizers": list(finalizers),
    }
    if deleting:
        meta["deletionTimestamp"] = DELETED_AT
    spec = {
        "configurationName": CONFIG,
        "cdiName": f"akri.sh/{CONFIG}=8120fe",
        "capacity": 2,
        "shared": shared,
        "nodes": list(nodes),
        "deviceUsage": usage or {},
    }
    return structure({"metadata": meta, "spec": spec}, Instance)


def pod_json(
    name: str,
    phase: str,
    labels: dict[str, str],
    *,
    created: str = "2024-01-01T00:00:00Z",
    started: str | None = None,
    deleting: bool = False,
    uid: str = "p-uid",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid,
        "labels": labels,
        "creationTimestamp": created,
    }
    if deleting:
        meta["deletionTimestamp"] = DELETED_AT
    status: dict[str, Any] = {"phase": phase}
    if started:
        status["startTime"] = started
    return {"metadata": meta, "status": status}
