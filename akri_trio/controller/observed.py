"""The observed objects the controller's decisions take in, and the deletes they give out.

Pods arrive as the API server's JSON; the decisions need six facts from each, read here once so
lifecycle.py and services.py do not each parse timestamps and labels. A `Delete` carries the uid
it was decided about: the edge sends it as a precondition, so a decision taken on a Pod never
deletes the newer Pod that has meanwhile taken its name.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import attrs

from akri_trio.model import naming


def timestamp(text: str | None) -> float | None:
    """RFC 3339 (as the API server writes it) -> Unix seconds; None stays None."""
    if not text:
        return None
    parsed = dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


@attrs.frozen
class ObservedPod:
    """The facts about a broker Pod that the decisions use."""

    namespace: str
    name: str
    uid: str
    phase: str
    labels: Mapping[str, str] = attrs.field(factory=dict)
    created: float | None = None
    started: float | None = None
    deleting: bool = False
    claims: frozenset[str] = frozenset()  # its spec.resourceClaims' names

    @property
    def target_node(self) -> str | None:
        return self.labels.get(naming.LABEL_TARGET_NODE)

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> ObservedPod:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            uid=meta.get("uid", ""),
            phase=status.get("phase") or "Pending",
            labels=dict(meta.get("labels") or {}),
            created=timestamp(meta.get("creationTimestamp")),
            started=timestamp(status.get("startTime")),
            deleting=meta.get("deletionTimestamp") is not None,
            claims=claim_names(pod),
        )


def claim_names(pod: Mapping[str, Any]) -> frozenset[str]:
    """The names of a Pod's `spec.resourceClaims` (DRA mode's brokers have the `akri` one)."""
    return frozenset(
        str(c.get("name")) for c in (pod.get("spec") or {}).get("resourceClaims") or []
    )


@attrs.frozen
class Delete:
    """Delete this object, only if it is still the one observed (uid precondition)."""

    namespace: str
    name: str
    uid: str
    reason: str = ""
    propagation: str | None = None
    grace_period_seconds: int | None = None  # None: the object's own

    @classmethod
    def of(cls, obj: Mapping[str, Any], reason: str = "", propagation: str | None = None) -> Delete:
        meta = obj["metadata"]
        namespace, uid = meta.get("namespace", ""), meta.get("uid", "")
        return cls(namespace, meta["name"], uid, reason, propagation)

    def options(self) -> dict[str, Any]:
        """The DeleteOptions body."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if self.uid:
            body["preconditions"] = {"uid": self.uid}
        if self.propagation:
            body["propagationPolicy"] = self.propagation
        if self.grace_period_seconds is not None:
            body["gracePeriodSeconds"] = self.grace_period_seconds
        return body
