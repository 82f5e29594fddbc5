"""The requeue's decisions (akri_trio/controller/dra/requeue.py): which unscheduled Pods wait for
an Akri device the scheduler refused them, and when the controller nudges for them."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.controller.dra.requeue import (
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


def test_nudges_come_at_the_planned_times_then_stop() -> None:
    state, nudge = nudge_step(None, 100.0)
    assert not nudge and state == Waiting(100.0)
    times = []
    now = 100.0
    while state.due() != math.inf:
        now = state.due()
        state, nudge = nudge_step(state, now)
        assert nudge
        times.append(now - 100.0)
    assert times == list(NUDGES_AFTER_S)
    assert nudge_step(state, now + 1e6) == (state, False)


@given(st.lists(st.floats(0, 200, allow_nan=False), min_size=1, max_size=40))
def test_nudges_are_never_more_than_planned_nor_early(offsets: list[float]) -> None:
    """Reconciles at any times (events, late requeues): at most one nudge per planned time,
    none before the first is due."""
    state: Waiting | None = None
    nudges = 0
    for now in sorted(offsets):
        before = state
        state, nudge = nudge_step(state, now)
        if nudge:
            assert before is not None and now >= before.due()
            nudges += 1
    assert nudges <= len(NUDGES_AFTER_S)
