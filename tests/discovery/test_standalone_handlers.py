"""Every built-in handler served standalone (`akri-trio discovery-handler NAME`'s code path):
it registers over a real registration socket, the agent-side discovery opens a real Discover
stream to it, and discoveryDetails it rejects come back as InvalidArgument with the handler's
own message, which the agent turns into the Configuration's problem."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import trio
import yaml

from akri_trio.agent.discovery_streams import (
    DiscoveryRequest,
    DiscoveryResult,
    run_configuration_discovery,
)
from akri_trio.discovery.handlers import BUILTIN, load_handler
from akri_trio.discovery.registration import serve_registration
from akri_trio.discovery.registry import Registry
from akri_trio.discovery.standalone import run_standalone
from akri_trio.runtime import Backoff

# name -> (discoveryDetails it must refuse, the field its message names)
REFUSED = {
    "debugEcho": ({"descriptions": "one"}, "descriptions"),
    "udev": ({"udevRules": ['KERNEL="null"']}, "udevRules"),
    "onvif": ({"discoveryTimeoutSeconds": "soon"}, "discoveryTimeoutSeconds"),
    "opcua": ({"opcuaDiscoveryMethod": {"standard": {"discoveryUrls": [7]}}}, "discoveryUrls"),
    "zeroconf": ({"port": 80}, "kind"),
}


def test_every_builtin_handler_is_covered() -> None:
    assert set(REFUSED) == set(BUILTIN)


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_standalone_handler_rejects_bad_details_over_grpc(name: str, sock_dir: Path) -> None:
    details, field = REFUSED[name]
    registry = Registry(trio.current_time)
    fast = Backoff(base=0.02, cap=0.1)
    handler = load_handler(name, {})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_registration, registry, sock_dir / "agent-registration.sock")
            endpoint = await nursery.start(
                functools.partial(
                    run_standalone,
                    handler,
                    registration_socket=sock_dir / "agent-registration.sock",
                    socket_path=sock_dir / f"{name}.sock",
                    backoff=fast,
                    watch_interval=0.05,
                )
            )
            send, results = trio.open_memory_channel[DiscoveryResult](math.inf)
            request = DiscoveryRequest(f"default/{name}", name, yaml.safe_dump(details))
            nursery.start_soon(
                functools.partial(
                    run_configuration_discovery, registry, request, send.send, backoff=fast
                )
            )
            while True:
                result = await results.receive()
                if result.problems and "rejected" in result.problems[0]:
                    break
            (problem,) = result.problems
            assert problem.startswith(
                f"discovery handler {name!r} at {endpoint} rejected discoveryDetails: "
            )
            assert field in problem
            assert result.devices == ()
            nursery.cancel_scope.cancel()
    assert not (sock_dir / f"{name}.sock").exists()
