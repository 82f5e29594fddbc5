"""A tenant's udev Configuration that matches this node's root disk, against a real agent (the
embedded udev handler on the real /sys) and the real API server: no Instance, the reason in the
Configuration's status (DevicesAccepted=False) and a DevicesRefused Event; with the namespace
allowed the `block` class, the same rule yields the disk."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from akri_trio.agent.configurations import ConfigurationLimits
from akri_trio.agent.run import AgentSettings, run_agent
from akri_trio.discovery.device_rules import DeviceRules
from akri_trio.discovery.interface import AnyHandler
from akri_trio.kube import Resource
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.discovery.test_host_critical import root_disk
from tests.observe.conftest import Space, short_tmp, space
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s
__all__ = ["short_tmp", "space"]  # the fixtures this module uses
EVENTS = Resource.core("events", "Event")


@attrs.frozen
class Running:
    node: str


@asynccontextmanager
async def run(
    space: Space,
    tmp: Path,
    allow: dict[str, frozenset[str]],
    handlers: tuple[AnyHandler, ...] = (),
) -> AsyncIterator[Running]:
    """An agent for a made-up node watching only `space`, with a kubelet stand-in: the
    embedded udev handler, or `handlers` when given."""
    node = f"host-critical-{secrets.token_hex(2)}"
    kubelet = KubeletStandin(tmp / "device-plugins").start()
    settings = AgentSettings(
        node=node,
        discovery_handlers_directory=tmp / "akri",
        device_plugin_dir=tmp / "device-plugins",
        pod_resources_socket=tmp / "pod-resources.sock",
        namespace=space.name,
        embedded_handlers=() if handlers else ("udev",),
        handlers=handlers,
        metrics_port=None,
        limits=ConfigurationLimits(devices=DeviceRules(host_allowances=allow)),
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda **kw: run_agent(settings, api=space.api, **kw))
            yield Running(node)
            nursery.cancel_scope.cancel()
    finally:
        kubelet.stop()


def udev_config(name: str, namespace: str, rule: str) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "discoveryHandler": {"name": "udev", "discoveryDetails": f"udevRules: ['{rule}']\n"},
            "capacity": 1,
        },
    }


async def devices_accepted(
    space: Space, name: str, node: str, kind: str = "DevicesAccepted"
) -> tuple[str, str] | None:
    """(status, message) of `node`'s condition `kind` in Configuration `name`'s status."""
    obj = await space.api.get(CONFIGURATIONS, name, namespace=space.name)
    for entry in (obj.get("status") or {}).get("nodes") or []:
        for c in entry.get("conditions") or [] if entry["node"] == node else []:
            if c["type"] == kind:
                return c["status"], c["message"]
    return None


async def test_the_root_disk_is_dropped_with_a_reason_unless_allowed(
    space: Space, short_tmp: Path
) -> None:
    disk = root_disk()
    rule = f'SUBSYSTEM=="block", KERNEL=="{disk.removeprefix("/dev/")}"'
    name = f"rootdisk-{secrets.token_hex(2)}"
    async with run(space, short_tmp / "a", {}) as agent:
        await space.api.create(CONFIGURATIONS, udev_config(name, space.name, rule))

        async def refused() -> tuple[str, str] | None:
            found = await devices_accepted(space, name, agent.node)
            return found if found and found[0] == "False" else None

        _, message = await until_api(refused, 60)
        assert f"host path {disk!r} is a host-critical device" in message
        assert "mounted at /" in message and "--allow-host-devices NAMESPACE:block" in message

        async def event() -> list[Any]:
            items = (await space.api.list(EVENTS, namespace=space.name)).items
            return [e for e in items if e["reason"] == "DevicesRefused"]

        (refusal,) = await until_api(event, 60)
        assert refusal["involvedObject"]["name"] == name and disk in refusal["message"]
        assert (await space.api.list(INSTANCES, namespace=space.name)).items == []

    # The same rule in a namespace the admin allowed the `block` class: the disk is served.
    async with run(space, short_tmp / "b", {space.name: frozenset({"block"})}) as agent:

        async def instance() -> list[Any]:
            items = (await space.api.list(INSTANCES, namespace=space.name)).items
            return [i for i in items if agent.node in i["spec"].get("nodes", [])]

        (inst,) = await until_api(instance, 60)
        assert inst["spec"]["brokerProperties"]["UDEV_DEVNODE"] == disk
        await space.api.delete(CONFIGURATIONS, name, namespace=space.name)
