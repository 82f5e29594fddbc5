"""No flood freezes the agent (issue 21 item 4): an agent running against the real control
plane, a kubelet stand-in (grpcio) calling its device plugin's Allocate, and an attacker in a
process of its own flooding it at ten times a documented cap. Throughout, the agent's own
measure of its event-loop lag (akri_trio.observe.lag) stays under 250 ms and every Allocate is
answered.

- junk connections: 640 at once (ten times a gRPC server's connection cap, 64) to the
  registration socket, each sending bytes that are not gRPC and reopened as soon as closed;
- device lists: a registered handler answering with 20,480 devices (ten times the default
  --max-devices-per-handler, 2048) again and again. The agent here keeps 16 of them (its caps
  lowered, so the test makes 16 Instances rather than 2048): what is under test is the cost of
  reading and checking each list, which the cap does not change.
"""

from __future__ import annotations

import functools
import gc
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from akri_trio.agent.configurations import ConfigurationLimits
from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.discovery.device_rules import DeviceRules
from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.discovery.standalone import REGISTRATION_SOCKET
from akri_trio.kube.client import Client
from akri_trio.model.limits import MAX_DEVICES_PER_HANDLER
from akri_trio.model.resources import CONFIGURATIONS
from akri_trio.rpc.uds import MAX_CONNECTIONS
from tests.support.akri_cluster import (
    debug_echo_config,
    ensure_namespace,
    install_crds,
    purge_akri,
)
from tests.support.flood import LoopWatch, kubelet_allocating
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s

TAG = secrets.token_hex(3)
NS = f"floods-{TAG}"
NODE = f"flood-node-{TAG}"
ECHO = f"floodEcho{TAG}"
FLOOD = f"floodList{TAG}"
LABEL = {"flood-test": TAG}
KEPT = 16
FLOOD_S = 6.0
REPO = Path(__file__).resolve().parents[2]


def configuration(name: str, handler: str, descriptions: list[str]) -> dict[str, Any]:
    """debugEcho's Configuration, for `handler` and with this module's label."""
    body = debug_echo_config(name, NS, descriptions)
    body["metadata"]["labels"] = LABEL
    body["spec"]["discoveryHandler"]["name"] = handler
    return body


def instance_plugin(kubelet: KubeletStandin, config: str) -> str | None:
    """The instance-level plugin of the Configuration `config`, once both its slots are up."""
    for resource in kubelet.registrations:
        if resource.startswith(f"akri.sh/{config}-") and len(kubelet.healthy(resource)) == 2:
            return resource
    return None


class Served:
    def __init__(self, agent: Agent, kubelet: KubeletStandin, resource: str, root: Path) -> None:
        self.agent = agent
        self.kubelet = kubelet
        self.resource = resource  # the plugin of the one Instance it allocates
        self.root = root

    def allocate(self) -> None:
        """One Allocate call, from the kubelet's thread: answered with the device's env."""
        slot = f"{self.resource.removeprefix('akri.sh/')}-0"
        response = self.kubelet.allocate(self.resource, [[slot]])
        assert dict(response.container_responses[0].envs)["DEBUG_ECHO_DESCRIPTION"] == "c0"


@pytest.fixture
async def served(api: Client, short_tmp: Path) -> AsyncIterator[Served]:
    await install_crds(api)
    await ensure_namespace(api, NS)
    kubelet = KubeletStandin(short_tmp / "device-plugins").start()
    settings = AgentSettings(
        node=NODE,
        discovery_handlers_directory=short_tmp / "akri",
        device_plugin_dir=short_tmp / "device-plugins",
        pod_resources_socket=short_tmp / "pod-resources.sock",
        handlers=(DebugEcho(name=ECHO, availability_path=short_tmp / "availability"),),
        metrics_port=None,
        configuration_selector=f"flood-test={TAG}",
        limits=ConfigurationLimits(
            devices=DeviceRules(max_devices=KEPT, max_configuration_devices=KEPT)
        ),
    )
    gc.freeze()  # as `akri-trio agent` does before it starts
    try:
        async with trio.open_nursery() as nursery:
            agent: Agent = await nursery.start(functools.partial(run_agent, settings, api=api))
            # A name of its own per test: the last test's Instance may still be going away.
            config = f"cam{secrets.token_hex(3)}"
            await api.create(CONFIGURATIONS, configuration(config, ECHO, ["c0"]))
            await trio.to_thread.run_sync(
                kubelet.wait_for, lambda k: instance_plugin(k, config) is not None, 60.0
            )
            resource = instance_plugin(kubelet, config)
            assert resource is not None
            yield Served(agent, kubelet, resource, short_tmp)
            nursery.cancel_scope.cancel()
    finally:
        kubelet.stop()
        await purge_akri(api, NS)


async def flood_and_allocate(
    served: Served, attacker: list[str], reached: Callable[[], Awaitable[bool]] | None = None
) -> None:
    """Start `attacker`; once it says it is flooding (and `reached` says the agent shows it),
    Allocate for FLOOD_S while it goes on, and check the agent's own lag over that time
    (tests/support/flood.py)."""
    assert served.agent.lag is not None
    watch = LoopWatch(served.agent.lag)
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-m", "tests.support.flooder", *attacker],
                cwd=REPO,
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        try:
            assert process.stdout is not None
            with trio.fail_after(60):
                said = b""
                while b"flooding" not in said:
                    chunk = await process.stdout.receive_some()
                    assert chunk, "the attacker exited before flooding"
                    said += chunk
            if reached is not None:
                await until_api(reached, 60, "the flood showing in the agent")
            async with kubelet_allocating(watch, served.allocate, sample=False):
                await trio.sleep(FLOOD_S)
        finally:
            process.terminate()
    watch.assert_held_up()
    assert len(watch.codes) >= 3, f"only {len(watch.codes)} Allocate calls answered"


async def test_junk_connections_to_the_registration_socket(served: Served) -> None:
    socket = served.root / "akri" / REGISTRATION_SOCKET
    await flood_and_allocate(served, ["junk", str(socket), str(10 * MAX_CONNECTIONS)])


async def test_a_handler_sending_ten_times_the_device_cap(api: Client, served: Served) -> None:
    count = 10 * MAX_DEVICES_PER_HANDLER
    await api.create(CONFIGURATIONS, configuration("flood", FLOOD, []))

    async def cut_reported() -> bool:
        obj = await api.get(CONFIGURATIONS, "flood", namespace=NS)
        entries = (obj.get("status") or {}).get("nodes") or []
        return any(
            f"{count} devices sent; only the first {KEPT} by id are used" in c.get("message", "")
            for e in entries
            if e["node"] == NODE
            for c in e.get("conditions") or []
        )

    # Each list is read, checked and cut to the cap, with the reason in the status.
    attacker = ["list", str(served.root / "akri"), FLOOD, str(count)]
    await flood_and_allocate(served, attacker, cut_reported)
