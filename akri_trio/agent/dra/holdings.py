"""A device-plugin-mode agent's care of the claims DRA mode left prepared on its node (the edge).

After a switch back from DRA mode the Pods that hold claims keep running. Until each ends, its
claim holds part of a device that no `deviceUsage` shows, and its kubelet needs a DRA plugin to
unprepare it (without one the Pod stays Terminating). So, from the DRA kubelet plugin's
checkpoint:

1. before the device plugins start (the agent starts them once `run` has started), each
   prepared claim's share of an Instance is recorded in its `deviceUsage` as this node's
   `D:<claim uid>:<node>` slots (`holdings_plan`): this node's plugins show them unhealthy
   (those of a claim made for a Pod's `akri.sh/<instance>`, `DX:`, healthy to its instance
   plugin: the scheduler counts that Pod's request), every other node's plugins held, no
   Allocate takes them and the slot reclaimer leaves them;
2. while the checkpoint holds a claim, the kubelet plugin is served (registration and
   NodeUnprepareResources; NodePrepareResources of a new claim is refused with a message
   saying why), and each unprepare frees its records;
3. with the checkpoint empty, the plugin stops (its sockets go, the kubelet unregisters it
   and wipes the node's slices 30 s later).

The node lock (agent/dra/node.py) is held while the checkpoint is read and served. A DRA-mode agent
still on the node (two agents on one node: a DaemonSet's rolling update deletes the old Pod before
it makes the new one) keeps its claims: the device plugins start at once, and its claims are taken
over (recorded, served) when it stops and frees the lock. On a node where no DRA-mode agent ever
ran (no plugin directory) only what an earlier run recorded and no checkpoint holds is freed, and
nothing DRA is imported. A DRA-mode agent frees its node's records when it starts (`record_claims`
with nothing prepared): there the scheduler counts the claims, and a record would only keep its
slot out of the pool.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.dra.holdings_plan import Want, record, unrecorded, wanted
from akri_trio.agent.plugins.claims import ClaimFailed, Claims, InstanceGone
from akri_trio.agent.view import NodeView
from akri_trio.model.resources import Instance
from akri_trio.rpc.uds import DEFAULT_LIMITS, ServerLimits
from akri_trio.runtime import Backoff

if TYPE_CHECKING:
    from akri_trio.dra.checkpoint import PreparedClaim

# The DRA driver's name (akri_trio.dra.names.DRIVER, which a test checks this is): written out
# so that a node that never ran DRA mode imports no DRA module.
DRIVER_DIR = "akri.sh"

log = logging.getLogger(__name__)

RESYNC_S = 60.0  # records someone else changed (a re-created Instance) are redone this late


class DraHoldings:
    def __init__(
        self,
        view: NodeView,
        claims: Claims,
        *,
        kubelet_root_dir: Path,
        cdi_dir: Path,
        grpc: ServerLimits = DEFAULT_LIMITS,
    ) -> None:
        self.view = view
        self.claims = claims
        self.kubelet_root_dir = kubelet_root_dir
        self.cdi_dir = cdi_dir
        self.grpc = grpc
        self.prepared: Mapping[str, PreparedClaim] = {}  # what the checkpoint holds now
        self.registered = False

    def _on_status(self, registered: bool, error: str) -> None:
        self.registered = registered

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Started once the first records are written; then serves the claims left until
        the last is unprepared, and waits (idle) for the agent to stop."""
        await self._run(task_status)
        await trio.sleep_forever()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        state_dir = self.kubelet_root_dir / "plugins" / DRIVER_DIR
        if not state_dir.is_dir():
            await self.record({})
            task_status.started()
            return
        # Imported here: a node that never ran DRA mode loads none of its gRPC services.
        from akri_trio.agent.dra.node import LOCK_FILE, node_lock
        from akri_trio.agent.dra.plugin import serve_kubelet_plugin
        from akri_trio.agent.dra.preparer import Preparer

        started = False

        def start() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        def held_elsewhere() -> None:
            log.warning(
                "a DRA-mode agent runs on this node: the device plugins start now, and the "
                "claims it prepared are taken over when it stops"
            )
            start()

        async with node_lock(state_dir / LOCK_FILE, on_wait=held_elsewhere):
            preparer = Preparer(
                self.claims.api,
                self.view,
                cdi_dir=self.cdi_dir,
                state_dir=state_dir,
                consumable=False,  # for health, which is not served here
                new_claims=False,
            )
            preparer.load()
            self.prepared = preparer.prepared
            await self.record(self.prepared)
            start()
            if not self.prepared:
                return
            log.info(
                "%d claim(s) prepared in DRA mode still on this node: their slots are recorded "
                "in deviceUsage and the DRA plugin serves their unprepare until they end",
                len(self.prepared),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    functools.partial(serve_kubelet_plugin, limits=self.grpc, health=False),
                    self.kubelet_root_dir,
                    preparer,
                    self._on_status,
                )
                while self.prepared:
                    seen = preparer.changed.version
                    with trio.move_on_after(RESYNC_S):
                        await preparer.changed.wait_past(seen)
                    self.prepared = preparer.prepared
                    await self.record(self.prepared)
                nursery.cancel_scope.cancel()
            self.registered = False
            log.info("the last claim prepared in DRA mode is unprepared: DRA plugin stopped")

    async def record(self, prepared: Mapping[str, PreparedClaim]) -> None:
        await record_claims(self.claims, self.view, prepared)


async def record_claims(
    claims: Claims, view: NodeView, prepared: Mapping[str, PreparedClaim]
) -> None:
    """Make every Instance record exactly the slots `prepared` holds on this node (retried
    until the writes hold: the device plugins must not start before). A DRA-mode agent calls
    it with nothing prepared: the scheduler counts the claims there, and a record left from a
    run in device-plugin mode would only keep its slot out of the pool."""
    plan = wanted(prepared, view.instances(), view.node)
    counted = {uid for uid, claim in prepared.items() if claim.counted}
    for key, want in sorted(plan.items()):
        await _record_one(claims, view.node, key, want, counted)


async def _record_one(
    claims: Claims, node: str, key: ObjectKey, want: Want, counted: set[str]
) -> None:
    def decide(inst: Instance) -> dict[str, str]:
        usage = inst.spec.device_usage
        return record(usage, key.name, inst.spec.capacity, node, want, counted)

    backoff = Backoff()
    attempt = 0
    while True:
        try:
            inst = await claims.update_instance(key, decide)
        except InstanceGone:
            return
        except ClaimFailed as exc:
            log.warning("recording DRA claims' slots of %s: %s (will retry)", key, exc)
            await trio.sleep(backoff.delay(attempt))
            attempt += 1
            continue
        if missing := unrecorded(inst.spec.device_usage, key.name, node, want):
            log.warning(
                "%s: %d slot(s) of claims prepared in DRA mode found no free slot to "
                "record (held by another node since the switch)",
                key,
                missing,
            )
        return
