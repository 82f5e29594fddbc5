"""Instances as the API server returns them, for the DRA core's tests."""

from __future__ import annotations

from akri_trio.model.convert import structure
from akri_trio.model.resources import Instance


def instance(
    name: str = "cam-abc123",
    *,
    namespace: str = "ns",
    configuration: str = "cam",
    capacity: int = 2,
    properties: dict[str, str] | None = None,
    shared: bool = False,
    nodes: tuple[str, ...] = ("n1",),
) -> Instance:
    digest = name.rpartition("-")[2]
    return structure(
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "configurationName": configuration,
                "cdiName": f"akri.sh/{configuration}={digest}",
                "capacity": capacity,
                "brokerProperties": properties or {},
                "shared": shared,
                "nodes": list(nodes),
            },
        },
        Instance,
    )
