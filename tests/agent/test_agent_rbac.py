"""k8s/agent.yaml's ClusterRole is exactly enough: the agent runs with a ServiceAccount bound
to it and nothing more, discovers, writes Instances and status, claims slots, and reads a
discoveryProperty from a Secret."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from akri_trio.agent.run import AgentSettings, run_agent
from akri_trio.kube.client import Client, Resource
from akri_trio.kube.errors import NotFound
from akri_trio.model.naming import device_hash
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.akri_cluster import (
    debug_echo_config,
    ensure_namespace,
)
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api
from tests.support.rbac import manifest_client

MANIFEST = Path(__file__).parents[2] / "k8s" / "agent.yaml"
NS = "rbac-tests"
SECRETS = Resource.core("secrets", "Secret")


async def gone(api: Client, name: str) -> bool:
    try:
        await api.get(INSTANCES, name, namespace=NS)
    except NotFound:
        return True
    return False


@pytest.fixture
async def agent_api(akri: Client, cluster: dict[str, str]) -> AsyncIterator[Client]:
    """A client that authenticates as the agent's ServiceAccount."""
    async with manifest_client(akri, cluster, MANIFEST, "akri", "akri-agent-sa") as client:
        yield client


async def test_agent_works_with_exactly_the_manifest_rbac(akri: Client, agent_api: Client) -> None:
    await ensure_namespace(akri, NS)
    await akri.apply(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "cred", "namespace": NS},
            "data": {"pw": base64.b64encode(b"s3cret").decode()},
        },
        field_manager="akri-trio-tests",
    )
    config: dict[str, Any] = debug_echo_config("rbac", NS, ["x0"], capacity=1)
    config["spec"]["discoveryHandler"]["discoveryProperties"] = [
        {
            "name": "password",
            "valueFrom": {"secretKeyRef": {"name": "cred", "namespace": NS, "key": "pw"}},
        }
    ]
    with tempfile.TemporaryDirectory(prefix="ak", dir="/tmp") as d:
        root = Path(d)
        kubelet = KubeletStandin(root / "dp").start()
        settings = AgentSettings(
            node="rbac-node",
            discovery_handlers_directory=root / "akri",
            device_plugin_dir=root / "dp",
            pod_resources_socket=root / "pr.sock",
            enable_debug_echo=True,
            debug_echo_availability=root / "avail",
            metrics_port=None,
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(lambda **kw: run_agent(settings, api=agent_api, **kw))
                await akri.create(CONFIGURATIONS, config)
                name = "rbac-" + device_hash("x0", "rbac-node")
                resource = f"akri.sh/{name}"
                await trio.to_thread.run_sync(
                    kubelet.wait_for, lambda k: k.healthy(resource) == [f"{name}-0"], 20.0
                )
                await trio.to_thread.run_sync(kubelet.allocate, resource, [[f"{name}-0"]])
                inst = await akri.get(INSTANCES, name, namespace=NS)
                assert inst["spec"]["deviceUsage"] == {f"{name}-0": "rbac-node"}
                status = (await akri.get(CONFIGURATIONS, "rbac", namespace=NS))["status"]
                conditions = {c["type"]: c["status"] for c in status["nodes"][0]["conditions"]}
                assert conditions["PropertiesResolved"] == "True"
                await akri.delete(CONFIGURATIONS, "rbac", namespace=NS)
                # the agent releases its finalizer: the Instance goes
                await until_api(partial(gone, akri, name), 20, f"Instance {name} gone", poll=0.2)
                nursery.cancel_scope.cancel()
        finally:
            kubelet.stop()
