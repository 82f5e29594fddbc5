"""When to create, delete or recreate broker Pods and Jobs: pure decisions over observed state.

One call decides for one Instance, from the desired bodies (brokers.py), the broker objects
observed for it and the time; the edge performs the result and calls again on the next event
or at `wake_at`. Rules for Pod brokers:

- a Pod whose name or target node is no longer desired is deleted at once;
- Running: left alone;
- Pending for more than PENDING_TIMEOUT_S (counted from `startTime`, else `creationTimestamp`):
  recreated; Succeeded or Failed: recreated (the Instance still wants a broker there);
- Unknown: left alone (the node's state decides, see nodeloss.py); being deleted: awaited;
- missing: created.

Recreation is delete-then-create under one name, and each create is rate-limited per broker by
a `Retry` state: after the k-th create since the broker last ran stably, the next create may
not happen before `delay(k)` seconds have passed. The failed Pod stays (inspectable) until
then. A hot loop — a broker rejected at admission and recreated at once, forever — is what
this prevents. `delay` is the caller's exponential-with-jitter policy; the state records the
instant it allowed, so jitter is drawn once per create and the decision stays reproducible.
A broker Running for STABLE_AFTER_S is forgiven: its count starts again from zero.

Job brokers are not recreated (a Job retries its own Pods): the Job of the current
Configuration generation is created once, Jobs of other generations are deleted with
propagation Background, and a finished Job stays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from akri_trio.controller.observed import Delete, ObservedPod, claim_names
from akri_trio.model import naming

PENDING_TIMEOUT_S: Final = 300.0
STABLE_AFTER_S: Final = 60.0

# Seconds to wait after the k-th create (k >= 1) before the next one may happen.
Delay = Callable[[int], float]


@attrs.frozen
class Retry:
    """Creates of one broker since it last ran stably, and when the next one may happen."""

    creates: int = 0
    not_before: float = 0.0


@attrs.frozen
class PodPlan:
    create: tuple[dict[str, Any], ...] = ()
    delete: tuple[Delete, ...] = ()
    # The Retry state to keep for this Instance's brokers (absent = never created or forgiven).
    retries: Mapping[str, Retry] = attrs.field(factory=dict)
    # When to decide again even if nothing is observed to change (None: only on events).
    wake_at: float | None = None


_ENDED = frozenset({"Succeeded", "Failed"})


def _earliest(*times: float | None) -> float | None:
    return min((t for t in times if t is not None), default=None)


def plan_pods(
    desired: Mapping[str, Mapping[str, Any]],
    observed: Iterable[ObservedPod],
    retries: Mapping[str, Retry],
    now: float,
    delay: Delay,
    *,
    pending_timeout: float = PENDING_TIMEOUT_S,
    stable_after: float = STABLE_AFTER_S,
) -> PodPlan:
    """Decide for one Instance. `desired` maps Pod name -> body (brokers.broker_pods; empty
    when the Instance is gone or being deleted); `observed` are the Pods labelled with the
    Instance; `retries` is the state this function returned last time."""
    creates: list[dict[str, Any]] = []
    deletes: list[Delete] = []
    state: dict[str, Retry] = {n: r for n, r in retries.items() if n in desired}
    wake: float | None = None
    present: set[str] = set()

    for pod in observed:
        present.add(pod.name)
        body = desired.get(pod.name)
        retry = state.get(pod.name, Retry())
        if pod.deleting:
            continue
        if body is None or pod.target_node != _target_node(body):
            deletes.append(Delete(pod.namespace, pod.name, pod.uid, "not desired"))
            continue
        if pod.claims != claim_names(body):
            # Made in the other allocation mode (a switch between device plugins and DRA):
            # replaced, the new one made once this one is gone, so it never holds a slot the
            # old one still holds (DRA offers no slot device-plugin mode holds).
            deletes.append(Delete(pod.namespace, pod.name, pod.uid, "allocation mode changed"))
            continue
        since = pod.started if pod.started is not None else pod.created
        if pod.phase == "Running":
            if retry.creates and since is not None:
                if now - since >= stable_after:
                    del state[pod.name]
                else:
                    wake = _earliest(wake, since + stable_after)
            continue
        if pod.phase == "Pending":
            if since is None or now - since < pending_timeout:
                wake = _earliest(wake, None if since is None else since + pending_timeout)
                continue
            reason = f"Pending for more than {pending_timeout:g} s"
        elif pod.phase in _ENDED:
            reason = pod.phase
        else:
            continue
        if now >= retry.not_before:
            deletes.append(Delete(pod.namespace, pod.name, pod.uid, reason))
        else:
            wake = _earliest(wake, retry.not_before)

    for name, body in desired.items():
        if name in present:
            continue
        retry = state.get(name, Retry())
        if now < retry.not_before:
            wake = _earliest(wake, retry.not_before)
            continue
        creates.append(dict(body))
        state[name] = Retry(retry.creates + 1, now + delay(retry.creates + 1))
    return PodPlan(tuple(creates), tuple(deletes), state, wake)


def _target_node(body: Mapping[str, Any]) -> str | None:
    labels: Mapping[str, str] = body["metadata"]["labels"]
    return labels.get(naming.LABEL_TARGET_NODE)


# --- Job brokers ---------------------------------------------------------------------------------


@attrs.frozen
class JobPlan:
    create: dict[str, Any] | None = None
    delete: tuple[Delete, ...] = ()
    # The name of the Job launched for this Instance: the edge keeps it and passes it back.
    launched: str | None = None


def plan_job(
    desired: Mapping[str, Any] | None,
    observed: Iterable[Mapping[str, Any]],
    launched: str | None,
) -> JobPlan:
    """Decide for one Instance. `desired` is brokers.broker_job (None when the Instance is gone
    or being deleted); `observed` are the Jobs labelled with the Instance; `launched` is what
    this function returned last time (None after a restart).

    A Job is created once per generation: a finished Job that something else removed (a
    `ttlSecondsAfterFinished`, a user) is not run again while `launched` remembers it. With
    `launched` lost, a Job already observed under the desired name also counts as launched."""
    name = None if desired is None else desired["metadata"]["name"]
    deletes = []
    seen = False
    for job in observed:
        meta = job["metadata"]
        if meta["name"] == name:
            seen = True
        elif meta.get("deletionTimestamp") is None:
            deletes.append(Delete.of(job, "older generation", propagation="Background"))
    if desired is None:
        return JobPlan(None, tuple(deletes), None)
    if seen or launched == name:
        return JobPlan(None, tuple(deletes), name)
    return JobPlan(dict(desired), tuple(deletes), name)
