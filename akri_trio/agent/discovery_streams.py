"""Discovery for one Configuration: a Discover stream to every endpoint of its handler.

A Configuration names a handler (`discoveryHandler.name`); every endpoint registered under
that name on this node (embedded, Unix socket or network; including endpoints that register
later) gets one Discover stream for this Configuration. Each message on a stream is that
endpoint's full device list and replaces its previous one. Each list is checked first
(discovery.device_rules: a device that fails is dropped with a reason for the status); the lists
are then merged (first endpoint wins a duplicated id), cut to the per-Configuration cap, and each
device carries its endpoint's `shared` flag. A message's `problems` (our extension of the
protocol) replace that endpoint's lines for the Configuration's status, bounded like the status.

A stream that ends or fails drops its endpoint's devices at once and marks it Offline; we
reconnect with backoff while it stays registered (a re-registration retries at once). An
InvalidArgument answer means the Configuration's discoveryDetails are wrong: the handler's
message becomes a problem for the Configuration's status and we do not ask that endpoint
again until it re-registers (a changed Configuration restarts this task anyway).

`run_configuration_discovery` is a task for the caller's nursery (`nursery.start`): it reports
a `DiscoveryResult` every time devices, problems or handler statuses change, and it is
cancelled when the Configuration is deleted or changed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Final, Literal

import attrs
import purerpc
import trio

from akri_trio.agent.status import bounded_lines
from akri_trio.discovery.device_rules import DeviceRules, check_devices
from akri_trio.discovery.host_critical import host_check
from akri_trio.discovery.interface import InvalidDetails, discover_changes
from akri_trio.discovery.registry import (
    EndpointType,
    HandlerStatus,
    Offline,
    Registration,
    Registry,
    RegistryEvent,
)
from akri_trio.discovery.wire import request_to_proto, response_from_proto
from akri_trio.model.device import Device
from akri_trio.rpc.gen.discovery_grpc import DiscoveryHandlerStub
from akri_trio.rpc.uds import open_channel
from akri_trio.runtime import Backoff, Changed, TaskSet
from akri_trio.runtime.logs import fields

log = logging.getLogger(__name__)

RECONNECT_BACKOFF: Final = Backoff(base=1.0, cap=30.0)
# A list longer than this is decoded and checked in a worker thread: a handler's 20,000 devices
# take half a second of CPU, which on the event loop would stall every other task (the kubelet's
# Allocate among them); from a thread, the loop still gets the interpreter every few
# milliseconds (the GIL's switch interval).
INLINE_DEVICES: Final = 256
# Turns one message of a handler into its devices (decoding is part of the cost of a list).
Decode = Callable[[], list[Device]]
# Takes in one message of a handler: its devices (decoded when needed), how many, its problems.
Accept = Callable[[Decode, int, list[str]], Awaitable[None]]


@attrs.frozen
class DiscoveryRequest:
    """What to discover for one Configuration. `key` is the Configuration's key (its
    namespace/name): it identifies this Configuration's streams in the registry."""

    key: str
    handler: str
    details: str = ""
    # Values may be resolved Secrets: a repr (a log line, a traceback) names the keys only.
    properties: Mapping[str, bytes | None] = attrs.field(
        factory=dict, repr=lambda props: f"<{len(props)} properties: {', '.join(sorted(props))}>"
    )


@attrs.frozen
class DiscoveredDevice:
    device: Device
    shared: bool
    endpoint: str


@attrs.frozen
class DiscoveryResult:
    """Merged devices (sorted by id), problems for the Configuration's status, and the status
    of every endpoint registered under the handler's name."""

    devices: tuple[DiscoveredDevice, ...]
    problems: tuple[str, ...]
    handlers: Mapping[str, HandlerStatus]
    # Registered endpoints that have not answered yet (no list, not invalid, not Offline):
    # until they do, `devices` may be missing theirs.
    pending: tuple[str, ...] = ()
    # The problems (a subset of `problems`) that are handlers rejecting discoveryDetails.
    invalid: tuple[str, ...] = ()
    # Devices dropped (device_rules) or cut by the per-Configuration cap, one line each.
    refused: tuple[str, ...] = ()
    # What the handlers say they cannot discover (DiscoverResponse.problems), "endpoint: line".
    handler_problems: tuple[str, ...] = ()


def merge(
    lists: Mapping[str, list[Device]], registrations: Mapping[str, Registration]
) -> tuple[DiscoveredDevice, ...]:
    """Merge per-endpoint lists: dedup by id (the first endpoint in sorted order wins)."""
    seen: dict[str, DiscoveredDevice] = {}
    for endpoint in sorted(lists):
        registration = registrations.get(endpoint)
        if registration is None:
            continue
        for device in lists[endpoint]:
            if device.id not in seen:
                seen[device.id] = DiscoveredDevice(device, registration.shared, endpoint)
    return tuple(seen[i] for i in sorted(seen))


Outcome = Literal["lost", "invalid"]


def _message(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    if isinstance(exc, purerpc.RpcFailedError):
        return str(exc.status.status_message)
    return str(exc)


class _Discovery:
    def __init__(
        self,
        registry: Registry,
        request: DiscoveryRequest,
        backoff: Backoff,
        rules: DeviceRules,
    ) -> None:
        self.registry = registry
        self.request = request
        self.backoff = backoff
        self.rules = rules
        self.lists: dict[str, list[Device]] = {}
        self.refused: dict[str, list[str]] = {}  # endpoint -> devices dropped from its list
        self.reported: dict[str, list[str]] = {}  # endpoint -> its problems, bounded
        self.invalid: dict[str, str] = {}  # endpoint -> the handler's InvalidArgument message
        # Bumped by a re-registration of the endpoint: it is alive, skip the backoff.
        self.retry_now: dict[str, Changed] = {}
        self.wake = Changed()

    # ---- the registry's news ------------------------------------------------------------------

    def on_registry_event(self, event: RegistryEvent) -> None:
        if event.name != self.request.handler:
            return
        if event.kind == "registered" and event.endpoint in self.retry_now:
            self.retry_now[event.endpoint].bump()
        self.wake.bump()

    async def sync_endpoints(self, tasks: TaskSet[str]) -> None:
        """Start a stream task for each newly registered endpoint; stop removed ones."""
        current = {r.endpoint: r for r in self.registry.registrations(self.request.handler)}
        gone = [endpoint for endpoint in tasks if endpoint not in current]
        await tasks.drop(*gone)
        for endpoint in gone:
            self.lists.pop(endpoint, None)
            self.refused.pop(endpoint, None)
            self.reported.pop(endpoint, None)
            self.invalid.pop(endpoint, None)
            self.retry_now.pop(endpoint, None)
        for endpoint in current:
            if endpoint not in tasks:
                self.retry_now[endpoint] = Changed()
                await tasks.start_soon(endpoint, self.run_endpoint, endpoint)

    def result(self) -> DiscoveryResult:
        registrations = {r.endpoint: r for r in self.registry.registrations(self.request.handler)}
        problems: list[str] = []
        invalid: list[str] = []
        if not registrations:
            problems.append(
                f"no discovery handler named {self.request.handler!r} is registered on this node"
            )
        for endpoint in sorted(self.invalid):
            if endpoint in registrations:
                invalid.append(
                    f"discovery handler {self.request.handler!r} at {endpoint} rejected "
                    f"discoveryDetails: {self.invalid[endpoint]}"
                )
        problems.extend(invalid)
        statuses = self.registry.get(self.request.handler)
        pending = tuple(
            sorted(
                endpoint
                for endpoint in registrations
                if endpoint not in self.lists
                and endpoint not in self.invalid
                and not isinstance(statuses.get(endpoint), Offline)
            )
        )
        refused = [
            f"{endpoint}: {line}"
            for endpoint in sorted(self.refused)
            if endpoint in registrations
            for line in self.refused[endpoint]
        ]
        devices = merge(self.lists, registrations)
        cap = self.rules.max_configuration_devices
        if len(devices) > cap:
            refused.append(
                f"{len(devices)} devices discovered; only the first {cap} by id are used "
                "(the agent's --max-devices-per-configuration)"
            )
            devices = devices[:cap]
        return DiscoveryResult(
            devices=devices,
            problems=tuple(problems),
            handlers=statuses,
            pending=pending,
            invalid=tuple(invalid),
            refused=tuple(refused),
            handler_problems=tuple(
                f"{endpoint}: {line}"
                for endpoint in sorted(self.reported)
                if endpoint in registrations
                for line in self.reported[endpoint]
            ),
        )

    # ---- one endpoint -------------------------------------------------------------------------

    def _current(self, endpoint: str) -> Registration | None:
        for registration in self.registry.registrations(self.request.handler):
            if registration.endpoint == endpoint:
                return registration
        return None

    async def run_endpoint(self, endpoint: str) -> None:
        try:
            await self._keep_streaming(endpoint)
        finally:
            # Gone from the registry (or stopped): the loop looks again, and a re-registration
            # starts a new task (the TaskSet forgets this one before that loop runs).
            self.wake.bump()

    async def _keep_streaming(self, endpoint: str) -> None:
        attempt = 0
        retry_now = self.retry_now[endpoint]
        while (registration := self._current(endpoint)) is not None:
            registered = retry_now.version
            outcome, got_messages = await self.stream_once(registration)
            if got_messages:
                attempt = 0  # it worked for a while: start backing off afresh
            if outcome == "invalid":
                # Asking again would get the same answer: wait for a new handler.
                await retry_now.wait_past(registered)
                continue
            with trio.move_on_after(self.backoff.delay(attempt)):
                await retry_now.wait_past(registered)
            attempt += 1

    async def stream_once(self, registration: Registration) -> tuple[Outcome, bool]:
        """One Discover stream, from connecting until it ends, fails or is cancelled.
        Returns how it ended and whether any list arrived."""
        name, endpoint, user = registration.name, registration.endpoint, self.request.key
        got_messages = False
        outcome: Outcome | None = None

        async def accept(decode: Decode, count: int, problems: list[str]) -> None:
            nonlocal got_messages
            got_messages = True
            host = host_check(self.rules.host_allowances, user.partition("/")[0])

            def checked() -> tuple[list[Device], list[str]]:
                return check_devices(decode(), self.rules, host)

            if count <= INLINE_DEVICES:
                kept, refused = checked()
            else:
                kept, refused = await trio.to_thread.run_sync(checked)
            if refused and refused != self.refused.get(endpoint):
                log.warning(
                    "discovery handler %s at %s (%s): %s",
                    name,
                    endpoint,
                    user,
                    "; ".join(refused[:10])
                    + (f"; and {len(refused) - 10} more" if len(refused) > 10 else ""),
                    extra=fields(configuration=user, handler=name, endpoint=endpoint),
                )
            self.lists[endpoint] = kept
            self.refused[endpoint] = refused
            self.reported[endpoint] = bounded_lines(problems)  # as much as the status shows
            self.invalid.pop(endpoint, None)
            self.wake.bump()

        cancelled = False
        try:
            try:
                if registration.endpoint_type is EndpointType.EMBEDDED:
                    await self._embedded(registration, accept)
                else:
                    await self._remote(registration, accept)
                outcome = "lost"  # a Discover stream is meant to last: its end is a loss
                log.warning(
                    "discovery stream from %s ended (%s)",
                    endpoint,
                    user,
                    extra=fields(configuration=user, handler=name, endpoint=endpoint),
                )
            # purerpc's task groups wrap errors: sort the leaves. Cancellation matches neither
            # clause and passes through untouched.
            except* (InvalidDetails, purerpc.InvalidArgumentError) as group:
                outcome = "invalid"
                self.invalid[endpoint] = _message(group.exceptions[0])
            except* Exception as group:
                outcome = "lost"
                log.warning(
                    "discovery stream from %s failed (%s): %r",
                    endpoint,
                    user,
                    group,
                    extra=fields(configuration=user, handler=name, endpoint=endpoint),
                )
        except BaseException:
            # Being cancelled wins (the Configuration is gone; errors alongside are moot).
            cancelled = True
            raise
        finally:
            self.lists.pop(endpoint, None)
            self.refused.pop(endpoint, None)
            self.reported.pop(endpoint, None)
            self.wake.bump()
            if outcome == "lost" and not cancelled:
                self.registry.stream_lost(name, endpoint, user)
            else:  # cancelled (Configuration gone or changed) or refused: the handler is fine
                self.registry.stream_closed(name, endpoint, user)
        return outcome, got_messages

    async def _embedded(self, registration: Registration, accept: Accept) -> None:
        handler = registration.handler
        assert handler is not None, "embedded registrations carry their handler"
        details = handler.parse_details(self.request.details)
        self.registry.stream_opened(registration.name, registration.endpoint, self.request.key)

        problems: list[str] = []

        async def send(devices: list[Device]) -> None:
            await accept(lambda: devices, len(devices), problems)

        async def report(lines: tuple[str, ...]) -> None:
            problems[:] = lines
            self.reported[registration.endpoint] = bounded_lines(lines)
            self.wake.bump()

        await discover_changes(handler, details, self.request.properties, send, report=report)

    async def _remote(self, registration: Registration, accept: Accept) -> None:
        message = request_to_proto(self.request.details, self.request.properties)
        async with open_channel(registration.endpoint) as channel:
            self.registry.stream_opened(registration.name, registration.endpoint, self.request.key)
            stub = DiscoveryHandlerStub(channel)
            async with aclosing(stub.Discover(message)) as responses:  # type: ignore[type-var]
                async for response in responses:
                    await accept(
                        functools.partial(response_from_proto, response),
                        len(response.devices),
                        list(response.problems),
                    )


async def run_configuration_discovery(
    registry: Registry,
    request: DiscoveryRequest,
    send: Callable[[DiscoveryResult], Awaitable[None]],
    *,
    backoff: Backoff = RECONNECT_BACKOFF,
    rules: DeviceRules | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Discover devices for one Configuration until cancelled (see the module docstring).

    `send` receives a `DiscoveryResult` first once the streams to the endpoints registered now
    are starting, then on every change (it may block; changes meanwhile are coalesced).
    Reports started once subscribed to the registry, so no later registration is missed.
    """
    state = _Discovery(registry, request, backoff, rules or DeviceRules())
    unsubscribe = registry.subscribe(state.on_registry_event)
    try:
        async with trio.open_nursery() as nursery:
            streams = TaskSet[str](nursery)
            last: DiscoveryResult | None = None
            started = False
            while True:
                seen = state.wake.version
                await state.sync_endpoints(streams)
                result = state.result()
                if result != last:
                    last = result
                    if not started:
                        # Before the first send: a caller may read results only after
                        # nursery.start() has returned.
                        started = True
                        task_status.started()
                    await send(result)
                await state.wake.wait_past(seen)
    finally:
        unsubscribe()
