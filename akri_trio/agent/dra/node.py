"""DRA mode's part of the agent: `DraNode.run` starts it, in order.

DraNode.run                  (ready() once the kubelet registered the plugin: the agent's /readyz)
├── node lock                one agent at a time serves driver akri.sh on a node
├── probe: does the API server take consumable capacity? (dra.edge, a server-side dry run)
├── free the D:<claim>:<node> slots a device-plugin-mode run recorded (agent/dra/holdings.py)
├── NodePoolReconciler       Instances -> this node's ResourceSlices (re-published when wiped)
│   ├── watch of this node's slices
│   └── pool queue           the shared runner, keyed by pool
└── kubelet plugin           registration socket + DRA socket -> Preparer -> CDI specs

With brokerInfo (`workloads`), Prepare mounts each claim's workload directory, and `held` and
`report` serve the brokerInfo copier (which the agent starts once this has started).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import WorkloadDirs
from akri_trio.agent.brokerinfo._sync import Workloads
from akri_trio.agent.dra.claim_status import ClaimStatus
from akri_trio.agent.dra.holdings import record_claims
from akri_trio.agent.dra.plugin import serve_kubelet_plugin
from akri_trio.agent.dra.pool_reconciler import NodePoolReconciler
from akri_trio.agent.dra.preparer import Preparer
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.view import NodeView
from akri_trio.dra import DRIVER
from akri_trio.dra.edge import probe_consumable_capacity
from akri_trio.kube import Client, Store
from akri_trio.model.resources import Configuration, Instance
from akri_trio.rpc.uds import DEFAULT_LIMITS, ServerLimits

log = logging.getLogger(__name__)


LOCK_FILE = "agent.lock"
LOCK_POLL_S = 1.0


@contextlib.asynccontextmanager
async def node_lock(path: Path, on_wait: Callable[[], None] | None = None) -> AsyncIterator[None]:
    """Hold an exclusive lock on `path` (waiting for it, polled) until the block exits;
    `on_wait` is called once if it has to wait.

    The kubelet knows one plugin per driver and socket path, and the checkpoint has one
    writer: one agent per node serves DRA. A second agent in DRA mode on the node (a rolling
    update's new Pod, an agent scoped to another namespace) waits here, not ready, instead of
    taking the sockets over. The kernel drops the lock when its holder dies, so a crashed agent
    never blocks the next one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        waiting = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    log.warning("another agent serves DRA on this node (%s held); waiting", path)
                    waiting = True
                    if on_wait is not None:
                        on_wait()
                await trio.sleep(LOCK_POLL_S)
        if waiting:
            log.info("took over DRA on this node (%s)", path)
        yield
    finally:
        os.close(fd)  # releases the lock


class DraNode:
    def __init__(
        self,
        api: Client,
        view: NodeView,
        instances: Store[Instance],
        *,
        configurations: Store[Configuration] | None = None,
        namespace: str | None,
        kubelet_root_dir: Path,
        cdi_dir: Path,
        consumable: bool | None = None,
        workloads: WorkloadDirs | None = None,
        grpc: ServerLimits = DEFAULT_LIMITS,
    ) -> None:
        self.api = api
        self.grpc = grpc  # the kubelet plugin's sockets' limits
        self.view = view
        self.instances = instances
        # The agent's Configurations when it watches all of its namespace(s): a device whose
        # Configuration is gone leaves its pool at once (NodePoolReconciler).
        self.configurations = configurations
        self.namespace = namespace
        self.kubelet_root_dir = kubelet_root_dir
        self.cdi_dir = cdi_dir
        self.consumable = consumable  # None: ask the API server
        self.pools: NodePoolReconciler | None = None
        self.workloads = workloads
        self.preparer: Preparer | None = None
        self.claim_status: ClaimStatus | None = None
        self.registered = False

    def _on_status(self, registered: bool, error: str) -> None:
        self.registered = registered

    def ready(self) -> bool:
        """Whether the kubelet has registered this agent's plugin (and said nothing since):
        not while another agent holds the node lock, not before the kubelet has called, not
        after it refused the driver. The agent's /readyz reports it."""
        return self.registered

    def held(self) -> dict[ObjectKey, set[str]]:
        """brokerInfo: the claims prepared here, per Instance (once `run` has started)."""
        if self.preparer is None:
            raise RuntimeError("DraNode.held before DraNode.run started")
        return self.preparer.held()

    async def report(self, workloads: Workloads) -> dict[ObjectKey, Sequence[str]]:
        """brokerInfo: running workloads' files into their claims' status."""
        if self.claim_status is None:
            raise RuntimeError("DraNode.report before DraNode.run started")
        return await self.claim_status.report(workloads)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        state_dir = self.kubelet_root_dir / "plugins" / DRIVER
        async with node_lock(state_dir / LOCK_FILE):
            await self._run(state_dir, task_status)

    async def _run(self, state_dir: Path, task_status: trio.TaskStatus[None]) -> None:
        consumable = self.consumable
        if consumable is None:
            consumable = self.consumable = await probe_consumable_capacity(self.api)
        log.info(
            "DRA driver %s on node %s: %s",
            DRIVER,
            self.view.node,
            "one device per Instance with consumable capacity"
            if consumable
            else "one device per slot (no consumable capacity)",
        )
        self.pools = NodePoolReconciler(
            self.api,
            self.instances,
            self.view.node,
            namespace=self.namespace,
            consumable=consumable,
            configurations=self.configurations,
        )
        self.preparer = Preparer(
            self.api,
            self.view,
            cdi_dir=self.cdi_dir,
            state_dir=state_dir,
            consumable=consumable,
            workloads=self.workloads,
        )
        self.preparer.load()
        # What a device-plugin-mode run recorded of this node's claims: the scheduler counts them.
        await record_claims(Claims(self.api, self.view), self.view, {})
        self.claim_status = ClaimStatus(self.api, self.view.node, self.preparer)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.pools.run)
            await nursery.start(
                functools.partial(serve_kubelet_plugin, limits=self.grpc),
                self.kubelet_root_dir,
                self.preparer,
                self._on_status,
            )
            task_status.started()
