"""What the controller tells `kubectl describe`: Events on Instances and Configurations.

An operator asking "why is there no broker for this camera?" runs `kubectl describe akrii X`
and sees what the controller did to it: a broker Pod or Job created, created again after it
ended (and how many times since it last ran stably), a broker that failed or that the API
server refused to create (with its message), a Service made or removed, a node lost. Each
Event goes on the object that owns what changed: a broker or an instance Service on its
Instance, a configuration Service on its Configuration; a lost node on every Instance it
left, and on every Configuration whose status entry for it was removed or whose Instance it
left with no node (and which was deleted).

Which Event a write means is decided here from plain data (`created`, `deleted`, `refused`,
`node_lost`, ...), with no I/O; the reconcilers hand each to the recorder, which never blocks
and deduplicates and rate-limits as the kubelet does (akri_trio.kube.events). An Event's
subject is in object form (`apiVersion`, `kind`, `metadata`), which the recorder takes as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from akri_trio.controller.lifecycle import Retry
from akri_trio.controller.observed import Delete
from akri_trio.model import naming
from akri_trio.model.resources import JSON, Configuration, Instance

Subject = Mapping[str, Any]  # apiVersion, kind, metadata {namespace, name, uid}


@attrs.frozen
class Event:
    """One Event to record: on `obj`, of `type` (Normal or Warning), `reason`, `message`."""

    obj: Subject
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def subject(api_version: str, kind: str, namespace: str, name: str, uid: str = "") -> JSON:
    meta = {"namespace": namespace, "name": name, "uid": uid}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def ref(obj: Configuration | Instance) -> JSON:
    meta = obj.metadata
    return subject(obj.api_version, obj.kind, meta.namespace, meta.name, meta.uid)


def owner(body: Mapping[str, Any]) -> JSON | None:
    """The controller owner of an object the controller writes (its ownerReferences)."""
    meta = body.get("metadata") or {}
    for r in meta.get("ownerReferences") or ():
        if r.get("controller"):
            namespace = str(meta.get("namespace") or "")
            return subject(r["apiVersion"], r["kind"], namespace, r["name"], r.get("uid", ""))
    return None


def _what(kind: str, name: str) -> str:
    return f"Service {name}" if kind == "Service" else f"broker {kind} {name}"


def created(body: Mapping[str, Any], retry: Retry | None = None) -> Event | None:
    """The Event for an object the controller just created. `retry` is the broker's state
    after this create (lifecycle.plan_pods): its second create onwards is a recreation."""
    on = owner(body)
    if on is None:
        return None
    kind, meta = str(body.get("kind")), body["metadata"]
    name = meta["name"]
    if kind == "Service":
        return Event(on, "Normal", "ServiceCreated", f"Service {name} created: a broker runs")
    node = (meta.get("labels") or {}).get(naming.LABEL_TARGET_NODE)
    where = f" for node {node}" if node else ""
    creates = retry.creates if retry is not None else 1
    if creates > 1:
        message = (
            f"broker {kind} {name}{where} created again "
            f"({creates} creates since it last ran stably)"
        )
        return Event(on, "Normal", "BrokerRecreated", message)
    return Event(on, "Normal", "BrokerCreated", f"broker {kind} {name} created{where}")


def deleted(kind: str, d: Delete, on: Subject | None) -> Event | None:
    """The Event for an object the controller just deleted, on `on` (its owner; None when
    the owner is gone too, and no one would read it)."""
    if on is None:
        return None
    if kind == "Service":
        return Event(
            on, "Normal", "ServiceDeleted", f"Service {d.name} deleted: no broker of it is left"
        )
    if d.reason in ("Failed", "Succeeded") or d.reason.startswith("Pending"):
        message = f"broker {kind} {d.name} {d.reason}: deleted, to be created again"
        return Event(on, "Warning", "BrokerFailed", message)
    why = "its node left the Instance" if d.reason == "not desired" else d.reason
    return Event(on, "Normal", "BrokerDeleted", f"broker {kind} {d.name} deleted: {why}")


def refused(body: Mapping[str, Any], why: str) -> Event | None:
    """The API server refused to create a broker (admission, quota, an invalid spec)."""
    on = owner(body)
    if on is None:
        return None
    what = _what(str(body.get("kind")), body["metadata"]["name"])
    reason = "ServiceFailed" if body.get("kind") == "Service" else "BrokerFailed"
    return Event(on, "Warning", reason, f"could not create {what}: {why}")


def node_lost(
    node: str,
    why: str,
    instance: Subject,
    slots: Iterable[str],
    left: bool,
) -> Event:
    """On an Instance the lost node's entries were removed from."""
    parts = ["removed from its nodes"] if left else []
    freed = sorted(slots)
    if freed:
        parts.append(f"freed {', '.join(freed)}")
    done = "; ".join(parts) or "its finalizer removed"
    return Event(instance, "Warning", "NodeLost", f"node {node} lost ({why}): {done}")


def instance_deleted(node: str, why: str, configuration: Subject, instance: str) -> Event:
    return Event(
        configuration,
        "Warning",
        "NodeLost",
        f"node {node} lost ({why}): Instance {instance} had no other node and was deleted",
    )


def status_released(node: str, why: str, configuration: Subject) -> Event:
    return Event(
        configuration,
        "Warning",
        "NodeLost",
        f"node {node} lost ({why}): its entry in status.nodes removed",
    )
