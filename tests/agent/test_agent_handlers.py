"""The real discovery handlers embedded in the agent (issue: discovery handlers, "Also").

Each built-in handler is loaded by name exactly as `akri-trio agent --embedded-handler NAME`
does; a Configuration with bad discoveryDetails for it shows the handler's own message in the
Configuration's status, and udev, pointed at this machine's real /sys, turns /dev/null into an
Instance with its device node in the Allocate response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.kube.client import Client
from akri_trio.model.naming import device_hash
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.akri_cluster import ensure_namespace
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api

NS = "handler-tests"
NODE = "handlers-node"
HANDLERS = ("udev", "onvif", "opcua", "zeroconf")


@pytest.fixture
async def agent(akri: Client, short_tmp: Path) -> AsyncIterator[tuple[Agent, KubeletStandin]]:
    await ensure_namespace(akri, NS)
    kubelet = KubeletStandin(short_tmp / "dp").start()
    settings = AgentSettings(
        node=NODE,
        namespace=NS,
        discovery_handlers_directory=short_tmp / "akri",
        device_plugin_dir=short_tmp / "dp",
        pod_resources_socket=short_tmp / "pr.sock",
        embedded_handlers=HANDLERS,
        metrics_port=None,
    )
    try:
        async with trio.open_nursery() as nursery:
            running: Agent = await nursery.start(lambda **kw: run_agent(settings, api=akri, **kw))
            yield running, kubelet
            nursery.cancel_scope.cancel()
    finally:
        kubelet.stop()


def _config(name: str, handler: str, details: Any) -> dict[str, Any]:
    text = details if isinstance(details, str) else yaml.safe_dump(details)
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"discoveryHandler": {"name": handler, "discoveryDetails": text}, "capacity": 1},
    }


BAD = {
    "udev": ({"udevRules": ['KERNEL="null"']}, "udevRules"),  # an assignment, not a match
    "onvif": ({"discoveryTimeoutSeconds": "soon"}, "discoveryTimeoutSeconds"),
    "opcua": ({"opcuaDiscoveryMethod": {"standard": {"discoveryUrls": [7]}}}, "discoveryUrls"),
    "zeroconf": ({"port": 80}, "kind"),  # the service type is required
}


async def test_bad_details_of_every_handler_show_in_the_status(
    akri: Client, agent: tuple[Agent, KubeletStandin]
) -> None:
    for handler, (details, _) in BAD.items():
        await akri.create(CONFIGURATIONS, _config(f"bad-{handler}", handler, details))

    async def invalid(name: str) -> dict[str, Any] | None:
        """The conditions, once DiscoveryDetailsValid is False."""
        obj = await akri.get(CONFIGURATIONS, name, namespace=NS)
        entries = (obj.get("status") or {}).get("nodes") or []
        conditions = {c["type"]: c for c in (entries[0] if entries else {}).get("conditions") or []}
        valid = conditions.get("DiscoveryDetailsValid")
        return conditions if valid and valid["status"] == "False" else None

    for handler, (_, field) in BAD.items():
        name = f"bad-{handler}"
        conditions = await until_api(partial(invalid, name), 30, f"{name} invalid", poll=0.2)
        valid = conditions["DiscoveryDetailsValid"]
        assert field in valid["message"], (handler, valid["message"])
        assert conditions["HandlerAvailable"]["status"] == "True"


async def test_embedded_udev_finds_dev_null(
    akri: Client, agent: tuple[Agent, KubeletStandin]
) -> None:
    _, kubelet = agent
    details = {"udevRules": ['KERNEL=="null", SUBSYSTEM=="mem"'], "permissions": "rw"}
    await akri.create(CONFIGURATIONS, _config("null-dev", "udev", details))
    name = "null-dev-" + device_hash("/devices/virtual/mem/null", NODE)
    resource = f"akri.sh/{name}"
    await trio.to_thread.run_sync(kubelet.wait_for, lambda k: k.healthy(resource) == [f"{name}-0"])
    inst = await akri.get(INSTANCES, name, namespace=NS)
    assert inst["spec"]["shared"] is False  # udev devices are local to their node
    assert inst["spec"]["brokerProperties"]["UDEV_DEVNODE"] == "/dev/null"
    response = await trio.to_thread.run_sync(kubelet.allocate, resource, [[f"{name}-0"]])
    (node,) = response.container_responses[0].devices
    assert (node.container_path, node.host_path, node.permissions) == (
        "/dev/null",
        "/dev/null",
        "rw",
    )
