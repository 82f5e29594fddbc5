"""Fixtures for observe tests on the real control plane that touch only their own namespace.

The cluster is shared: these fixtures never list or delete anything outside a namespace made
for the test (`observe-<random>`), and the agent they run watches that namespace only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.kube import Client, NotFound, Resource
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.akri_cluster import ensure_namespace, install_crds, purge_namespace
from tests.support.kubelet_standin import KubeletStandin

NAMESPACES = Resource.core("namespaces", "Namespace", namespaced=False)


@attrs.define
class Space:
    """A namespace of the test's own, and the client that made it."""

    api: Client
    name: str
    kubeconfig: str


async def drop_namespace(api: Client, namespace: str) -> None:
    """Empty the namespace of akri objects, then delete it; never touches another namespace."""
    await purge_namespace(api, namespace, limit_s=30)
    with contextlib.suppress(NotFound):
        await api.delete(NAMESPACES, namespace)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path is too deep."""
    with tempfile.TemporaryDirectory(prefix="ob", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
async def space(api: Client, cluster: dict[str, str]) -> AsyncIterator[Space]:
    await install_crds(api)
    name = f"observe-{secrets.token_hex(3)}"
    await ensure_namespace(api, name)
    try:
        yield Space(api, name, cluster["KUBECONFIG"])
    finally:
        with trio.move_on_after(30, shield=True):
            await drop_namespace(api, name)


@attrs.define
class RunningAgent:
    agent: Agent
    kubelet: KubeletStandin
    availability: Path
    node: str


@pytest.fixture
async def agent(space: Space, short_tmp: Path) -> AsyncIterator[RunningAgent]:
    """An agent for a made-up node watching only `space`, with debugEcho and a kubelet stand-in;
    its Configurations' Instances are left (Configurations deleted) before it stops."""
    node = f"obs-node-{secrets.token_hex(2)}"
    kubelet = KubeletStandin(short_tmp / "device-plugins").start()
    availability = short_tmp / "availability"
    settings = AgentSettings(
        node=node,
        discovery_handlers_directory=short_tmp / "akri",
        device_plugin_dir=short_tmp / "device-plugins",
        pod_resources_socket=short_tmp / "pod-resources.sock",
        namespace=space.name,
        enable_debug_echo=True,
        debug_echo_shared=True,
        debug_echo_availability=availability,
        metrics_port=0,
        metrics_host="127.0.0.1",
    )
    try:
        async with trio.open_nursery() as nursery:
            started: Agent = await nursery.start(
                lambda **kw: run_agent(settings, api=space.api, **kw)
            )
            yield RunningAgent(started, kubelet, availability, node)
            with trio.move_on_after(20):
                for obj in (await space.api.list(CONFIGURATIONS, namespace=space.name)).items:
                    await space.api.delete(
                        CONFIGURATIONS, obj["metadata"]["name"], namespace=space.name
                    )
                while (await space.api.list(INSTANCES, namespace=space.name)).items:  # noqa: ASYNC110  (polling the API server)
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    finally:
        kubelet.stop()


PODS = Resource.core("pods", "Pod")


async def first_instance(space: Space) -> Any:
    """The one Instance in the test's namespace, or None while there is not exactly one."""
    items = (await space.api.list(INSTANCES, namespace=space.name)).items
    return items[0] if len(items) == 1 else None


async def admit_user_pod(space: Space, node: str, resource: str, name: str = "user") -> None:
    """The Pod the kubelet would have admitted: bound to `node`, asking for one `resource`
    (akri.sh/<instance>); nothing runs it, which is all the pictures need."""
    container = {
        "name": "c",
        "image": "registry.k8s.io/pause:3.10.2",
        "resources": {"limits": {resource: "1"}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": space.name},
        "spec": {"nodeName": node, "containers": [container]},
    }
    await space.api.create(PODS, pod, namespace=space.name)


def run_cli(space: Space, *argv: str) -> str:
    """Run a command line against the test's cluster; its stdout (it must succeed)."""
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": space.kubeconfig},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
