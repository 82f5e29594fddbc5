"""Leader election on a coordination.k8s.io/v1 Lease, as a pure state machine (sans-IO).

Two controller replicas must never write brokers at the same time, and a standby must take
over soon after the leader dies. The rules, as functions of (the Lease as last read, the local
clock, who we are, what we saw before):

- no Lease: create it, holding it;
- held by us: renew (a new renewTime, written with the read resourceVersion);
- free (no holder, e.g. released by a leader that shut down): take it;
- held by someone else: take it once it has not changed for `leaseDurationSeconds`, measured
  on OUR clock, else wait. Clocks of two machines are never compared: the holder's renewTime
  is only written, never read for a decision.

"Has not changed since" is the time of the last look that still saw the previous version (the
change happened after that look). A candidate looking every RETRY_S therefore takes over at
most `duration` after the holder's last renewal, not `duration + RETRY_S` as it would if it
counted from when it noticed the change. This is safe because the holder gives up
RENEW_DEADLINE_S after a renewal it sent when it cannot renew again, and RENEW_DEADLINE_S +
RETRY_S stays inside the lease duration; a look that comes more than `trust_gap` after the
previous one counts from now instead, so a slow API server only delays a takeover.

The edge (leader_elector.py) reads and writes the Lease and sleeps; everything it decides is here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final

import attrs

LEASE_DURATION_S: Final = 15.0
RENEW_PERIOD_S: Final = 5.0  # the holder renews this often
RENEW_DEADLINE_S: Final = 10.0  # the holder steps down this long after its last renewal
RETRY_S: Final = 2.0  # a candidate looks at the Lease this often
TRUST_GAP_S: Final = 3.0  # looks further apart than this do not date a change

JSON = dict[str, Any]


def micro_time(wall: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC) for Unix seconds `wall`."""
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@attrs.frozen
class LeaseView:
    """What a decision uses from a Lease."""

    holder: str
    duration: float
    transitions: int
    resource_version: str

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaseView:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration=float(spec.get("leaseDurationSeconds") or LEASE_DURATION_S),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )


@attrs.frozen
class Seen:
    """A candidate's memory between looks: the version it saw, since when (its clock) it has
    been unchanged, and when it last looked."""

    version: str | None = None
    since: float = 0.0
    looked: float = 0.0


@attrs.frozen
class Create:
    """POST this Lease (we become the holder)."""

    body: JSON


@attrs.frozen
class Update:
    """PUT this Lease (it carries the read resourceVersion); `acquire` False is a renewal."""

    body: JSON
    acquire: bool


@attrs.frozen
class Wait:
    """Someone else holds it; look again at `until` (our clock) at the latest."""

    until: float
    holder: str


Decision = Create | Update | Wait


def lease_body(
    name: str, namespace: str, holder: str, wall: float, duration: float, transitions: int
) -> JSON:
    """A new Lease held by `holder` (acquired now)."""
    now = micro_time(wall)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": int(duration),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": transitions,
        },
    }


def _with_spec(lease: Mapping[str, Any], **spec: Any) -> JSON:
    meta = lease.get("metadata") or {}
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {**(lease.get("spec") or {}), **spec},
    }


def renewal(lease: Mapping[str, Any], wall: float) -> JSON:
    """The holder's renewal of `lease` (as it last wrote or read it)."""
    return _with_spec(lease, renewTime=micro_time(wall))


def release(lease: Mapping[str, Any], wall: float) -> JSON:
    """A leader shutting down hands the Lease back: no holder, so a candidate takes it at its
    next look instead of waiting out the duration."""
    return _with_spec(
        lease, holderIdentity=None, renewTime=micro_time(wall), leaseDurationSeconds=1
    )


def decide(
    lease: Mapping[str, Any] | None,
    me: str,
    now: float,
    wall: float,
    seen: Seen,
    *,
    name: str,
    namespace: str,
    duration: float = LEASE_DURATION_S,
    trust_gap: float = TRUST_GAP_S,
) -> tuple[Decision, Seen]:
    """What a candidate (or the holder) does after reading `lease` (None: not found). `now` is
    the local monotonic clock, `wall` Unix seconds for the timestamps written."""
    if lease is None:
        return Create(lease_body(name, namespace, me, wall, duration, 0)), Seen(None, now, now)
    view = LeaseView.of(lease)
    if view.resource_version != seen.version:
        dated = seen.version is not None and now - seen.looked <= trust_gap
        seen = Seen(view.resource_version, seen.looked if dated else now, now)
    else:
        seen = attrs.evolve(seen, looked=now)
    if view.holder == me:
        return Update(renewal(lease, wall), acquire=False), seen
    expires = seen.since + view.duration
    if view.holder and now < expires:
        return Wait(expires, view.holder), seen
    taken = micro_time(wall)
    body = _with_spec(
        lease,
        holderIdentity=me,
        leaseDurationSeconds=int(duration),
        acquireTime=taken,
        renewTime=taken,
        leaseTransitions=view.transitions + 1,
    )
    return Update(body, acquire=True), seen


def holding(renewed_at: float, now: float, deadline: float = RENEW_DEADLINE_S) -> bool:
    """Is the holder still entitled to act? `renewed_at` is when it SENT its last successful
    renewal (local clock): the server may have stamped it later, never earlier."""
    return now < renewed_at + deadline
