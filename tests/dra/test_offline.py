"""The offline grace of DRA devices: a vanished device is published tainted NoSchedule at once,
leaves its pool when the grace ends, and is published untainted, under its name, when it comes
back within the grace. Time runs on trio's autojump clock."""

from __future__ import annotations

from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery import registry
from akri_trio.dra import device_attributes
from akri_trio.dra.offline import (
    OFFLINE_GRACE_S,
    OFFLINE_TAINT,
    GraceStep,
    Vanished,
    configuration_of,
    hold_vanished,
    tainted,
)

JSON = dict[str, Any]


def _device(name: str) -> JSON:
    return {"name": name, "attributes": {"akri.sh/instance": {"string": name}}}


class Pool:
    """A publisher's memory between rounds, as the shell keeps it."""

    def __init__(self) -> None:
        self.previous: list[JSON] = []
        self.vanished: dict[str, Vanished] = {}

    def round(self, wanted: list[JSON]) -> GraceStep:
        out = hold_vanished(wanted, self.previous, self.vanished, now=trio.current_time())
        self.previous, self.vanished = wanted, dict(out.vanished)
        return out

    @staticmethod
    def taints(out: GraceStep) -> dict[str, list[JSON]]:
        return {str(d["name"]): list(d.get("taints") or []) for d in out.devices}


async def test_a_vanished_device_is_tainted_at_once_and_unpublished_after_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pool = Pool()
    assert Pool.taints(pool.round([_device("a"), _device("b")])) == {"a": [], "b": []}
    out = pool.round([_device("a")])
    assert Pool.taints(out) == {"a": [], "b": [OFFLINE_TAINT]}
    assert out.next_deadline == trio.current_time() + OFFLINE_GRACE_S
    await trio.sleep(OFFLINE_GRACE_S - 1)
    assert Pool.taints(pool.round([_device("a")])) == {"a": [], "b": [OFFLINE_TAINT]}
    await trio.sleep(1)
    out = pool.round([_device("a")])
    assert Pool.taints(out) == {"a": []}
    assert out.next_deadline is None and not out.vanished


async def test_a_device_back_within_the_grace_is_untainted_under_its_name(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pool = Pool()
    pool.round([_device("a")])
    pool.round([])
    await trio.sleep(OFFLINE_GRACE_S / 2)
    out = pool.round([_device("a")])
    assert out.devices == (_device("a"),) and not out.vanished
    # Gone again later: a fresh grace, not what was left of the first one.
    await trio.sleep(OFFLINE_GRACE_S / 2 + 10)
    out = pool.round([])
    assert Pool.taints(out) == {"a": [OFFLINE_TAINT]}
    assert out.next_deadline == trio.current_time() + OFFLINE_GRACE_S


async def test_a_vanished_device_keeps_its_first_time_across_rounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pool = Pool()
    pool.round([_device("a")])
    start = trio.current_time()
    pool.round([])
    for _ in range(5):
        await trio.sleep(OFFLINE_GRACE_S / 10)
        assert pool.round([]).next_deadline == start + OFFLINE_GRACE_S


def test_tainting_keeps_other_taints_and_adds_ours_once() -> None:
    other = {"key": "example.com/x", "effect": "None"}
    device = {**_device("a"), "taints": [other]}
    assert tainted(tainted(device))["taints"] == [other, OFFLINE_TAINT]
    assert "taints" not in device or device["taints"] == [other]  # not mutated


@given(
    st.lists(st.sets(st.sampled_from("abcdef")), min_size=1, max_size=12),
    st.lists(st.floats(min_value=0, max_value=400), min_size=12, max_size=12),
)
def test_every_wanted_device_is_published_untainted_and_every_other_tainted(
    rounds: list[set[str]], gaps: list[float]
) -> None:
    previous: list[JSON] = []
    vanished: dict[str, Vanished] = {}
    now = 0.0
    seen: dict[str, float] = {}  # name -> when it was last wanted
    for names, gap in zip(rounds, gaps, strict=False):
        now += gap
        wanted = [_device(n) for n in sorted(names)]
        out = hold_vanished(wanted, previous, vanished, now=now)
        published = {str(d["name"]): d for d in out.devices}
        for n in names:
            assert published[n] == _device(n)
        for n, d in published.items():
            if n not in names:
                assert d["taints"] == [OFFLINE_TAINT]
                assert now - out.vanished[n].since < OFFLINE_GRACE_S
        assert set(published) <= set(names) | set(seen)
        for n in names:
            seen[n] = now
        previous, vanished = wanted, dict(out.vanished)


def test_the_grace_is_device_plugin_modes() -> None:
    """The grace the agent gives a handler that stops answering before its devices count as
    gone."""
    assert OFFLINE_GRACE_S == registry.OFFLINE_GRACE_S


def test_configuration_of_reads_a_devices_identity_attributes() -> None:
    """A publisher lets a device go at once when the Configuration it names is gone: it finds
    it in the device's own identity attributes."""
    named = {"name": "d", "attributes": device_attributes("cam", "a", "i", {}).as_api()}
    assert configuration_of(named) == ("a", "cam")
    assert configuration_of({"name": "bare"}) is None


async def test_a_device_that_cannot_come_back_leaves_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`may_return` no (its Configuration deleted): no grace, whether it vanishes now or is
    already in its grace; the others keep theirs."""
    gone = {"b", "c"}

    def may_return(device: JSON) -> bool:
        return device["name"] not in gone

    out = hold_vanished([], [_device("a"), _device("b")], {}, now=0.0, may_return=may_return)
    assert Pool.taints(out) == {"a": [OFFLINE_TAINT]}
    held = {"c": Vanished(_device("c"), 0.0), **out.vanished}
    out = hold_vanished([], [], held, now=1.0, may_return=may_return)
    assert set(out.vanished) == {"a"}
