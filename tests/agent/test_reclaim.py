"""The slot reclaimer's decisions (akri_trio.agent.reclaim_plan), on a fake clock."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akri_trio.agent.reclaim_plan import (
    DEFAULT_GRACE_SECONDS,
    DeviceKey,
    ReclaimState,
    device_key,
    in_use_keys,
)

INST = "akri-debug-echo-foo-4294ea"
SLOT = device_key(INST, f"{INST}-0")  # instance level: akri.sh/<instance>, bare slot id
VDEV = device_key("akri-debug-echo-foo", "akri-debug-echo-foo-3")  # configuration level

Report = Mapping[str, list[str]]
NOTHING: Report = {}


def run(
    state: ReclaimState, now: float, held: Mapping[DeviceKey, float | None], report: Report
) -> tuple[ReclaimState, frozenset[DeviceKey]]:
    step = state.step(now, held, report.items())
    return step.state, step.to_free


def test_device_key_uses_kubelet_spelling() -> None:
    assert DeviceKey("akri.sh/akri-debug-echo-foo-4294ea", "akri-debug-echo-foo-4294ea-0") == SLOT


def test_default_grace_is_20_seconds() -> None:
    assert ReclaimState().grace == DEFAULT_GRACE_SECONDS == 20.0


def test_negative_or_nan_grace_is_rejected() -> None:
    with pytest.raises(ValueError):
        ReclaimState(grace=-1)
    with pytest.raises(ValueError):
        ReclaimState(grace=float("nan"))


def test_absent_slot_is_freed_after_grace_not_before() -> None:
    state = ReclaimState()
    held: dict[DeviceKey, float | None] = {SLOT: None}
    state, free = run(state, 100.0, held, NOTHING)
    assert free == frozenset()
    state, free = run(state, 119.9, held, NOTHING)
    assert free == frozenset()
    state, free = run(state, 120.0, held, NOTHING)
    assert free == {SLOT}


def test_instance_level_slot_reported_by_kubelet_is_kept_upstream_prefix_bug() -> None:
    # upstream compared "akri.sh/<slot>" with the kubelet's bare "<slot>": never equal
    state = ReclaimState()
    report = {f"akri.sh/{INST}": [f"{INST}-0"]}
    for t in range(0, 200, 10):
        state, free = run(state, float(t), {SLOT: None}, report)
        assert free == frozenset()


def test_instance_level_slot_absent_from_kubelet_is_reclaimed() -> None:
    # the other half of upstream's bug: instance-level slots were never freed
    state = ReclaimState()
    report = {"akri.sh/akri-debug-echo-foo": ["akri-debug-echo-foo-3"]}
    state, _ = run(state, 0.0, {SLOT: None, VDEV: None}, report)
    _, free = run(state, 20.0, {SLOT: None, VDEV: None}, report)
    assert free == {SLOT}


def test_prefixed_device_id_in_report_does_not_count() -> None:
    # a report must use the kubelet's spelling; a prefixed id is some other device
    state = ReclaimState()
    report = {f"akri.sh/{INST}": [f"akri.sh/{INST}-0"]}
    state, _ = run(state, 0.0, {SLOT: None}, report)
    _, free = run(state, 20.0, {SLOT: None}, report)
    assert free == {SLOT}


def test_same_device_id_under_another_resource_does_not_count() -> None:
    state = ReclaimState()
    report = {"akri.sh/something-else": [SLOT.device]}
    state, _ = run(state, 0.0, {SLOT: None}, report)
    _, free = run(state, 20.0, {SLOT: None}, report)
    assert free == {SLOT}


def test_config_level_vdev_is_reclaimed_too() -> None:
    state = ReclaimState()
    state, _ = run(state, 0.0, {VDEV: None}, NOTHING)
    _, free = run(state, 25.0, {VDEV: None}, NOTHING)
    assert free == {VDEV}


def test_reappearance_resets_the_absence_clock() -> None:
    state = ReclaimState()
    held: dict[DeviceKey, float | None] = {SLOT: None}
    present = {SLOT.resource: [SLOT.device]}
    state, _ = run(state, 0.0, held, NOTHING)
    state, _ = run(state, 15.0, held, present)
    state, free = run(state, 20.0, held, NOTHING)  # absent again since 20, not since 0
    assert free == frozenset()
    state, free = run(state, 39.0, held, NOTHING)
    assert free == frozenset()
    _, free = run(state, 40.0, held, NOTHING)
    assert free == {SLOT}


def test_recently_claimed_slot_is_never_freed() -> None:
    # absent for ages (the previous container ended), then claimed again at t=100 by Allocate;
    # the new container may not exist yet
    state = ReclaimState()
    state, _ = run(state, 0.0, {SLOT: 0.0}, NOTHING)
    state, free = run(state, 110.0, {SLOT: 100.0}, NOTHING)
    assert free == frozenset()
    state, free = run(state, 119.0, {SLOT: 100.0}, NOTHING)
    assert free == frozenset()
    _, free = run(state, 120.0, {SLOT: 100.0}, NOTHING)
    assert free == {SLOT}


def test_claim_time_in_the_future_is_not_freed() -> None:
    state = ReclaimState()
    state, _ = run(state, 0.0, {SLOT: 500.0}, NOTHING)
    _, free = run(state, 100.0, {SLOT: 500.0}, NOTHING)
    assert free == frozenset()


def test_failed_free_is_retried_next_pass() -> None:
    state = ReclaimState()
    held: dict[DeviceKey, float | None] = {SLOT: None}
    state, _ = run(state, 0.0, held, NOTHING)
    state, free = run(state, 20.0, held, NOTHING)
    assert free == {SLOT}
    # the write failed: the shell still holds it and says so
    state, free = run(state, 30.0, held, NOTHING)
    assert free == {SLOT}


def test_successful_free_forgets_the_device() -> None:
    state = ReclaimState()
    state, _ = run(state, 0.0, {SLOT: None}, NOTHING)
    state, free = run(state, 20.0, {SLOT: None}, NOTHING)
    assert free == {SLOT}
    state, free = run(state, 30.0, {}, NOTHING)
    assert free == frozenset()
    assert state.absent_since == {}
    # held again later (a new claim with unknown time): a fresh grace period starts
    state, free = run(state, 31.0, {SLOT: None}, NOTHING)
    assert free == frozenset()
    _, free = run(state, 50.0, {SLOT: None}, NOTHING)
    assert free == frozenset()


def test_step_does_not_mutate_the_old_state() -> None:
    state = ReclaimState()
    after = state.step(0.0, {SLOT: None}, []).state
    assert state.absent_since == {}
    assert after.absent_since == {SLOT: 0.0}


def test_report_repeated_per_container_is_merged() -> None:
    report = [(SLOT.resource, [SLOT.device]), (VDEV.resource, []), (SLOT.resource, ["x"])]
    assert in_use_keys(report) == {SLOT, DeviceKey(SLOT.resource, "x")}


def test_zero_grace_frees_on_first_absence() -> None:
    _, free = run(ReclaimState(grace=0), 5.0, {SLOT: 5.0}, NOTHING)
    assert free == {SLOT}


# --- properties ----------------------------------------------------------------------------------

KEYS = [device_key(INST, f"{INST}-{i}") for i in range(3)] + [
    device_key("cfg", f"cfg-{n}") for n in range(2)
]

pass_strategy = st.tuples(
    st.floats(0, 15),  # time since the previous pass
    st.sets(st.sampled_from(KEYS)),  # held
    st.sets(st.sampled_from(KEYS)),  # reported in use by the kubelet
    st.sets(st.sampled_from(KEYS)),  # (re)claimed just before this pass
)


@settings(max_examples=1000)
@given(grace=st.sampled_from([0.0, 5.0, 20.0]), passes=st.lists(pass_strategy, max_size=40))
def test_reclaimer_never_frees_in_use_or_fresh_or_briefly_absent(
    grace: float, passes: list[tuple[float, set[DeviceKey], set[DeviceKey], set[DeviceKey]]]
) -> None:
    state = ReclaimState(grace=grace)
    now = 0.0
    claimed_at: dict[DeviceKey, float] = {}
    last_seen: dict[DeviceKey, float] = {}  # the last pass the kubelet reported it
    for dt, held, in_use, fresh in passes:
        now += dt
        for key in fresh:
            claimed_at[key] = now
        held_map = {k: claimed_at.get(k) for k in held}
        report: dict[str, list[str]] = {}
        for key in in_use:
            report.setdefault(key.resource, []).append(key.device)
            last_seen[key] = now
        step = state.step(now, held_map, report.items())
        state = step.state
        # (f) never free what the kubelet reports, what was claimed within grace, or what is
        # not held; and only after a whole grace period without a sighting
        assert step.to_free <= held
        assert not step.to_free & in_use
        for key in step.to_free:
            if key in claimed_at:
                assert now - claimed_at[key] >= grace
            if key in last_seen:
                assert now - last_seen[key] >= grace
        # liveness: a held, unreported, unclaimed key absent since long ago is freed
        for key in held - in_use:
            since = state.absent_since[key]
            if now - since >= grace and now - claimed_at.get(key, -1e9) >= grace:
                assert key in step.to_free
        # only what is held is remembered
        assert set(state.absent_since) == held - in_use


@settings(max_examples=500)
@given(
    grace=st.floats(1, 60),
    absent_for=st.floats(0, 200),
)
def test_freed_exactly_when_absent_for_grace(grace: float, absent_for: float) -> None:
    state = ReclaimState(grace=grace)
    state, _ = run(state, 1000.0, {SLOT: None}, NOTHING)
    now = 1000.0 + absent_for
    _, free = run(state, now, {SLOT: None}, NOTHING)
    assert (SLOT in free) == (now - 1000.0 >= grace)  # elapsed as the clock sees it
