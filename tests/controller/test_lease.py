"""Leader election: the pure decisions (lease_rules.py), then the elector's timing
(leader_elector.py) under trio's autojump clock, with two electors sharing one Lease held in
memory by `MemoryLease` (which keeps resourceVersions and refuses stale writes with Conflict, as
the API server does)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import trio

from akri_trio.controller import lease_rules
from akri_trio.controller.leader_elector import LeaderElector
from akri_trio.controller.lease_rules import Create, Seen, Update, Wait, decide
from akri_trio.kube import AlreadyExists, Conflict, ServerError

NAME, NS = "akri-controller", "akri"


def lease(holder: str, rv: str = "1", duration: int = 15, transitions: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS, "resourceVersion": rv},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "leaseTransitions": transitions,
        },
    }


def step(obj: dict[str, Any] | None, me: str, now: float, seen: Seen) -> tuple[Any, Seen]:
    return decide(obj, me, now, 1_700_000_000.0, seen, name=NAME, namespace=NS)


def test_no_lease_creates_it_held() -> None:
    decision, _ = step(None, "a", 0.0, Seen())
    assert isinstance(decision, Create)
    spec = decision.body["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"] == "2023-11-14T22:13:20.000000Z"


def test_own_lease_is_renewed_with_its_resource_version() -> None:
    decision, _ = step(lease("a", rv="7"), "a", 0.0, Seen())
    assert isinstance(decision, Update) and not decision.acquire
    assert decision.body["metadata"]["resourceVersion"] == "7"
    assert decision.body["spec"]["holderIdentity"] == "a"


def test_free_lease_is_taken_at_once() -> None:
    decision, _ = step(lease("", transitions=3), "b", 0.0, Seen())
    assert isinstance(decision, Update) and decision.acquire
    assert decision.body["spec"]["holderIdentity"] == "b"
    assert decision.body["spec"]["leaseTransitions"] == 4


def test_held_lease_is_waited_out_on_our_clock() -> None:
    decision, seen = step(lease("a"), "b", 100.0, Seen())
    assert decision == Wait(115.0, "a")  # first look: unchanged since now
    decision, seen = step(lease("a"), "b", 110.0, seen)
    assert decision == Wait(115.0, "a")
    decision, seen = step(lease("a"), "b", 115.0, seen)
    assert isinstance(decision, Update) and decision.acquire


def test_a_renewal_is_dated_by_the_previous_look() -> None:
    """The change happened after the look that still saw the old version: expiry counts from
    that look, so a candidate looking every 2 s is never more than the duration late."""
    _, seen = step(lease("a", rv="1"), "b", 100.0, Seen())
    decision, seen = step(lease("a", rv="2"), "b", 102.0, seen)
    assert decision == Wait(115.0, "a")
    # A look long after the previous one does not date the change: from now.
    decision, _ = step(lease("a", rv="3"), "b", 110.0, seen)
    assert decision == Wait(125.0, "a")


def test_holding_ends_at_the_renew_deadline() -> None:
    assert lease_rules.holding(renewed_at=10.0, now=19.9)
    assert not lease_rules.holding(renewed_at=10.0, now=20.0)
    # Safety margin: the holder gives up before any candidate may take over.
    assert lease_rules.RENEW_DEADLINE_S + lease_rules.RETRY_S < lease_rules.LEASE_DURATION_S


def test_release_frees_the_lease() -> None:
    released = lease_rules.release(lease("a", rv="9"), 0.0)
    assert released["spec"]["holderIdentity"] is None
    assert released["metadata"]["resourceVersion"] == "9"


# --- the elector, with a Lease in memory --------------------------------------------------------


class MemoryLease:
    """One Lease with resourceVersions; writes with a stale one fail with Conflict."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.versions = itertools.count(1)
        self.down = False  # every request fails (an API server away)

    def _check(self) -> None:
        if self.down:
            raise ServerError(503, "ServiceUnavailable", "down", {})

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self.versions))
        if obj["spec"].get("holderIdentity") is None:
            obj["spec"].pop("holderIdentity", None)
        self.obj = obj
        return copy.deepcopy(obj)

    async def get(self) -> dict[str, Any] | None:
        await trio.lowlevel.checkpoint()
        self._check()
        return copy.deepcopy(self.obj)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._check()
        if self.obj is not None:
            raise AlreadyExists(409, "AlreadyExists", "exists", {})
        return self._store(body)

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._check()
        assert self.obj is not None
        if body["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "stale", {})
        return self._store(body)

    @property
    def holder(self) -> str:
        return str(((self.obj or {}).get("spec") or {}).get("holderIdentity") or "")


class Leading:
    """Records who is running the work, and checks two never overlap."""

    def __init__(self) -> None:
        self.now: set[str] = set()
        self.overlaps = 0

    def work(self, who: str) -> Any:
        async def run() -> None:
            self.now.add(who)
            self.overlaps += len(self.now) > 1
            try:
                await trio.sleep_forever()
            finally:
                self.now.discard(who)

        return run


async def _elect(
    nursery: trio.Nursery, api: MemoryLease, who: str, leading: Leading
) -> tuple[LeaderElector, trio.CancelScope]:
    elector = LeaderElector(api, who, name=NAME, namespace=NS)
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await elector.run(leading.work(who))

    nursery.start_soon(run)
    await trio.sleep(0.01)
    return elector, scope


async def leads(elector: LeaderElector, leading: bool) -> None:
    """Until `elector.leading` is `leading` (the mock clock jumps: no real time passes)."""
    while elector.leading != leading:  # noqa: ASYNC110  (a flag, checked each 0.1 s of mock time)
        await trio.sleep(0.1)


@pytest.fixture
def api() -> MemoryLease:
    return MemoryLease()


async def test_one_leads_the_standby_takes_over_within_the_duration(
    autojump_clock: trio.testing.MockClock, api: MemoryLease
) -> None:
    leading = Leading()
    async with trio.open_nursery() as nursery:
        a, a_scope = await _elect(nursery, api, "a", leading)
        b, _ = await _elect(nursery, api, "b", leading)
        await trio.sleep(60)
        assert leading.now == {"a"} and a.leading and not b.leading
        # "a" dies without a word: its task is gone, nothing is released.
        a._lease = None
        a_scope.cancel()
        died = trio.current_time()
        await leads(b, True)
        took = trio.current_time() - died
        assert took <= lease_rules.LEASE_DURATION_S, took
        assert leading.now == {"b"} and api.holder == "b"
        nursery.cancel_scope.cancel()
    assert leading.overlaps == 0


async def test_shutdown_hands_the_lease_back(
    autojump_clock: trio.testing.MockClock, api: MemoryLease
) -> None:
    leading = Leading()
    async with trio.open_nursery() as nursery:
        _, a_scope = await _elect(nursery, api, "a", leading)
        b, _ = await _elect(nursery, api, "b", leading)
        await trio.sleep(20)
        a_scope.cancel()  # a clean shutdown: the Lease is released on the way out
        died = trio.current_time()
        await leads(b, True)
        assert trio.current_time() - died <= lease_rules.RETRY_S + 0.5
        nursery.cancel_scope.cancel()
    assert leading.overlaps == 0


async def test_a_leader_cut_off_steps_down_before_anyone_takes_over(
    autojump_clock: trio.testing.MockClock, api: MemoryLease
) -> None:
    """The leader cannot renew (its requests fail); it stops its work at the renew deadline,
    strictly before the standby's lease expiry, and leads again once it can."""
    leading = Leading()
    async with trio.open_nursery() as nursery:
        a, _ = await _elect(nursery, api, "a", leading)
        await trio.sleep(12)
        assert a.leading
        api.down = True
        cut = trio.current_time()
        await leads(a, False)
        assert trio.current_time() - cut <= lease_rules.RENEW_DEADLINE_S
        assert leading.now == set()
        api.down = False
        await leads(a, True)
        nursery.cancel_scope.cancel()


async def test_a_lease_taken_by_someone_else_cancels_the_work(
    autojump_clock: trio.testing.MockClock, api: MemoryLease
) -> None:
    leading = Leading()
    async with trio.open_nursery() as nursery:
        a, _ = await _elect(nursery, api, "a", leading)
        await trio.sleep(3)
        assert api.obj is not None
        api._store(lease("intruder", rv="x"))  # someone forced the Lease over
        await trio.sleep(lease_rules.RENEW_PERIOD_S + 1)
        assert not a.leading and leading.now == set()
        nursery.cancel_scope.cancel()
