"""DRA mode's part of the agent: `DraNode.run` starts it, in order.

DraNode.run
├── probe: does the API server take consumable capacity? (a server-side dry run)
├── NodePoolPublisher        Instances -> this node's ResourceSlices (re-published when wiped)
└── kubelet plugin           registration socket + DRA socket -> Preparer -> CDI specs
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import trio

from akri_trio.agent.dra.plugin import serve_kubelet_plugin
from akri_trio.agent.dra.preparer import Preparer
from akri_trio.agent.dra.publisher import NodePoolPublisher
from akri_trio.agent.view import NodeView
from akri_trio.dra import DRIVER, RESOURCE_SLICES, probe_slice, takes_consumable_capacity
from akri_trio.kube import ApiError, Backoff, Client, Store

log = logging.getLogger(__name__)


async def probe_consumable_capacity(api: Client) -> bool:
    """Whether the API server keeps `allowMultipleAllocations` (DRAConsumableCapacity); retried
    with backoff while the API server cannot answer."""
    backoff = Backoff()
    attempt = 0
    while True:
        try:
            answer = await api.request(
                "POST", RESOURCE_SLICES.path(), params={"dryRun": "All"}, body=probe_slice()
            )
            return takes_consumable_capacity(answer)
        except (ApiError, httpx.HTTPError) as exc:
            delay = backoff.delay(attempt)
            attempt += 1
            log.warning("consumable-capacity probe failed (%s); again in %.1f s", exc, delay)
            await trio.sleep(delay)


class DraNode:
    def __init__(
        self,
        api: Client,
        view: NodeView,
        instances: Store,
        *,
        namespace: str | None,
        kubelet_root_dir: Path,
        cdi_dir: Path,
    ) -> None:
        self.api = api
        self.view = view
        self.instances = instances
        self.namespace = namespace
        self.kubelet_root_dir = kubelet_root_dir
        self.cdi_dir = cdi_dir
        self.consumable: bool | None = None
        self.publisher: NodePoolPublisher | None = None
        self.preparer: Preparer | None = None
        self.registered = False

    def _on_status(self, registered: bool, error: str) -> None:
        self.registered = registered

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        consumable = self.consumable = await probe_consumable_capacity(self.api)
        log.info(
            "DRA driver %s on node %s: %s",
            DRIVER,
            self.view.node,
            "one device per Instance with consumable capacity"
            if consumable
            else "one device per slot (no consumable capacity)",
        )
        self.publisher = NodePoolPublisher(
            self.api,
            self.instances,
            self.view.node,
            namespace=self.namespace,
            consumable=consumable,
        )
        self.preparer = Preparer(
            self.api,
            self.view,
            cdi_dir=self.cdi_dir,
            state_dir=self.kubelet_root_dir / "plugins" / DRIVER,
            consumable=consumable,
        )
        self.preparer.load()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.publisher.run)
            await nursery.start(
                serve_kubelet_plugin, self.kubelet_root_dir, self.preparer, self._on_status
            )
            task_status.started()
