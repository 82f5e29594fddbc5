"""Kubernetes Events (core/v1) that never hold up the work that records them.

`kubectl describe akric <name>` shows the Events whose `involvedObject` is that Configuration:
the place an operator looks first for "why did nothing happen". Recording one must never slow
or fail the reconcile or the Allocate that noticed something, and a flapping device must not
flood the API server. So, as the kubelet's recorder does:

- `record` only puts the event on a bounded queue; when the queue is full the event is dropped
  and counted (`dropped`), never waited for;
- the same event again (same object, type, reason, message, source) is one Event whose `count`
  and `lastTimestamp` are patched, not a new object;
- each (object, source) pair has a token bucket (a burst of 25, then one per 5 minutes): what
  goes over it is dropped and counted.

`Correlator` makes those decisions from plain data and a time (no I/O; unit-tested);
`EventRecorder` is the shell that writes what it decides.
"""

from __future__ import annotations

import datetime
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import httpx
import trio

from akri_trio.address import Resource
from akri_trio.kube.client import Client
from akri_trio.kube.errors import ApiError, NotFound

__all__ = [
    "EVENTS",
    "Correlator",
    "Create",
    "Drop",
    "EventRecorder",
    "ObjectRef",
    "Patch",
    "Recorded",
]

log = logging.getLogger(__name__)

EVENTS = Resource.core("events", "Event")
EventType = Literal["Normal", "Warning"]
BURST = 25
REFILL_S = 300.0  # one more token per 5 minutes, as the kubelet's spam filter
MAX_KEYS = 4096  # dedup memory, least recently seen forgotten first
QUEUE_SIZE = 256


@attrs.frozen
class ObjectRef:
    """What an Event is about (`involvedObject`). kubectl describe matches on the uid too."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        meta = obj.get("metadata") or {}
        return cls(
            str(obj.get("apiVersion", "")),
            str(obj.get("kind", "")),
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
        )

    def json(self) -> dict[str, str]:
        out = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }
        if self.uid:
            out["uid"] = self.uid
        return out


@attrs.frozen
class Recorded:
    obj: ObjectRef
    type: EventType
    reason: str
    message: str


@attrs.frozen
class Create:
    name: str  # the new Event's name
    count: int


@attrs.frozen
class Patch:
    name: str  # the existing Event to bump
    count: int


@attrs.frozen
class Drop:
    why: Literal["rate-limited"]


@attrs.define
class _Seen:
    name: str
    count: int


@attrs.define
class _Bucket:
    tokens: float
    at: float


class Correlator:
    """Dedup and rate-limit decisions. `decide(event, now)` -> Create | Patch | Drop; after a
    failed write the shell calls `forget(event)` so the next one creates afresh."""

    def __init__(
        self,
        *,
        burst: int = BURST,
        refill_s: float = REFILL_S,
        max_keys: int = MAX_KEYS,
        new_name: Callable[[ObjectRef], str] | None = None,
    ) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self.max_keys = max_keys
        self._new_name = new_name or (lambda ref: f"{ref.name}.{secrets.token_hex(8)}")
        self._seen: OrderedDict[Recorded, _Seen] = OrderedDict()
        self._buckets: OrderedDict[ObjectRef, _Bucket] = OrderedDict()

    def _allow(self, obj: ObjectRef, now: float) -> bool:
        bucket = self._buckets.pop(obj, None) or _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) / self.refill_s)
        bucket.at = now
        self._buckets[obj] = bucket
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def decide(self, event: Recorded, now: float) -> Create | Patch | Drop:
        if not self._allow(event.obj, now):
            return Drop("rate-limited")
        seen = self._seen.pop(event, None)
        if seen is None:
            seen = _Seen(self._new_name(event.obj), 0)
            decision: Create | Patch = Create(seen.name, 1)
        else:
            decision = Patch(seen.name, seen.count + 1)
        seen.count += 1
        self._seen[event] = seen
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        return decision

    def forget(self, event: Recorded) -> None:
        self._seen.pop(event, None)

    def restart(self, event: Recorded) -> Create:
        """The Event to bump is gone (Events expire): a new one, counting from 1."""
        seen = _Seen(self._new_name(event.obj), 1)
        self._seen.pop(event, None)
        self._seen[event] = seen
        return Create(seen.name, 1)


def _timestamp(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    event: Recorded, name: str, *, component: str, host: str, first: str, last: str, count: int
) -> dict[str, Any]:
    """The core/v1 Event object, as the kubelet writes one (what `kubectl describe` lists)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": event.obj.namespace or "default"},
        "involvedObject": event.obj.json(),
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": component, "host": host} if host else {"component": component},
        "reportingComponent": component,
        "reportingInstance": host or component,
        "firstTimestamp": first,
        "lastTimestamp": last,
        "count": count,
    }


class EventRecorder:
    """`record(...)` from anywhere in trio code, at no cost to the caller; `run` (a task in the
    component's nursery) writes them. Without `run`, events pile up to the queue's size and then
    are dropped: the work goes on regardless."""

    def __init__(
        self,
        api: Client,
        component: str,
        host: str = "",
        *,
        queue_size: int = QUEUE_SIZE,
        correlator: Correlator | None = None,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.api = api
        self.component = component
        self.host = host
        self.correlator = correlator or Correlator()
        self._send, self._receive = trio.open_memory_channel[Recorded](queue_size)
        self._wall = wall or (lambda: datetime.datetime.now(datetime.UTC).timestamp())
        self.dropped = 0  # queue full or rate-limited
        self.failed = 0  # the API server refused or could not be reached

    def record(
        self, obj: ObjectRef | Mapping[str, Any], type: EventType, reason: str, message: str
    ) -> None:
        ref = obj if isinstance(obj, ObjectRef) else ObjectRef.of(obj)
        try:
            self._send.send_nowait(Recorded(ref, type, reason, message[:1024]))
        except trio.WouldBlock:
            self.dropped += 1

    def normal(self, obj: ObjectRef | Mapping[str, Any], reason: str, message: str) -> None:
        self.record(obj, "Normal", reason, message)

    def warning(self, obj: ObjectRef | Mapping[str, Any], reason: str, message: str) -> None:
        self.record(obj, "Warning", reason, message)

    async def run(self) -> None:
        async for event in self._receive:
            decision = self.correlator.decide(event, trio.current_time())
            if isinstance(decision, Drop):
                self.dropped += 1
                continue
            # No deadline of our own: the client's write timeout outlasts the API server's, so
            # an Event is never abandoned half-written (the server may still create it, and
            # the correlator, having forgotten it, would create a second one).
            try:
                await self._write(event, decision)
            except (ApiError, httpx.HTTPError) as exc:
                self.failed += 1
                self.correlator.forget(event)
                log.debug("could not record event %s on %s: %s", event.reason, event.obj, exc)

    async def _write(self, event: Recorded, decision: Create | Patch) -> None:
        now = _timestamp(self._wall())
        namespace = event.obj.namespace or "default"
        if isinstance(decision, Patch):
            try:
                await self.api.merge_patch(
                    EVENTS,
                    decision.name,
                    {"count": decision.count, "lastTimestamp": now},
                    namespace=namespace,
                )
                return
            except NotFound:  # expired (Events live an hour) or deleted: start again
                decision = self.correlator.restart(event)
        body = event_body(
            event,
            decision.name,
            component=self.component,
            host=self.host,
            first=now,
            last=now,
            count=decision.count,
        )
        await self.api.create(EVENTS, body, namespace=namespace)
