"""The node's Instance writes go first: while a batch of them is in flight the plugin manager
starts no plugin (their sockets and registrations halved the pace of a 200-device discovery on
two cores), it starts them once the batch ends, a batch that hangs holds them back no longer
than START_HOLD_S, and a plugin to stop never waits for the batch. Real sockets in a temporary
device-plugin directory; no kubelet is there, so the plugins only serve and retry their
registration."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
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


async def _until(view: NodeView, done: Callable[[], bool]) -> None:
    """Until `done()` holds, looked at after each pass of the manager that starts or stops a
    plugin (it touches their Configuration's key then)."""
    changes = view.changes_of(CONFIG)
    seen = changes.version
    while not done():
        seen = await changes.wait_past(seen)


async def _until_serving(view: NodeView, manager: PluginManager, *names: str) -> None:
    await _until(view, lambda: all(_serving(manager, n) for n in names))


async def test_the_end_of_the_last_batch_ticks_membership() -> None:
    view = NodeView(NODE)
    before = view.membership.version
    with view.writing():
        with view.writing():
            pass
        assert view.membership.version == before and view.batches_writing == 1
    assert view.membership.version == before + 1 and view.batches_writing == 0


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


async def test_a_plugin_stops_while_starts_are_held(
    tmp_path: Path, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "START_HOLD_S", 3600.0)  # no hold ends by its deadline
    view = NodeView(NODE)
    async with trio.open_nursery() as nursery:
        manager = await _run_manager(view, tmp_path, http, nursery)
        _written(view, "i1")
        with trio.fail_after(30):
            await _until_serving(view, manager, "i1")
        with view.writing():
            _written(view, "i1", "i2")  # the batch holds i2's plugin back
            await trio.testing.wait_all_tasks_blocked()
            assert not _serving(manager, "i2")
            view.set_devices(CONFIG, {ObjectKey("ns", "i2"): Device("i2")})  # i1's device gone
            with trio.fail_after(30):
                await _until(view, lambda: not _serving(manager, "i1"))
            assert not _serving(manager, "i2") and view.batches_writing == 1
        with trio.fail_after(30):
            await _until_serving(view, manager, "i2")
        nursery.cancel_scope.cancel()
