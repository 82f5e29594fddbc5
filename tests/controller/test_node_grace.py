"""A NotReady node found serving Instances when the controller starts: cleaned only once it has
been NotReady for the grace (`--node-lost-grace`), looked at again when the grace ends.

`Reconcilers.node` reads only its caches here (filled by hand, as the watches fill them); the
removal itself (`_release_node`, a real-cluster matter, tests/controller/test_controller_restart)
is replaced by a record of when it was asked for. Time is the autojump clock's: the wall clock
the reconcilers compare lastTransitionTime with is derived from it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from akri_trio.controller import NodeState
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.controller.reconcilers import Reconcilers
from akri_trio.controller.triggers import make_caches, slim_node
from akri_trio.kube import (
    JSON,
    Apply,
    Client,
    Init,
    InitApply,
    InitDone,
    ObjectKey,
    ReconcileQueue,
    Requeue,
)
from akri_trio.model.convert import unstructure
from tests.controller.objects import instance

EPOCH = 1_795_456_800.0  # the wall clock at trio time 0
GRACE = 300.0
NODE = "node-a"
KEY = ObjectKey("", NODE)


def _rfc3339(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(status: str, changed: float | None) -> JSON:
    ready: JSON = {"type": "Ready", "status": status}
    if changed is not None:
        ready["lastTransitionTime"] = _rfc3339(changed)
    return slim_node(
        {"metadata": {"name": NODE, "uid": "n-uid"}, "status": {"conditions": [ready]}}
    )


class RecordingReconcilers(Reconcilers):
    """The reconcilers, with the removal of a lost node's entries recorded instead of sent."""

    released: list[tuple[float, str, str]]

    async def _release_node(self, node: str, why: str) -> None:
        self.released.append((trio.current_time(), node, why))


@pytest.fixture
async def reconcilers() -> AsyncIterator[RecordingReconcilers]:
    # No request is made: every decision here reads the caches (the client points nowhere).
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:
        caches = make_caches()
        for store in (caches.instances, caches.configurations, caches.nodes):
            store.apply(Init())
        caches.instances.apply(InitApply(unstructure(instance(nodes=(NODE,)))))
        for store in (caches.instances, caches.configurations):
            store.apply(InitDone())
        r = RecordingReconcilers(
            Client(http),
            caches,
            ControllerMetrics(),
            clock=lambda: EPOCH + trio.current_time(),
            node_lost_grace=GRACE,
        )
        r.released = []
        yield r


def _nodes_listed(r: Reconcilers, obj: JSON) -> None:
    r.c.nodes.apply(InitApply(obj))
    r.c.nodes.apply(InitDone())


async def test_a_node_not_ready_for_less_than_the_grace_is_kept_until_the_grace_ends(
    autojump_clock: trio.testing.MockClock, reconcilers: RecordingReconcilers
) -> None:
    _nodes_listed(reconcilers, node("False", changed=EPOCH - 60))
    assert await reconcilers.node(KEY) == Requeue(GRACE - 60)
    assert reconcilers.released == [] and NODE not in reconcilers.node_states

    queue = ReconcileQueue(reconcilers.node, workers=1, drain=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        queue.enqueue(KEY)
        await trio.sleep(GRACE - 60 - 1)
        assert reconcilers.released == []
        await trio.sleep(2)
        assert reconcilers.released == [(GRACE - 60, NODE, "NotReady when this controller started")]
        nursery.cancel_scope.cancel()
    assert reconcilers.node_states[NODE] is NodeState.CLEANED


async def test_a_node_not_ready_for_longer_than_the_grace_is_cleaned_at_once(
    autojump_clock: trio.testing.MockClock, reconcilers: RecordingReconcilers
) -> None:
    _nodes_listed(reconcilers, node("False", changed=EPOCH - GRACE - 1))
    assert await reconcilers.node(KEY) is None
    assert reconcilers.released == [(0.0, NODE, "NotReady when this controller started")]


async def test_a_node_ready_again_within_the_grace_keeps_its_entries(
    autojump_clock: trio.testing.MockClock, reconcilers: RecordingReconcilers
) -> None:
    _nodes_listed(reconcilers, node("False", changed=EPOCH - 10))
    queue = ReconcileQueue(reconcilers.node, workers=1, drain=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        queue.enqueue(KEY)
        await trio.sleep(100)
        reconcilers.c.nodes.apply(Apply(node("True", changed=EPOCH + 100)))
        queue.enqueue(KEY)  # as the Node watch does
        await trio.sleep(2 * GRACE)
        nursery.cancel_scope.cancel()
    assert reconcilers.released == []
    assert reconcilers.node_states[NODE] is NodeState.READY
    # Then going NotReady while watched is a loss at once, as upstream.
    reconcilers.c.nodes.apply(Apply(node("False", changed=EPOCH + 2 * GRACE)))
    assert await reconcilers.node(KEY) is None
    assert [why for _, _, why in reconcilers.released] == ["NotReady"]


async def test_without_a_transition_time_the_grace_runs_from_first_sight(
    autojump_clock: trio.testing.MockClock, reconcilers: RecordingReconcilers
) -> None:
    # Also the bound when the node's clock is ahead: the grace never outlasts first sight.
    for changed in (None, EPOCH + 3600):
        reconcilers.released.clear()
        reconcilers.not_ready_seen.clear()
        reconcilers.node_states.clear()
        start = trio.current_time()
        reconcilers.c.nodes.apply(Apply(node("False", changed=changed)))
        assert await reconcilers.node(KEY) == Requeue(GRACE)
        await trio.sleep(100)
        assert await reconcilers.node(KEY) == Requeue(GRACE - 100)
        await trio.sleep(GRACE - 100)
        assert await reconcilers.node(KEY) is None
        assert reconcilers.released == [
            (start + GRACE, NODE, "NotReady when this controller started")
        ]
