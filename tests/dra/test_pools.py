"""One round of a pool's publisher (`plan_round`), the same on the agent's node pools and the
controller's shared pools: what is wanted is published untainted; a device that vanishes stays
tainted, where the pool was, until its grace ends; then the pool goes; a pool wiped meanwhile
is published again with what it still holds; a device that cannot come back gets no grace.
Where the API server keeps no device taints the grace holds the device untainted, and a field
the server drops is no change once the writer knows what it stored."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.address import ObjectKey
from akri_trio.dra import (
    OFFLINE_GRACE_S,
    OFFLINE_TAINT,
    PoolMemory,
    PoolPlan,
    PoolRound,
    Wanted,
    node_placement,
    plan_round,
    pool_devices,
    pool_key,
    pool_labels,
    shared_placement,
    shared_pool,
)
from akri_trio.dra.slices import essence
from tests.dra.support import instance

JSON = dict[str, Any]
POOL = shared_pool("ns", "cam-abc123")


def _wanted(*nodes: str, consumable: bool = True) -> Wanted:
    inst = instance(shared=True, nodes=nodes)
    return Wanted(
        pool_devices([inst], consumable=consumable),
        shared_placement(nodes),
        pool_labels("shared", "ns"),
    )


def _without_taints(body: JSON) -> JSON:
    """`body` as an API server without DRADeviceTaints stores it."""
    out = copy.deepcopy(body)
    for device in out["spec"]["devices"]:
        device.pop("taints", None)
    return out


class Publisher:
    """A publisher's state between rounds and the API's slices, as both edges keep them;
    `server` is what the API server makes of a slice written (it may drop fields), and
    `stored_as` what the writer learns from its answers."""

    def __init__(self, server: Any = copy.deepcopy) -> None:
        self.slices: dict[str, JSON] = {}
        self.memory: PoolMemory | None = None
        self.written = 0
        self.server = server
        self.stored_as: dict[str, str] = {}
        self.writes = 0

    def round(self, wanted: Wanted | None, now: float, **kw: Any) -> PoolRound:
        out = plan_round(
            POOL,
            wanted,
            list(self.slices.values()),
            self.memory,
            now=now,
            written=self.written,
            stored_as=self.stored_as,
            **kw,
        )
        self.memory = out.memory
        self._carry_out(out.plan)
        return out

    def _carry_out(self, plan: PoolPlan) -> None:
        stored_as = {}
        for body in plan.apply:
            stored = self.server(body)
            stored["metadata"]["uid"] = "u"
            self.slices[body["metadata"]["name"]] = stored
            stored_as[essence(body)] = essence(stored)
            self.writes += 1
        if plan.apply:
            self.written = max(self.written, plan.generation)
            self.stored_as = stored_as
        for name in plan.delete:
            self.slices.pop(name, None)

    def devices(self) -> dict[str, list[JSON]]:
        return {
            d["name"]: list(d.get("taints") or [])
            for s in self.slices.values()
            for d in s["spec"]["devices"]
        }


def test_what_is_wanted_is_published_and_nothing_written_again() -> None:
    pub = Publisher()
    first = pub.round(_wanted("n1"), 0.0)
    assert first.plan.generation == 1 and first.next_deadline is None
    assert pub.devices() == {"cam-abc123": []}
    assert pub.round(_wanted("n1"), 1.0).plan.unchanged


def test_vanished_devices_stay_tainted_where_the_pool_was_then_the_pool_goes() -> None:
    pub = Publisher()
    pub.round(_wanted("n1", "n2"), 0.0)
    held = pub.round(None, 10.0)
    assert pub.devices() == {"cam-abc123": [OFFLINE_TAINT]}
    assert held.next_deadline == 10.0 + OFFLINE_GRACE_S
    (body,) = pub.slices.values()
    assert body["spec"]["nodeSelector"] == shared_placement(["n1", "n2"])["nodeSelector"]
    assert body["metadata"]["labels"] == pool_labels("shared", "ns")
    assert pub.round(None, 10.0 + OFFLINE_GRACE_S - 1).plan.unchanged
    gone = pub.round(None, 10.0 + OFFLINE_GRACE_S)
    assert gone.memory is None and gone.next_deadline is None
    assert pub.slices == {}


def test_a_pool_wiped_in_the_grace_is_published_again_with_what_it_holds() -> None:
    """The kubelet deletes a node's slices when it starts: the devices still in their grace
    come back, tainted, at a generation above every one written."""
    pub = Publisher()
    pub.round(_wanted("n1"), 0.0)
    pub.round(None, 1.0)
    pub.slices.clear()
    again = pub.round(None, 2.0)
    assert pub.devices() == {"cam-abc123": [OFFLINE_TAINT]}
    assert again.plan.generation == 3


def test_without_device_taints_a_vanished_device_is_held_untainted_for_its_grace() -> None:
    pub = Publisher()
    first = pub.round(_wanted("n1"), 0.0, taints=False)
    held = pub.round(None, 10.0, taints=False)
    assert held.plan.unchanged  # the same device, untainted: nothing to write
    assert pub.devices() == {"cam-abc123": []}
    assert held.next_deadline == 10.0 + OFFLINE_GRACE_S
    assert pub.round(_wanted("n1"), 20.0, taints=False).plan.unchanged  # back: still the same
    pub.round(None, 30.0, taints=False)
    gone = pub.round(None, 30.0 + OFFLINE_GRACE_S, taints=False)
    assert gone.memory is None and pub.slices == {}
    assert first.plan.generation == 1 and pub.writes == 1


def test_a_taint_the_server_drops_is_written_once_not_at_every_round() -> None:
    """A publisher that plans the taint (it did not know) on a server that drops it: the first
    tainted round writes, and the rounds after compare with what the server stored."""
    pub = Publisher(server=_without_taints)
    pub.round(_wanted("n1"), 0.0)
    pub.round(None, 1.0)
    assert pub.devices() == {"cam-abc123": []} and pub.writes == 2
    for now in range(2, 50):
        assert pub.round(None, float(now)).plan.unchanged
    assert pub.writes == 2


def test_a_restarted_publisher_deletes_a_pool_nothing_wants_at_once() -> None:
    pub = Publisher()
    pub.round(_wanted("n1"), 0.0)
    pub.memory = None  # a new run
    pub.round(None, 1.0)
    assert pub.slices == {}


def test_a_device_that_cannot_come_back_gets_no_grace() -> None:
    pub = Publisher()
    pub.round(_wanted("n1"), 0.0)
    pub.round(None, 1.0, may_return=lambda device: False)
    assert pub.slices == {} and pub.memory is None


def test_a_slices_pool_is_its_key() -> None:
    pub = Publisher()
    pub.round(_wanted("n1"), 0.0)
    (body,) = pub.slices.values()
    assert pool_key(body) == ObjectKey("", POOL)
    assert pool_key({"spec": {}}) is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["n1", "n2", None]), st.floats(min_value=0, max_value=400)),
        max_size=12,
    )
)
def test_every_history_ends_in_one_pool_at_a_higher_generation_or_none(
    steps: list[tuple[str | None, float]],
) -> None:
    pub = Publisher()
    now = 0.0
    last = 0
    for node, gap in steps:
        now += gap
        out = pub.round(None if node is None else _wanted(node, consumable=False), now)
        if out.plan.apply:
            assert out.plan.generation > last
            last = out.plan.generation
        generations = {s["spec"]["pool"]["generation"] for s in pub.slices.values()}
        assert len(generations) <= 1
        if node is not None:
            assert set(pub.devices()) == {"cam-abc123-0", "cam-abc123-1"}
            assert not any(pub.devices().values())
            (body,) = pub.slices.values()
            assert body["spec"]["nodeSelector"] == shared_placement([node])["nodeSelector"]
        elif pub.slices:
            assert all(t == [OFFLINE_TAINT] for t in pub.devices().values())


def test_node_pools_are_placed_by_node_name() -> None:
    inst = instance()
    wanted = Wanted(
        pool_devices([inst], consumable=True), node_placement("n1"), pool_labels("node", "ns")
    )
    out = plan_round("node-pool", wanted, [], None, now=0.0)
    (body,) = out.plan.apply
    assert body["spec"]["nodeName"] == "n1"
