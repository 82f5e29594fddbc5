"""The agent's list of registered discovery handlers and their connectivity: a pure state machine.

Handlers register by name and endpoint (several may share a name: two udev handlers on two
sockets); Configurations stream from every endpoint under their handler's name. The agent
needs to know, per endpoint, whether it is Waiting (registered, unused), Active (some
Configuration's Discover stream is open) or Offline since T (unreachable, or its stream was
lost), and to forget endpoints offline for more than 5 minutes (upstream's documented rule).

No I/O and no trio: time comes from an injected clock, and changes are announced to
synchronous listeners, so the I/O shells (registration server, per-Configuration discovery)
decide how to wake up. Endpoints past their grace period are pruned on every query, and
`next_expiry()` tells a shell when to call `expire()` so removals are announced on time.

Decisions: re-registering an endpoint replaces its registration but keeps its open streams
(the handler is alive, so it is no longer Offline); releasing the last stream of an Offline
endpoint leaves it Offline (a dead handler must not look healthy); embedded handlers are never
removed (nothing could register them again).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Literal

import attrs

from akri_trio.discovery.interface import AnyHandler

OFFLINE_GRACE_S = 300.0


class EndpointType(enum.Enum):
    UDS = "UDS"
    NETWORK = "NETWORK"
    EMBEDDED = "EMBEDDED"


@attrs.frozen
class Registration:
    """One registered endpoint. `handler` is set for embedded handlers only."""

    name: str
    endpoint: str
    endpoint_type: EndpointType
    shared: bool
    handler: AnyHandler | None = attrs.field(default=None, eq=False, repr=False)


def embedded(handler: AnyHandler) -> Registration:
    """The registration of an in-process handler (upstream's uid `embedded-<name>`)."""
    return Registration(
        handler.name, f"embedded-{handler.name}", EndpointType.EMBEDDED, handler.shared, handler
    )


@attrs.frozen
class Waiting:
    pass


@attrs.frozen
class Active:
    pass


@attrs.frozen
class Offline:
    since: float


HandlerStatus = Waiting | Active | Offline
WAITING = Waiting()
ACTIVE = Active()


@attrs.frozen
class RegistryEvent:
    """What changed: an endpoint was (re-)registered, removed, or its status changed."""

    kind: Literal["registered", "removed", "status"]
    name: str
    endpoint: str


Listener = Callable[[RegistryEvent], None]


@attrs.define
class _Entry:
    registration: Registration
    streams: set[str] = attrs.field(factory=set)  # users (Configuration keys) with a stream open
    offline_since: float | None = None

    @property
    def status(self) -> HandlerStatus:
        if self.offline_since is not None:
            return Offline(self.offline_since)
        return ACTIVE if self.streams else WAITING


class Registry:
    """Registered handlers: name -> endpoint -> registration and status."""

    def __init__(self, clock: Callable[[], float], offline_grace: float = OFFLINE_GRACE_S) -> None:
        self._clock = clock
        self._grace = offline_grace
        self._entries: dict[str, dict[str, _Entry]] = {}
        self._listeners: list[Listener] = []

    # ---- listeners ----------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after every change; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _emit(self, kind: Literal["registered", "removed", "status"], name: str, ep: str) -> None:
        event = RegistryEvent(kind, name, ep)
        for listener in list(self._listeners):
            listener(event)

    # ---- registration -------------------------------------------------------------------------

    def register(self, registration: Registration) -> None:
        """Add or replace the registration of (name, endpoint)."""
        self.expire()
        endpoints = self._entries.setdefault(registration.name, {})
        entry = endpoints.get(registration.endpoint)
        if entry is None:
            endpoints[registration.endpoint] = _Entry(registration)
        else:
            entry.registration = registration
            entry.offline_since = None  # it just spoke to us
        self._emit("registered", registration.name, registration.endpoint)

    # ---- queries (prune first) ----------------------------------------------------------------

    def registrations(self, name: str) -> list[Registration]:
        """The endpoints registered under `name`, in endpoint order."""
        self.expire()
        endpoints = self._entries.get(name, {})
        return [endpoints[ep].registration for ep in sorted(endpoints)]

    def get(self, name: str) -> dict[str, HandlerStatus]:
        """endpoint -> status for every endpoint under `name` (empty if none)."""
        self.expire()
        endpoints = self._entries.get(name, {})
        return {ep: endpoints[ep].status for ep in sorted(endpoints)}

    def status(self, name: str, endpoint: str) -> HandlerStatus | None:
        return self.get(name).get(endpoint)

    def names(self) -> list[str]:
        self.expire()
        return sorted(self._entries)

    def snapshot(self) -> dict[str, dict[str, HandlerStatus]]:
        """Everything, for status pages: name -> endpoint -> status."""
        self.expire()
        return {name: self.get(name) for name in sorted(self._entries)}

    # ---- stream bookkeeping (the per-Configuration discovery calls these) ---------------------

    def stream_opened(self, name: str, endpoint: str, user: str) -> None:
        """`user`'s Discover stream to this endpoint is open: Active."""
        entry = self._entry(name, endpoint)
        if entry is None:
            return
        before = entry.status
        entry.streams.add(user)
        entry.offline_since = None
        self._changed(entry, before)

    def stream_closed(self, name: str, endpoint: str, user: str) -> None:
        """`user` closed its stream on purpose (Configuration gone or changed, or the handler
        rejected its details): Waiting once nobody streams, unless already Offline."""
        entry = self._entry(name, endpoint)
        if entry is None:
            return
        before = entry.status
        entry.streams.discard(user)
        self._changed(entry, before)

    def stream_lost(self, name: str, endpoint: str, user: str) -> None:
        """`user` could not connect, or its stream broke or ended: Offline from now, unless
        another user's stream is still open (then the handler is evidently alive)."""
        entry = self._entry(name, endpoint)
        if entry is None:
            return
        before = entry.status
        entry.streams.discard(user)
        if not entry.streams and entry.offline_since is None:
            entry.offline_since = self._clock()
        self._changed(entry, before)

    def _entry(self, name: str, endpoint: str) -> _Entry | None:
        self.expire()
        return self._entries.get(name, {}).get(endpoint)

    def _changed(self, entry: _Entry, before: HandlerStatus) -> None:
        if entry.status != before:
            self._emit("status", entry.registration.name, entry.registration.endpoint)

    # ---- expiry -------------------------------------------------------------------------------

    def _expires_at(self, entry: _Entry) -> float | None:
        if entry.offline_since is None or entry.registration.endpoint_type is EndpointType.EMBEDDED:
            return None
        return entry.offline_since + self._grace

    def next_expiry(self) -> float | None:
        """When the next Offline endpoint is due for removal (clock time), if any."""
        times = [
            t
            for endpoints in self._entries.values()
            for entry in endpoints.values()
            if (t := self._expires_at(entry)) is not None
        ]
        return min(times, default=None)

    def expire(self) -> list[Registration]:
        """Remove endpoints offline for more than the grace period; returns them."""
        now = self._clock()
        removed: list[Registration] = []
        for name in list(self._entries):
            endpoints = self._entries[name]
            for ep in list(endpoints):
                due = self._expires_at(endpoints[ep])
                if due is not None and now >= due:
                    removed.append(endpoints.pop(ep).registration)
            if not endpoints:
                del self._entries[name]
        for registration in removed:
            self._emit("removed", registration.name, registration.endpoint)
        return removed

    def __repr__(self) -> str:
        summary: dict[str, Any] = {
            name: {ep: entry.status for ep, entry in eps.items()}
            for name, eps in self._entries.items()
        }
        return f"Registry({summary})"
