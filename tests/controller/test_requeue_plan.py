"""The requeue's decisions (akri_trio/controller/dra/requeue.py): which unscheduled Pods wait for
an Akri device the scheduler refused them, and when the controller nudges for them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.controller.dra.requeue import (
    CLASS_GAP_S,
    LATER_S,
    NUDGES_AFTER_S,
    REFUSAL,
    Waiting,
    akri_resources,
    nudge_step,
    refused_for_device,
    slim_unscheduled,
)
from akri_trio.kube import JSON


def _pod(limits: dict[str, str], *, message: str | None = None, init: bool = False) -> JSON:
    container = {"name": "c", "resources": {"limits": limits}}
    spec = {"initContainers" if init else "containers": [container]}
    pod: JSON = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec}
    if message is not None:
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
        }
        pod["status"] = {"conditions": [condition]}
    return pod


REFUSED = f"0/3 nodes are available: 1 {REFUSAL}, 2 node(s) didn't match Pod's node affinity."


def test_a_pod_refused_a_device_waits_for_its_akri_resources_only() -> None:
    pod = _pod({"akri.sh/cam-8120fe": "1", "cpu": "1", "example.com/gpu": "1"}, message=REFUSED)
    assert slim_unscheduled(pod) == {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "waits": ["akri.sh/cam-8120fe"],
    }


def test_init_containers_and_requests_count_too() -> None:
    assert akri_resources(_pod({"akri.sh/cam": "2"}, init=True)) == {"akri.sh/cam"}
    pod = _pod({})
    pod["spec"]["containers"][0]["resources"] = {"requests": {"akri.sh/cam": "1"}}
    assert akri_resources(pod) == {"akri.sh/cam"}


def test_a_pod_refused_for_another_reason_or_not_yet_tried_waits_for_nothing() -> None:
    limits = {"akri.sh/cam": "1"}
    assert slim_unscheduled(_pod(limits))["waits"] == []
    assert slim_unscheduled(_pod(limits, message="0/1 nodes: 1 Insufficient cpu."))["waits"] == []
    scheduled = _pod(limits, message=REFUSED)
    scheduled["status"]["conditions"][0].update(status="True", reason="", message="")
    assert not refused_for_device(scheduled)


def test_nudges_come_at_the_planned_times_then_once_a_minute() -> None:
    state, gap = nudge_step(None, 100.0)
    assert gap is None and state == Waiting(100.0)
    times: list[float] = []
    gaps: list[float] = []
    while len(times) < len(NUDGES_AFTER_S) + 3:
        now = state.due()
        assert nudge_step(state, now - 0.001) == (state, None)  # not early
        state, gap = nudge_step(state, now)
        assert gap is not None
        times.append(now - 100.0)
        gaps.append(gap)
    last = NUDGES_AFTER_S[-1]
    assert times == [*NUDGES_AFTER_S, last + LATER_S, last + 2 * LATER_S, last + 3 * LATER_S]
    assert gaps == [CLASS_GAP_S] * len(NUDGES_AFTER_S) + [LATER_S] * 3


def test_nudges_missed_by_a_late_reconcile_are_not_made_up() -> None:
    state, _ = nudge_step(None, 0.0)
    state, gap = nudge_step(state, 40.0)  # the 2, 6, 14 and 30 s nudges due: one is made
    assert gap == CLASS_GAP_S and state.due() == NUDGES_AFTER_S[-1]


@given(st.lists(st.floats(0, 600, allow_nan=False), min_size=1, max_size=40))
def test_nudges_are_never_more_than_planned_nor_early(offsets: list[float]) -> None:
    """Reconciles at any times (events, late requeues): at most one nudge per planned time,
    none before it is due."""
    state: Waiting | None = None
    nudges = 0
    for now in sorted(offsets):
        before = state
        state, gap = nudge_step(state, now)
        if gap is not None:
            assert before is not None and now >= before.due()
            nudges += 1
    first = min(offsets)
    planned = sum(1 for t in NUDGES_AFTER_S if first + t <= max(offsets))
    later = max(0.0, max(offsets) - first - NUDGES_AFTER_S[-1]) // LATER_S
    assert nudges <= planned + later
