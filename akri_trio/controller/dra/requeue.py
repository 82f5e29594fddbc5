"""DRA mode: asking the scheduler to look again at Pods it refused an Akri device in error.

kube-scheduler (1.37) can refuse a Pod that asks for `akri.sh/<instance>` or
`akri.sh/<configuration>` with "cannot allocate all claims" while the device has room: for a
while after it writes a claim's allocation, until that Pod's binding finishes, it counts the
claim's consumed capacity twice (once from its claim cache, once as still in flight). For a
device of consumable capacity, which is how Akri publishes a device shared by several Pods,
each such claim hides a slot. On the extended-resource path the window lasts a second or more,
so in a burst of Pods the last ones are refused although their slots are free (bench.dra_storm:
2 of 50 on a quiet machine). Nothing requeues them afterwards: the end of the window is no
event, and another Pod's claim getting allocated is not one the scheduler retries such a Pod
for. They wait for the scheduler's periodic flush of unschedulable Pods (5 minutes by default).

A change to a DeviceClass requeues every Pod the scheduler's DRA plugin refused. So the
controller watches the unscheduled Pods of its namespace (or all) and, for each that the
scheduler refused with that message while asking for an Akri extended resource, annotates the
DeviceClass of that resource (`REQUEUE_ANNOTATION`, metadata only; the class reconcile compares
labels and spec) a few times with growing pauses (`NUDGES_AFTER_S`, after the window), at most
once per class every `CLASS_GAP_S` (one change requeues every refused Pod at once), then once a
minute while the Pod stays refused (`LATER_S`, at most once a minute per class): a device that
is really full costs one write a minute per class while Pods wait for it. Pods that name their
ResourceClaims (DRA mode's brokers) have a window too short to be seen and are left to the
scheduler. With `--namespace` only that namespace's Pods are watched, though
a Pod of any namespace may ask for Akri's extended resources.

The decisions are here; the edge (`Requeuer` in reconcilers.py) reads the store of unscheduled
Pods, asks `nudge_step` and writes the annotations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from akri_trio.model import naming
from akri_trio.model.resources import JSON

REFUSAL: Final = "cannot allocate all claims"  # kube-scheduler's DRA plugin's message
REQUEUE_ANNOTATION: Final = "akri.sh/requeue"
# Seconds from the refusal seen to each nudge: the first after the window has closed, the
# rest in case the Pod was refused again in the next window of a longer burst.
NUDGES_AFTER_S: Final = (2.0, 6.0, 14.0, 30.0, 62.0)
CLASS_GAP_S: Final = 1.0  # at most one nudge a second per class
# Then, while the Pod stays refused, one nudge a minute, at most one a minute per class: a Pod
# waiting for a full device is requeued by the scheduler when a claim of it is freed, but may
# meet the miscount then, when several of the waiting Pods are allocated at once.
LATER_S: Final = 60.0
# The unscheduled Pods, as the watch asks for them.
UNSCHEDULED: Final = "spec.nodeName=,status.phase=Pending"
EXTENDED_INDEX: Final = "extendedResourceName"


def akri_resources(pod: Mapping[str, Any]) -> frozenset[str]:
    """The Akri extended resources a Pod's containers ask for (limits or requests)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return frozenset(
        name
        for container in containers
        for part in ("limits", "requests")
        for name in ((container.get("resources") or {}).get(part) or {})
        if name.startswith(f"{naming.AKRI_PREFIX}/")
    )


def refused_for_device(pod: Mapping[str, Any]) -> bool:
    """Whether the scheduler's last word on the Pod is a refusal by its DRA plugin."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled":
            return (
                condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
                and REFUSAL in str(condition.get("message") or "")
            )
    return False


def slim_unscheduled(pod: JSON) -> JSON:
    """What the requeue keeps of an unscheduled Pod: the Akri resources it waits for, none
    unless the scheduler refused it a device."""
    meta = pod.get("metadata") or {}
    waits = sorted(akri_resources(pod)) if refused_for_device(pod) else []
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
        "waits": waits,
    }


def extended_resource_of(device_class: JSON) -> str | None:
    return (device_class.get("spec") or {}).get("extendedResourceName") or None


@attrs.frozen
class Waiting:
    """A refused Pod's nudges: when it was first seen refused, how many were made."""

    since: float
    made: int = 0

    def due(self) -> float:
        """When the next nudge is due."""
        return _due(self.since, self.made)


def _due(since: float, made: int) -> float:
    """When nudge number `made` (from 0) of a Pod refused at `since` is due."""
    planned = len(NUDGES_AFTER_S)
    if made < planned:
        return since + NUDGES_AFTER_S[made]
    return since + NUDGES_AFTER_S[-1] + (made - planned + 1) * LATER_S


def nudge_step(waiting: Waiting | None, now: float) -> tuple[Waiting, float | None]:
    """A refused Pod's state at `now`, and whether to nudge for it now: None not, else the
    least time since the class's last nudge (CLASS_GAP_S while planned, then LATER_S)."""
    state = waiting or Waiting(now)
    if now < state.due():
        return state, None
    gap = CLASS_GAP_S if state.made < len(NUDGES_AFTER_S) else LATER_S
    made = state.made + 1
    while _due(state.since, made) <= now:
        made += 1  # nudges missed (a busy queue) are not made up one by one
    return attrs.evolve(state, made=made), gap
