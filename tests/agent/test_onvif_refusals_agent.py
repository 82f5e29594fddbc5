"""An ONVIF camera that refuses the configured credentials, against a real agent (the ONVIF
handler embedded, querying a real loopback camera over HTTP) and the real API server: no
Instance, the count of refusing cameras in the Configuration's status (DiscoveryHealthy=False)
and a DiscoveryProblems Event; once the camera takes the credentials, the condition is True
again and the camera is an Instance. Only the WS-Discovery round is replaced by a fixed match
(the probe has tests of its own, tests/discovery/test_onvif_netns.py among them)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import trio

from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.agent.test_host_critical_agent import EVENTS, devices_accepted, run
from tests.discovery.test_onvif_device import OnvifDeviceService, Probed, _match
from tests.observe.conftest import Space, short_tmp, space
from tests.support.akri_cluster import debug_echo_config
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s
__all__ = ["short_tmp", "space"]  # the fixtures this module uses
UUID = "5f5a69c2-e0ae-504f-829b-00fcdab169cc"


def onvif_config(name: str, namespace: str) -> dict[str, Any]:
    config = debug_echo_config(name, namespace, [], capacity=1)
    config["spec"]["discoveryHandler"] = {
        "name": "onvif",
        "discoveryProperties": [
            {"name": "username_default", "value": "admin"},
            {"name": "password_default", "value": "wrong"},
        ],
    }
    return config


async def test_refusing_cameras_are_counted_in_the_configuration_status(
    space: Space, short_tmp: Path
) -> None:
    camera = OnvifDeviceService(credential=("admin", "right"))
    name = f"cams-{secrets.token_hex(2)}"
    async with camera.serving() as url:
        handler = Probed(poll_interval=0.2, matches=(_match(url, UUID),))
        async with run(space, short_tmp, {}, handlers=(handler,)) as agent:
            await space.api.create(CONFIGURATIONS, onvif_config(name, space.name))

            async def healthy(status: str) -> tuple[str, str] | None:
                found = await devices_accepted(space, name, agent.node, "DiscoveryHealthy")
                return found if found and found[0] == status else None

            with trio.fail_after(60):
                _, message = await until_api(lambda: healthy("False"))
            assert message.startswith(
                f"embedded-onvif: 1 camera(s) refused the configured credentials: {UUID} "
                f"({url} rejected user 'admin'"
            )
            assert (await space.api.list(INSTANCES, namespace=space.name)).items == []

            async def event() -> list[Any]:
                items = (await space.api.list(EVENTS, namespace=space.name)).items
                return [e for e in items if e["reason"] == "DiscoveryProblems"]

            with trio.fail_after(60):
                (problem,) = await until_api(event)
            assert problem["involvedObject"]["name"] == name
            assert "1 camera(s) refused the configured credentials" in problem["message"]

            camera.credential = ("admin", "wrong")  # the camera now takes what is configured

            async def instance() -> list[Any]:
                return (await space.api.list(INSTANCES, namespace=space.name)).items

            with trio.fail_after(60):
                assert await until_api(lambda: healthy("True")) == ("True", "")
                (inst,) = await until_api(instance)
            assert inst["spec"]["brokerProperties"]["ONVIF_DEVICE_UUID"] == UUID
            await space.api.delete(CONFIGURATIONS, name, namespace=space.name)
