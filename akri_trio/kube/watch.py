"""List-then-watch, as an explicit state machine (pure) plus a small trio driver (I/O).

A watch is the only way the agent and the controller learn about the world, and its failure
modes are subtle: the server ends every watch after `timeoutSeconds`; the resourceVersion we
resume from can be compacted away (`410 Gone`, as an HTTP answer or as an ERROR event inside a
200 stream); a continue token can expire mid-list. Getting any of these wrong loses objects
silently. So the logic is a sans-IO machine (after kube-rs's `watcher`), tested exhaustively
without a server, and the driver only moves requests and answers between it and httpx.

    EMPTY --list page--> LISTING --last page--> WATCHING --events/bookmarks--> WATCHING
      ^                                            |
      +------------- 410 Gone (anywhere) ----------+

Events out (kube-rs style): a (re)list is `Init`, one `InitApply` per object, `InitDone`, so a
cache builds the new world aside and swaps it in at once (objects deleted while we were away
simply are not in it); after that `Apply`/`Delete` per change. Bookmarks only move the resume
point. Nothing is ever emitted for a half-finished list except the buffered `InitApply`s, which
the next `Init` discards.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from akri_trio.kube.client import DEFAULT_PAGE_SIZE, JSON, Client, Resource
from akri_trio.kube.errors import ApiError, Gone, TooManyRequests, error_from_status
from akri_trio.runtime import Backoff

log = logging.getLogger(__name__)


# --- events out ------------------------------------------------------------------------------


@attrs.frozen
class Init:
    """A (re)list starts: buffer the `InitApply`s that follow."""


@attrs.frozen
class InitApply:
    obj: JSON


@attrs.frozen
class InitDone:
    """The relist is complete: the buffer is now the whole truth."""


@attrs.frozen
class Apply:
    obj: JSON


@attrs.frozen
class Delete:
    obj: JSON


WatchEvent = Init | InitApply | InitDone | Apply | Delete


# --- what the machine asks the driver to do --------------------------------------------------


@attrs.frozen
class ListRequest:
    """Fetch a page: the first one (`continue_token=None`, at the latest resourceVersion) or the
    next one of the current list."""

    continue_token: str | None


@attrs.frozen
class WatchRequest:
    resource_version: str


class Phase(enum.Enum):
    EMPTY = "empty"
    LISTING = "listing"
    WATCHING = "watching"


class WatchProtocolError(Exception):
    """The server (or the driver) broke the protocol: e.g. an unknown event type."""


@attrs.define
class WatchMachine:
    """The sans-IO watcher. Feed it list pages and raw watch events; it says what to request
    next (`next_request`) and what happened (the returned `WatchEvent`s)."""

    phase: Phase = Phase.EMPTY
    resource_version: str | None = None
    continue_token: str | None = None

    def next_request(self) -> ListRequest | WatchRequest:
        if self.phase is Phase.WATCHING:
            assert self.resource_version is not None
            return WatchRequest(self.resource_version)
        return ListRequest(self.continue_token if self.phase is Phase.LISTING else None)

    def on_page(
        self, items: Sequence[JSON], resource_version: str, continue_token: str | None
    ) -> list[WatchEvent]:
        """A list page arrived (for the request `next_request` gave)."""
        if self.phase is Phase.WATCHING:
            raise WatchProtocolError("list page while watching")
        out: list[WatchEvent] = [Init()] if self.phase is Phase.EMPTY else []
        out.extend(InitApply(obj) for obj in items)
        if continue_token:
            self.phase = Phase.LISTING
            self.continue_token = continue_token
        else:
            if not resource_version:
                raise WatchProtocolError("last list page without a resourceVersion")
            self.phase = Phase.WATCHING
            self.continue_token = None
            self.resource_version = resource_version
            out.append(InitDone())
        return out

    def on_event(self, raw: Mapping[str, Any]) -> list[WatchEvent]:
        """One decoded line of the watch stream.

        An ERROR event raises its typed `ApiError`; for a 410 the machine has already gone
        back to EMPTY, so the driver just asks `next_request` again.
        """
        if self.phase is not Phase.WATCHING:
            raise WatchProtocolError(f"watch event while {self.phase.value}")
        kind = raw.get("type")
        obj = raw.get("object")
        if not isinstance(obj, dict):
            raise WatchProtocolError(f"watch event {kind!r} without an object")
        if kind == "ERROR":
            error = error_from_status(obj)
            if isinstance(error, Gone):
                self.on_gone()
            raise error
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            raise WatchProtocolError(f"unknown watch event type {kind!r}")
        if not rv:
            raise WatchProtocolError(f"{kind} event without metadata.resourceVersion")
        self.resource_version = str(rv)
        if kind == "BOOKMARK":
            return []
        return [Delete(obj) if kind == "DELETED" else Apply(obj)]

    def on_gone(self) -> None:
        """410 from a list (expired continue token) or a watch: start over with a fresh list."""
        self.phase = Phase.EMPTY
        self.continue_token = None
        self.resource_version = None


# --- the driver ------------------------------------------------------------------------------

# A watch that ends cleanly faster than this without delivering anything counts as a failure,
# so a server that accepts and immediately closes cannot make us spin.
_MIN_HEALTHY_WATCH = 1.0

WATCH_BACKOFF = Backoff(base=0.5, cap=30.0)


async def run_watch(
    client: Client,
    res: Resource,
    send: trio.MemorySendChannel[WatchEvent],
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    timeout_seconds: int = 290,
    backoff: Backoff = WATCH_BACKOFF,
    rand: Callable[[], float] = random.random,
) -> None:
    """Keep `send` fed with the events of `res`, forever; closes `send` when it returns.

    Errors (network, 5xx, 403...) are logged and retried with capped, jittered backoff from
    where we were; `410 Gone` relists. The server-side `timeoutSeconds` is jittered down by up
    to 10% so a fleet of agents does not reconnect in lockstep. Cancel to stop: the open HTTP
    stream is closed as the cancellation unwinds.
    """
    machine = WatchMachine()
    failures = 0
    gones = 0
    async with send:
        while True:
            request = machine.next_request()
            try:
                if isinstance(request, ListRequest):
                    page = await client.list_page(
                        res,
                        namespace=namespace,
                        label_selector=label_selector,
                        field_selector=field_selector,
                        limit=page_size,
                        continue_token=request.continue_token,
                    )
                    for event in machine.on_page(
                        page.items, page.resource_version, page.continue_token
                    ):
                        await send.send(event)
                    failures = 0
                    gones = 0
                else:
                    started = trio.current_time()
                    delivered = await _watch_once(
                        client,
                        res,
                        machine,
                        send,
                        request.resource_version,
                        namespace=namespace,
                        label_selector=label_selector,
                        field_selector=field_selector,
                        timeout_seconds=max(1, int(timeout_seconds * (1 - 0.1 * rand()))),
                    )
                    if delivered or trio.current_time() - started >= _MIN_HEALTHY_WATCH:
                        failures = 0
                        gones = 0
                        continue
                    raise WatchProtocolError("watch ended at once without any event")
            except Gone:
                machine.on_gone()
                log.info("watch %s: resourceVersion too old, relisting", res.plural)
                gones += 1
                if gones > 1:  # a relist that is itself Gone: do not spin
                    await trio.sleep(backoff.delay(gones - 2, rand))
            except (ApiError, httpx.HTTPError, WatchProtocolError, ValueError) as exc:
                if machine.next_request() != request:
                    failures = 0  # the stream made progress before failing: not a streak
                delay = backoff.delay(failures, rand)
                if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
                    delay = max(delay, exc.retry_after)  # the server knows its load best
                failures += 1
                log.warning(
                    "watch %s: %s: %s; retrying in %.1fs",
                    res.plural,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await trio.sleep(delay)


async def _watch_once(
    client: Client,
    res: Resource,
    machine: WatchMachine,
    send: trio.MemorySendChannel[WatchEvent],
    resource_version: str,
    *,
    namespace: str | None,
    label_selector: str | None,
    field_selector: str | None,
    timeout_seconds: int,
) -> bool:
    """One watch request until the server ends it; whether any line (bookmarks too) arrived."""
    delivered = False
    async with client.watch_stream(
        res,
        resource_version=resource_version,
        namespace=namespace,
        label_selector=label_selector,
        field_selector=field_selector,
        timeout_seconds=timeout_seconds,
    ) as raw_events:
        async for raw in raw_events:
            delivered = True
            for event in machine.on_event(raw):
                await send.send(event)
    return delivered


@asynccontextmanager
async def open_watch(
    client: Client,
    res: Resource,
    *,
    buffer: int = 64,
    namespace: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    timeout_seconds: int = 290,
    backoff: Backoff = WATCH_BACKOFF,
) -> AsyncIterator[trio.MemoryReceiveChannel[WatchEvent]]:
    """`async with open_watch(client, res) as events: async for event in events: ...`

    The watch runs in a nursery of its own for the duration of the block; leaving the block
    cancels it and closes its connection.
    """
    send, receive = trio.open_memory_channel[WatchEvent](buffer)
    # The receiver closes only after the watch task is gone, so it never sees a broken channel.
    async with receive, trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: run_watch(
                client,
                res,
                send,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                page_size=page_size,
                timeout_seconds=timeout_seconds,
                backoff=backoff,
            )
        )
        try:
            yield receive
        finally:
            nursery.cancel_scope.cancel()
