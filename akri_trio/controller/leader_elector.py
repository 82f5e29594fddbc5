"""The leader-election edge: reads and writes the Lease, sleeps, and runs the work while leading.

    LeaderElector.run(work)
    ├── candidate: look at the Lease every RETRY_S (lease_rules.decide), until it is ours
    └── leading: one nursery
        ├── work()                     the reconcilers (cancelled when leadership ends)
        └── renew every RENEW_PERIOD_S, give up RENEW_DEADLINE_S after the last success

Losing the Lease (a renewal refused because someone else wrote it, or no renewal got through
before the deadline) cancels the work's nursery at once and goes back to being a candidate, so
a deposed leader stops writing before anyone else may start. On shutdown the leader hands the
Lease back (a bounded, shielded write) so a standby takes over at its next look rather than
after the lease duration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import httpx
import trio

from akri_trio.controller import lease_rules
from akri_trio.kube import AlreadyExists, ApiError, Client, Conflict, NotFound, Resource

log = logging.getLogger(__name__)

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
RELEASE_BOUND_S = 2.0  # the hand-back on shutdown may not hold up the exit longer than this

JSON = dict[str, Any]


class LeaseApi(Protocol):
    """The three verbs on one Lease the elector needs (a Client, or a stand-in in unit tests)."""

    async def get(self) -> JSON | None: ...
    async def create(self, body: JSON) -> JSON: ...
    async def replace(self, body: JSON) -> JSON: ...


@attrs.frozen
class ClientLeaseApi:
    client: Client
    name: str
    namespace: str

    async def get(self) -> JSON | None:
        try:
            return await self.client.get(LEASES, self.name, namespace=self.namespace)
        except NotFound:
            return None

    async def create(self, body: JSON) -> JSON:
        return await self.client.create(LEASES, body, namespace=self.namespace)

    async def replace(self, body: JSON) -> JSON:
        return await self.client.replace(LEASES, body, namespace=self.namespace)


# What a failed Lease request may raise besides the typed API errors: the API server is away.
TRANSIENT = (ApiError, httpx.HTTPError, OSError)


@attrs.define
class LeaderElector:
    api: LeaseApi
    identity: str
    name: str = "akri-controller"
    namespace: str = "akri"
    duration: float = lease_rules.LEASE_DURATION_S
    renew_period: float = lease_rules.RENEW_PERIOD_S
    renew_deadline: float = lease_rules.RENEW_DEADLINE_S
    retry: float = lease_rules.RETRY_S
    wall: Callable[[], float] = time.time
    on_change: Callable[[bool], None] = lambda leading: None
    leading: bool = False
    last_contact: float | None = None  # trio time of the last answer from the API server
    # The Lease as we last wrote it, while we hold it, and when that write was sent.
    _lease: JSON | None = attrs.field(default=None, init=False)
    _renewed_at: float = attrs.field(default=0.0, init=False)

    async def run(self, work: Callable[[], Awaitable[None]]) -> None:
        """Forever: be a candidate, lead (running `work`) until the Lease is lost, repeat."""
        try:
            while True:
                await self._acquire()
                self._set_leading(True)
                log.info("%s leads (lease %s/%s)", self.identity, self.namespace, self.name)
                try:
                    async with trio.open_nursery() as leading:
                        leading.start_soon(work)
                        await self._renew_until_lost()
                        leading.cancel_scope.cancel()
                finally:
                    self._set_leading(False)
                log.warning("%s lost the lease: reconcilers stopped", self.identity)
        finally:
            if self._lease is not None:
                with trio.move_on_after(RELEASE_BOUND_S, shield=True):
                    await self._release()

    def _set_leading(self, leading: bool) -> None:
        self.leading = leading
        self.on_change(leading)

    async def _acquire(self) -> None:
        seen = lease_rules.Seen()
        while True:
            try:
                current = await self.api.get()
            except TRANSIENT as exc:
                log.warning("reading lease %s/%s failed: %s", self.namespace, self.name, exc)
                await trio.sleep(self.retry)
                continue
            self.last_contact = trio.current_time()
            now = trio.current_time()
            decision, seen = lease_rules.decide(
                current,
                self.identity,
                now,
                self.wall(),
                seen,
                name=self.name,
                namespace=self.namespace,
                duration=self.duration,
            )
            match decision:
                case lease_rules.Wait(until, holder):
                    log.debug("lease held by %s; next look by %.1f s", holder, until - now)
                    await trio.sleep_until(min(until, now + self.retry))
                    continue
                case lease_rules.Create(body):
                    write = self.api.create
                case lease_rules.Update(body):
                    write = self.api.replace
            sent = trio.current_time()
            try:
                self._lease = await write(body)
            except (Conflict, AlreadyExists):
                continue  # someone else wrote first: read again at once
            except TRANSIENT as exc:
                log.warning("taking lease %s/%s failed: %s", self.namespace, self.name, exc)
                await trio.sleep(self.retry)
                continue
            self._renewed_at = sent
            self.last_contact = trio.current_time()
            return

    async def _renew_until_lost(self) -> None:
        """Returns when leadership is over: the Lease is someone else's, or no renewal got
        through within the renew deadline of the last one that did."""
        while True:
            await trio.sleep_until(self._renewed_at + self.renew_period)
            with trio.move_on_at(self._renewed_at + self.renew_deadline):
                while True:
                    assert self._lease is not None
                    sent = trio.current_time()
                    try:
                        self._lease = await self.api.replace(
                            lease_rules.renewal(self._lease, self.wall())
                        )
                    except Conflict:
                        log.warning("lease %s/%s was taken over", self.namespace, self.name)
                        self._lease = None
                        return
                    except TRANSIENT as exc:
                        log.warning("renewing lease failed: %s", exc)
                        await trio.sleep(min(self.retry, self.renew_period))
                        continue
                    self._renewed_at = sent
                    self.last_contact = trio.current_time()
                    break
            if not lease_rules.holding(self._renewed_at, trio.current_time(), self.renew_deadline):
                log.warning("no lease renewal for %.0f s: stepping down", self.renew_deadline)
                self._lease = None
                return

    async def _release(self) -> None:
        assert self._lease is not None
        try:
            await self.api.replace(lease_rules.release(self._lease, self.wall()))
            log.info("released lease %s/%s", self.namespace, self.name)
        except TRANSIENT as exc:
            log.warning("releasing lease failed (it expires on its own): %s", exc)
        finally:
            self._lease = None
