"""Resource descriptors -> URL paths: core vs named groups, scopes, subresources."""

from __future__ import annotations

import pytest

from akri_trio.kube.client import Resource

PODS = Resource.core("pods", "Pod")
NODES = Resource.core("nodes", "Node", namespaced=False)
CONFIGURATIONS = Resource("akri.sh", "v0", "configurations", "Configuration")
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)


@pytest.mark.parametrize(
    ("res", "args", "path"),
    [
        (PODS, ("ns", "p"), "/api/v1/namespaces/ns/pods/p"),
        (PODS, ("ns", None), "/api/v1/namespaces/ns/pods"),
        (PODS, (None, None), "/api/v1/pods"),  # all namespaces
        (PODS, ("ns", "p", "status"), "/api/v1/namespaces/ns/pods/p/status"),
        (NODES, (None, "n1", "status"), "/api/v1/nodes/n1/status"),
        (NODES, (None, None), "/api/v1/nodes"),
        (CONFIGURATIONS, ("akri", "c"), "/apis/akri.sh/v0/namespaces/akri/configurations/c"),
        (CONFIGURATIONS, (None, None), "/apis/akri.sh/v0/configurations"),
        (CRDS, (None, "x.y"), "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x.y"),
    ],
)
def test_paths(res: Resource, args: tuple[str | None, ...], path: str) -> None:
    assert res.path(*args) == path


def test_api_version() -> None:
    assert PODS.api_version == "v1"
    assert CONFIGURATIONS.api_version == "akri.sh/v0"


@pytest.mark.parametrize(
    ("res", "args"),
    [
        (NODES, ("ns", "n1")),  # cluster-scoped with a namespace
        (PODS, ("ns", "")),  # empty name
        (PODS, ("ns", None, "status")),  # subresource without a name
    ],
)
def test_bad_addresses(res: Resource, args: tuple[str | None, ...]) -> None:
    with pytest.raises(ValueError):
        res.path(*args)


def test_resources_are_hashable_values() -> None:
    assert Resource.core("pods", "Pod") == PODS
    assert len({PODS, Resource.core("pods", "Pod"), NODES}) == 2
