"""One agent at a time serves DRA on a node: a second one waits for the first one's lock (and
gets it once the first lets go), instead of taking the kubelet sockets and the checkpoint over,
and is not ready meanwhile; an agent is ready once the kubelet has registered its plugin, and
not after the kubelet refused it."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio
import trio.testing

from akri_trio.agent.dra.node import LOCK_FILE, LOCK_POLL_S, DraNode, node_lock
from akri_trio.agent.dra.plugin import Registration
from akri_trio.agent.view import NodeView, instance_store
from akri_trio.kube import Client
from akri_trio.rpc.gen import pluginregistration_v1_pb2 as reg


async def test_a_second_holder_waits_until_the_first_lets_go(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    path = tmp_path / "plugins" / "akri.sh" / "agent.lock"
    second_has_it = trio.Event()

    async def second() -> None:
        async with node_lock(path):
            second_has_it.set()

    async with trio.open_nursery() as nursery:
        async with node_lock(path):
            nursery.start_soon(second)
            await trio.sleep(60)
            assert not second_has_it.is_set()
        released = trio.current_time()
        await second_has_it.wait()
        assert trio.current_time() - released <= LOCK_POLL_S


async def test_an_agent_waiting_on_the_lock_is_not_ready_until_the_kubelet_registers_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:  # never called
        node = DraNode(
            Client(http),
            NodeView("n1"),
            instance_store(),
            namespace=None,
            kubelet_root_dir=tmp_path,
            cdi_dir=tmp_path / "cdi",
            consumable=True,
        )
        lock = tmp_path / "plugins" / "akri.sh" / LOCK_FILE
        async with node_lock(lock), trio.open_nursery() as nursery:
            nursery.start_soon(node.run)
            await trio.sleep(60)
            assert node.pools is None  # still waiting on the lock
            assert not node.ready()
            nursery.cancel_scope.cancel()
    registration = Registration(tmp_path / "dra.sock", node._on_status)
    await registration.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
    assert node.ready()
    refused = reg.RegistrationStatus(plugin_registered=False, error="no")
    await registration.NotifyRegistrationStatus(refused)
    assert not node.ready()
