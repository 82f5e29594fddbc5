"""The node's Instance writes go first: while a batch of them is in flight the plugin manager
starts no plugin (their sockets and registrations halved the pace of a 200-device discovery on
two cores), it starts them once the batch ends, and a batch that hangs holds them back no
longer than START_HOLD_S. Real sockets in a temporary device-plugin directory; no kubelet
is there, so the plugins only serve and retry their registration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins import manager as manager_module
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.plugins.kubelet import KubeletWatch
from akri_trio.agent.plugins.manager import InstancePlugin, PluginManager
from akri_trio.agent.view import NodeView
from akri_trio.kube.client import Client
from akri_trio.model.device import Device

NODE = "n"
CONFIG = ObjectKey("ns", "c")


def _instance(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1"},
        "spec": {
            "configurationName": "c",
            "cdiName": f"akri.sh/c={name}",
            "capacity": 1,
            "nodes": [NODE],
        },
    }


def _written(view: NodeView, *names: str) -> None:
    """As a batch's answers land: the Instances in the view, with this node's devices."""
    view.set_devices(CONFIG, {ObjectKey("ns", n): Device(n) for n in names})
    for name in names:
        view.put_instance(_instance(name), since=view.position)


def _serving(manager: PluginManager, name: str) -> bool:
    return InstancePlugin(ObjectKey("ns", name), "c") in manager.running


async def _until_serving(view: NodeView, manager: PluginManager, *names: str) -> None:
    """Until the manager runs the plugins of `names` (it touches their Configuration's key
    after each pass that starts plugins)."""
    changes = view.changes_of(CONFIG)
    seen = changes.version
    while not all(_serving(manager, n) for n in names):
        seen = await changes.wait_past(seen)


async def test_writes_settled_waits_for_the_last_batch() -> None:
    view = NodeView(NODE)
    await view.writes_settled()  # none in flight: at once
    done = trio.Event()

    async def settle() -> None:
        await view.writes_settled()
        done.set()

    async with trio.open_nursery() as nursery:
        with view.writing():
            with view.writing():
                nursery.start_soon(settle)
                await trio.testing.wait_all_tasks_blocked()
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set() and view.batches_writing == 1
        await done.wait()
    assert view.batches_writing == 0


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url="https://127.0.0.1:1") as client:
        yield client  # never used: nothing here makes an Allocate


async def _run_manager(
    view: NodeView, plugin_dir: Path, http: httpx.AsyncClient, nursery: trio.Nursery
) -> PluginManager:
    manager = PluginManager(view, Claims(Client(http), view), KubeletWatch(plugin_dir))
    await nursery.start(manager.run)
    return manager


async def test_plugins_start_once_the_batch_of_writes_ends(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    view = NodeView(NODE)
    async with trio.open_nursery() as nursery:
        manager = await _run_manager(view, tmp_path, http, nursery)
        with view.writing():
            _written(view, "i1", "i2")
            await trio.testing.wait_all_tasks_blocked()
            assert not manager.running
        with trio.fail_after(30):
            await _until_serving(view, manager, "i1", "i2")
        nursery.cancel_scope.cancel()


async def test_a_hanging_batch_holds_plugins_back_only_so_long(
    tmp_path: Path, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "START_HOLD_S", 0.05)
    view = NodeView(NODE)
    async with trio.open_nursery() as nursery:
        manager = await _run_manager(view, tmp_path, http, nursery)
        with view.writing():
            _written(view, "i1")
            with trio.fail_after(30):
                await _until_serving(view, manager, "i1")
            assert view.batches_writing == 1
        nursery.cancel_scope.cancel()


async def test_without_writes_in_flight_a_plugin_starts_at_once(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    view = NodeView(NODE)
    async with trio.open_nursery() as nursery:
        manager = await _run_manager(view, tmp_path, http, nursery)
        _written(view, "i1")
        await trio.testing.wait_all_tasks_blocked()
        assert _serving(manager, "i1")
        nursery.cancel_scope.cancel()
