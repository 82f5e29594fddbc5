"""`akri-trio teardown` (the chart's pre-delete hook) against the real API server: it deletes the
Configurations of the namespaces it is given, waits while an Instance still holds a finalizer
(an agent releasing it), returns once nothing is left, and leaves other namespaces alone."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trio

from akri_trio.kube import Client
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.teardown import remaining, teardown
from tests.support.akri_cluster import (
    NAMESPACES,
    ensure_namespace,
    install_crds,
    purge_akri,
)
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s

FINALIZER = "akri.sh/teardown-test"


def _configuration(name: str, namespace: str) -> dict[str, Any]:
    """A Configuration for a handler no agent has: agents of other test sessions watching every
    namespace leave it and its Instances alone."""
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"discoveryHandler": {"name": "teardown-test"}, "capacity": 1},
    }


@pytest.fixture
async def crds(api: Client) -> None:
    await install_crds(api)


def _instance(name: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "finalizers": [FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": "akri.sh/v0",
                    "kind": "Configuration",
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"configurationName": owner["metadata"]["name"], "cdiName": "x", "capacity": 1},
    }


async def configurations_gone(api: Client, ns: str) -> bool:
    return (await remaining(api, [ns]))[0] == 0


async def test_teardown_deletes_waits_for_finalizers_and_keeps_other_namespaces(
    api: Client, crds: None
) -> None:
    suffix = uuid.uuid4().hex[:6]
    ns, other = f"teardown-{suffix}", f"teardown-other-{suffix}"
    for name in (ns, other):
        await ensure_namespace(api, name)
    try:
        a = await api.create(CONFIGURATIONS, _configuration("a", ns), namespace=ns)
        await api.create(CONFIGURATIONS, _configuration("b", ns), namespace=ns)
        kept = await api.create(CONFIGURATIONS, _configuration("c", other), namespace=other)
        await api.create(INSTANCES, _instance("a-1", ns, a), namespace=ns)
        await api.create(INSTANCES, _instance("c-1", other, kept), namespace=other)

        done = trio.Event()

        async def run() -> None:
            await teardown(api, [ns])
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            with trio.fail_after(20):
                # the Configurations go at once; the Instance waits for its finalizer
                await until_api(
                    lambda: configurations_gone(api, ns), 20, "the Configurations deleted"
                )
                await trio.sleep(1.5)
                assert not done.is_set()
                assert await remaining(api, [ns]) == (0, 1)
                # the "agent" lets go: teardown returns
                await api.merge_patch(
                    INSTANCES, "a-1", {"metadata": {"finalizers": None}}, namespace=ns
                )
                await done.wait()
        assert await remaining(api, [ns]) == (0, 0)
        assert await remaining(api, [other]) == (1, 1)
    finally:
        for name in (ns, other):
            await purge_akri(api, name)
            await api.delete(NAMESPACES, name)
