"""A node's Configuration status entry is written once per change, even while the watched copy
of the Configuration lags behind the node's own writes (a fleet's load: every node's status
write is an event for every other node)."""

from __future__ import annotations

import contextlib

import httpx
import trio

from akri_trio.agent.configurations import ConfigurationReconciler, configuration_store
from akri_trio.agent.view import NodeView
from akri_trio.discovery.registry import Registry
from akri_trio.kube.client import Client
from akri_trio.kube.errors import NotFound
from akri_trio.kube.watch import Apply
from akri_trio.model.convert import structure
from akri_trio.model.resources import CONFIGURATIONS, Configuration
from tests.support.akri_cluster import debug_echo_config, ensure_namespace, install_crds

NS = "agent-status-writes"
NODE = "node-status"


class StatusPatches:
    """Counts the status PATCHes sent on a client (an httpx hook: the real requests)."""

    def __init__(self, api: Client) -> None:
        self.count = 0
        api.http.event_hooks["request"].append(self._sent)

    async def _sent(self, request: httpx.Request) -> None:
        if request.method == "PATCH" and request.url.path.endswith("/status"):
            self.count += 1


async def test_an_entry_already_written_is_not_written_again_while_the_watch_lags(
    api: Client,
) -> None:
    await install_crds(api)
    await ensure_namespace(api, NS)
    patches = StatusPatches(api)
    name = "lagging"
    with contextlib.suppress(NotFound):  # left by an interrupted run
        await api.delete(CONFIGURATIONS, name, namespace=NS)
    stale = structure(
        await api.create(CONFIGURATIONS, debug_echo_config(name, NS, ["d0"])), Configuration
    )
    try:
        async with trio.open_nursery() as nursery:
            configs = configuration_store()  # the watch: fed by hand below, as far behind as wanted
            reconciler = ConfigurationReconciler(
                api, NodeView(NODE), Registry(trio.current_time), configs, nursery, print
            )
            # The copy the node decides on never shows its own entry (the watch is behind).
            await reconciler._write_status(stale, None, None)
            await reconciler._write_status(stale, None, None)
            assert patches.count == 1

            # The watch brings our write, then someone removes the entry: a copy that new is
            # believed.
            fresh = await api.get(CONFIGURATIONS, name, namespace=NS)
            configs.apply(Apply(fresh))
            wiped = structure({**fresh, "status": {"nodes": []}}, Configuration)
            await reconciler._write_status(wiped, None, None)
            assert patches.count == 2
            nursery.cancel_scope.cancel()
    finally:
        await api.delete(CONFIGURATIONS, name, namespace=NS)
