"""Broker lifecycle decisions (akri_trio.controller.lifecycle)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from akri_trio.controller import (
    PENDING_TIMEOUT_S,
    STABLE_AFTER_S,
    Delete,
    ObservedPod,
    Retry,
    broker_job,
    broker_pods,
    plan_job,
    plan_pods,
    timestamp,
)
from tests.controller.objects import configuration, instance, pod_json

T0 = timestamp("2024-01-01T00:00:00Z") or 0.0
POD = "node-a-akri-debug-echo-foo-8120fe-pod"
DESIRED = broker_pods(configuration({"brokerPodSpec": {"containers": [{"name": "c"}]}}), instance())
LABELS = DESIRED[POD]["metadata"]["labels"]


def doubling(k: int) -> float:
    return 10.0 * 2.0 ** (k - 1)


def observed(phase: str, *, started: str | None = None, **kw: Any) -> ObservedPod:
    return ObservedPod.of(pod_json(POD, phase, LABELS, started=started, **kw))


def test_observed_pod_reads_the_facts() -> None:
    pod = observed("Running", started="2024-01-01T00:00:10Z", deleting=True)
    assert (pod.name, pod.namespace, pod.uid, pod.phase) == (POD, "ns", "p-uid", "Running")
    assert pod.created == T0 and pod.started == T0 + 10 and pod.deleting
    assert pod.target_node == "node-a"


def test_missing_broker_is_created_and_its_retry_recorded() -> None:
    plan = plan_pods(DESIRED, [], {}, T0, doubling)
    assert [p["metadata"]["name"] for p in plan.create] == [POD]
    assert plan.retries == {POD: Retry(1, T0 + 10)}


def test_running_broker_is_left_alone() -> None:
    plan = plan_pods(DESIRED, [observed("Running")], {}, T0 + 1000, doubling)
    assert plan.create == () and plan.delete == ()


def test_pending_broker_recreated_only_after_five_minutes() -> None:
    pending = observed("Pending")
    early = plan_pods(DESIRED, [pending], {}, T0 + PENDING_TIMEOUT_S - 1, doubling)
    assert early.delete == () and early.wake_at == T0 + PENDING_TIMEOUT_S
    late = plan_pods(DESIRED, [pending], {}, T0 + PENDING_TIMEOUT_S + 1, doubling)
    assert [d.name for d in late.delete] == [POD] and late.delete[0].uid == "p-uid"


def test_pending_time_counts_from_start_time_when_set() -> None:
    pending = observed("Pending", started="2024-01-01T00:04:00Z")
    plan = plan_pods(DESIRED, [pending], {}, T0 + PENDING_TIMEOUT_S + 1, doubling)
    assert plan.delete == () and plan.wake_at == T0 + 240 + PENDING_TIMEOUT_S


def test_ended_broker_recreated_but_not_before_its_backoff() -> None:
    retry = {POD: Retry(2, T0 + 100)}
    for phase in ("Failed", "Succeeded"):
        waiting = plan_pods(DESIRED, [observed(phase)], retry, T0 + 50, doubling)
        assert waiting.delete == () and waiting.wake_at == T0 + 100
        due = plan_pods(DESIRED, [observed(phase)], retry, T0 + 100, doubling)
        assert [d.reason for d in due.delete] == [phase]


def test_gone_broker_recreated_after_backoff_with_a_longer_next_delay() -> None:
    retry = {POD: Retry(2, T0 + 100)}
    assert plan_pods(DESIRED, [], retry, T0 + 99, doubling).create == ()
    plan = plan_pods(DESIRED, [], retry, T0 + 100, doubling)
    assert len(plan.create) == 1 and plan.retries[POD] == Retry(3, T0 + 100 + doubling(3))


def test_broker_being_deleted_is_awaited() -> None:
    plan = plan_pods(DESIRED, [observed("Failed", deleting=True)], {}, T0, doubling)
    assert plan.create == () and plan.delete == ()


def test_unknown_phase_is_left_alone() -> None:
    plan = plan_pods(DESIRED, [observed("Unknown")], {}, T0 + 10_000, doubling)
    assert plan.create == () and plan.delete == ()


def test_broker_on_a_node_no_longer_listed_is_deleted_at_once() -> None:
    other = instance(nodes=("node-b",))
    desired = broker_pods(configuration({"brokerPodSpec": {"containers": []}}), other)
    plan = plan_pods(desired, [observed("Running")], {POD: Retry(5, T0 + 10**6)}, T0, doubling)
    assert plan.delete == (Delete("ns", POD, "p-uid", "not desired"),)
    assert [p["metadata"]["name"] for p in plan.create] == ["node-b-akri-debug-echo-foo-8120fe-pod"]
    assert POD not in plan.retries


def test_a_broker_of_the_other_allocation_mode_is_replaced_once_gone() -> None:
    """A switch between device plugins and DRA: a running broker without the desired claims
    (or with claims no longer desired) is deleted, and made again only once it is gone."""
    dra = {
        POD: {
            **DESIRED[POD],
            "spec": {
                **DESIRED[POD]["spec"],
                "resourceClaims": [{"name": "akri", "resourceClaimTemplateName": "t"}],
            },
        }
    }
    for desired, pod in ((dra, observed("Running")), (DESIRED, _with_claim(observed("Running")))):
        plan = plan_pods(desired, [pod], {}, T0, doubling)
        assert plan.delete == (Delete("ns", POD, "p-uid", "allocation mode changed"),)
        assert plan.create == ()
        going = plan_pods(desired, [attrs.evolve(pod, deleting=True)], {}, T0, doubling)
        assert going.create == () and going.delete == ()
        assert [p["metadata"]["name"] for p in plan_pods(desired, [], {}, T0, doubling).create] == [
            POD
        ]
    same = plan_pods(dra, [_with_claim(observed("Running"))], {}, T0, doubling)
    assert same.delete == () and same.create == ()


def _with_claim(pod: ObservedPod) -> ObservedPod:
    return attrs.evolve(pod, claims=frozenset({"akri"}))


def test_instance_gone_deletes_every_broker() -> None:
    plan = plan_pods({}, [observed("Running"), observed("Pending")], {}, T0, doubling)
    assert len(plan.delete) == 2 and plan.create == () and plan.retries == {}


def test_stable_running_broker_is_forgiven() -> None:
    running = observed("Running", started="2024-01-01T00:00:00Z")
    retry = {POD: Retry(4, T0 + 500)}
    young = plan_pods(DESIRED, [running], retry, T0 + STABLE_AFTER_S - 1, doubling)
    assert young.retries == retry and young.wake_at == T0 + STABLE_AFTER_S
    stable = plan_pods(DESIRED, [running], retry, T0 + STABLE_AFTER_S, doubling)
    assert stable.retries == {}


def jittered(seed: int) -> Any:
    rand = random.Random(seed)

    def delay(k: int) -> float:
        return min(300.0, 2.0 * 2.0 ** (k - 1)) * (1 - 0.5 * rand.random())

    return delay


def lower_bound(k: int) -> float:
    return min(300.0, 2.0 * 2.0 ** (k - 1)) * 0.5


_never_running = st.sampled_from(["Pending", "Failed", "Succeeded", "Unknown", "gone"])


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.floats(0.0, 400.0), _never_running), max_size=60),
    st.integers(0, 2**32),
)
def test_never_recreates_faster_than_backoff_allows(
    steps: list[tuple[float, str]], seed: int
) -> None:
    """A broker that never runs (rejected at admission, say) is created at ever longer intervals,
    whatever the Pod does in between and however often the controller is woken."""
    delay = jittered(seed)
    now, retries = T0, dict[str, Retry]()
    pod: ObservedPod | None = None
    creates: list[float] = []
    for dt, fate in steps:
        now += dt
        if pod is not None and fate == "gone":
            pod = None
        elif pod is not None:
            pod = attrs.evolve(pod, phase=fate)
        plan = plan_pods(DESIRED, [pod] if pod else [], retries, now, delay)
        retries = dict(plan.retries)
        if plan.delete:
            pod = None
        if plan.create:
            creates.append(now)
            pod = ObservedPod("ns", POD, f"uid-{len(creates)}", "Pending", LABELS, now)
        if plan.wake_at is not None:
            assert plan.wake_at > now
    for k, (before, after) in enumerate(itertools.pairwise(creates), start=1):
        assert after - before >= lower_bound(k)


@given(st.lists(st.sampled_from(["Running", "Failed", "gone"]), max_size=40))
def test_created_count_only_drops_after_a_stable_run(fates: list[str]) -> None:
    now, retries = T0, dict[str, Retry]()
    pod: ObservedPod | None = None
    for fate in fates:
        now += 45.0
        if pod is not None:
            pod = None if fate == "gone" else attrs.evolve(pod, phase=fate)
        before = retries.get(POD, Retry()).creates
        plan = plan_pods(DESIRED, [pod] if pod else [], retries, now, doubling)
        retries = dict(plan.retries)
        after = retries.get(POD, Retry()).creates
        if after < before:
            assert pod is not None and pod.phase == "Running" and pod.started is not None
            assert now - pod.started >= STABLE_AFTER_S
        if plan.delete:
            pod = None
        if plan.create:
            pod = ObservedPod("ns", POD, "u", "Pending", LABELS, now, now)


def attrs_evolve(pod: ObservedPod, phase: str) -> ObservedPod:
    return ObservedPod(
        pod.namespace, pod.name, pod.uid, phase, pod.labels, pod.created, pod.started
    )


# --- Jobs ----------------------------------------------------------------------------------------

JOB_SPEC = {"brokerJobSpec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}


def job_json(name: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"{name}-uid"}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"metadata": meta}


def test_job_created_once_per_generation() -> None:
    job = broker_job(configuration(JOB_SPEC, generation=4), instance())
    first = plan_job(job, [], None)
    assert first.create == job and first.launched == "akri-debug-echo-foo-8120fe-4-job"
    # Completed and then removed by a TTL: not run again.
    assert plan_job(job, [], first.launched).create is None
    # Still there (running or complete): left alone.
    seen = plan_job(job, [job_json("akri-debug-echo-foo-8120fe-4-job")], None)
    assert seen.create is None and seen.delete == () and seen.launched == first.launched


def test_generation_change_deletes_older_jobs_in_background() -> None:
    job = broker_job(configuration(JOB_SPEC, generation=5), instance())
    old = [job_json("akri-debug-echo-foo-8120fe-4-job"), job_json("x-3-job", deleting=True)]
    plan = plan_job(job, old, "akri-debug-echo-foo-8120fe-4-job")
    assert plan.create == job
    assert plan.delete == (
        Delete(
            "ns",
            "akri-debug-echo-foo-8120fe-4-job",
            "akri-debug-echo-foo-8120fe-4-job-uid",
            "older generation",
            "Background",
        ),
    )
    assert plan.delete[0].options()["propagationPolicy"] == "Background"
    assert plan.delete[0].options()["preconditions"] == {
        "uid": "akri-debug-echo-foo-8120fe-4-job-uid"
    }


def test_instance_gone_deletes_its_jobs() -> None:
    plan = plan_job(None, [job_json("a-1-job")], "a-1-job")
    assert [d.name for d in plan.delete] == ["a-1-job"] and plan.create is None
