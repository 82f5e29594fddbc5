"""A lost node's removal from one Instance against the real API server, when the Instance has
moved on since the plan was made: the guarded patch fails its `test`, the edge re-plans from a
fresh read, and the NodeLost Event tells what was actually removed.

The reconcilers run without their watches (their caches stay empty): `_release_instance` is
handed a plan made from an Instance as read before its node's agent changed it.
"""

from __future__ import annotations

from akri_trio.controller import events as ev
from akri_trio.controller import release_instance
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.controller.reconcilers import Reconcilers
from akri_trio.controller.triggers import make_caches
from akri_trio.kube import Client
from akri_trio.model.convert import structure
from akri_trio.model.resources import INSTANCES, Instance
from tests.controller.support import (
    make_instance,
    namespace,
    served_configuration,
    unique,
    with_nodes,
)


class RecordedEvents(Reconcilers):
    """The reconcilers, keeping the Events they record (the recorder's own path is
    tests/controller/test_controller_cluster's)."""

    events: list[ev.Event]

    def record(self, event: ev.Event | None) -> None:
        if event is not None:
            self.events.append(event)


async def test_node_lost_event_tells_the_slots_the_written_release_freed(api: Client) -> None:
    lost, other = unique("lost"), unique("other")
    async with namespace(api, "ctl-release") as ns:
        config = await served_configuration(api, ns, [lost, other])
        inst = await make_instance(
            api,
            config,
            "cfg-aaaaaa",
            [lost, other],
            usage={"cfg-aaaaaa-0": lost, "cfg-aaaaaa-1": other},
        )
        stale = release_instance(structure(inst, Instance), lost)
        assert stale is not None and dict(stale.slots) == {"cfg-aaaaaa-0": lost}
        # Meanwhile the lost node's agent freed slot 0 and took slot 2.
        usage = {"cfg-aaaaaa-0": None, "cfg-aaaaaa-2": lost}
        await api.merge_patch(
            INSTANCES, "cfg-aaaaaa", {"spec": {"deviceUsage": usage}}, namespace=ns
        )

        r = RecordedEvents(api, make_caches(), ControllerMetrics())
        r.events = []
        await r._release_instance(stale, "NotReady")

        after = await with_nodes(api, ns, "cfg-aaaaaa", [other])
        assert after is not None and after["spec"]["deviceUsage"] == {"cfg-aaaaaa-1": other}
        (event,) = r.events
        assert event.reason == "NodeLost"
        assert event.message == (
            f"node {lost} lost (NotReady): removed from its nodes; freed cfg-aaaaaa-2"
        )

        # Sent again with nothing left to remove: no Event claims a removal.
        await r._release_instance(stale, "NotReady")
        assert len(r.events) == 1
