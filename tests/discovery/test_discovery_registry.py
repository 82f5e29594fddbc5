"""The registry's state machine: statuses, multi-registration, 5-minute removal, events."""

from __future__ import annotations

import trio

from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.discovery.registration import expire_offline
from akri_trio.discovery.registry import (
    ACTIVE,
    WAITING,
    EndpointType,
    Offline,
    Registration,
    Registry,
    RegistryEvent,
    embedded,
)

UDEV_A = Registration("udev", "/var/lib/akri/udev-a.sock", EndpointType.UDS, shared=False)
UDEV_B = Registration("udev", "/var/lib/akri/udev-b.sock", EndpointType.UDS, shared=False)
ONVIF = Registration("onvif", "http://10.0.0.1:10000", EndpointType.NETWORK, shared=True)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_register_then_waiting_active_waiting() -> None:
    registry = Registry(FakeClock())
    registry.register(UDEV_A)
    assert registry.get("udev") == {UDEV_A.endpoint: WAITING}
    registry.stream_opened("udev", UDEV_A.endpoint, "default/cfg1")
    registry.stream_opened("udev", UDEV_A.endpoint, "default/cfg2")
    assert registry.status("udev", UDEV_A.endpoint) == ACTIVE
    registry.stream_closed("udev", UDEV_A.endpoint, "default/cfg1")
    assert registry.status("udev", UDEV_A.endpoint) == ACTIVE  # cfg2 still streams
    registry.stream_closed("udev", UDEV_A.endpoint, "default/cfg2")
    assert registry.status("udev", UDEV_A.endpoint) == WAITING  # the last one went


def test_several_endpoints_under_one_name() -> None:
    registry = Registry(FakeClock())
    registry.register(UDEV_B)
    registry.register(UDEV_A)
    registry.register(ONVIF)
    assert registry.registrations("udev") == [UDEV_A, UDEV_B]  # endpoint order
    assert registry.names() == ["onvif", "udev"]
    registry.stream_opened("udev", UDEV_B.endpoint, "c")
    assert registry.get("udev") == {UDEV_A.endpoint: WAITING, UDEV_B.endpoint: ACTIVE}


def test_reregistering_an_endpoint_replaces_it_and_keeps_streams() -> None:
    clock = FakeClock()
    registry = Registry(clock)
    registry.register(UDEV_A)
    registry.stream_opened("udev", UDEV_A.endpoint, "c1")
    registry.stream_lost("udev", UDEV_A.endpoint, "c2")  # c2 failed; c1 still streams
    assert registry.status("udev", UDEV_A.endpoint) == ACTIVE
    replaced = Registration("udev", UDEV_A.endpoint, EndpointType.UDS, shared=True)
    registry.register(replaced)
    assert registry.registrations("udev") == [replaced]
    assert registry.status("udev", UDEV_A.endpoint) == ACTIVE


def test_lost_stream_goes_offline_and_reregistration_revives() -> None:
    clock = FakeClock()
    registry = Registry(clock)
    registry.register(UDEV_A)
    registry.stream_opened("udev", UDEV_A.endpoint, "c1")
    clock.now += 5
    registry.stream_lost("udev", UDEV_A.endpoint, "c1")
    assert registry.status("udev", UDEV_A.endpoint) == Offline(1005.0)
    clock.now += 5
    registry.stream_lost("udev", UDEV_A.endpoint, "c1")  # a failed retry keeps the first time
    assert registry.status("udev", UDEV_A.endpoint) == Offline(1005.0)
    registry.stream_closed("udev", UDEV_A.endpoint, "c1")  # the Configuration goes
    assert registry.status("udev", UDEV_A.endpoint) == Offline(1005.0)  # still dead
    registry.register(UDEV_A)
    assert registry.status("udev", UDEV_A.endpoint) == WAITING


def test_connect_failure_of_an_unused_endpoint_marks_it_offline() -> None:
    registry = Registry(FakeClock())
    registry.register(UDEV_A)
    registry.stream_lost("udev", UDEV_A.endpoint, "c1")
    assert registry.status("udev", UDEV_A.endpoint) == Offline(1000.0)
    registry.stream_opened("udev", UDEV_A.endpoint, "c1")  # a retry got through
    assert registry.status("udev", UDEV_A.endpoint) == ACTIVE


def test_unknown_endpoints_are_ignored() -> None:
    registry = Registry(FakeClock())
    registry.stream_opened("udev", "/nope", "c")
    registry.stream_lost("udev", "/nope", "c")
    registry.stream_closed("udev", "/nope", "c")
    assert registry.get("udev") == {}
    assert registry.status("udev", "/nope") is None


async def test_offline_handler_removed_after_5_minutes(autojump_clock: trio.abc.Clock) -> None:
    registry = Registry(clock=trio.current_time)
    registry.register(UDEV_A)
    registry.register(UDEV_B)
    registry.stream_lost("udev", UDEV_A.endpoint, "c")
    assert registry.next_expiry() == trio.current_time() + 300
    await trio.sleep(299)
    assert UDEV_A.endpoint in registry.get("udev")
    await trio.sleep(2)
    assert registry.get("udev") == {UDEV_B.endpoint: WAITING}  # only the offline one went
    assert registry.next_expiry() is None


async def test_embedded_handlers_are_never_removed(autojump_clock: trio.abc.Clock) -> None:
    registry = Registry(clock=trio.current_time)
    registration = embedded(DebugEcho())
    assert registration.endpoint_type is EndpointType.EMBEDDED
    registry.register(registration)
    registry.stream_lost("debugEcho", registration.endpoint, "c")
    await trio.sleep(3600)
    assert registry.status("debugEcho", registration.endpoint) == Offline(0.0)
    assert registry.next_expiry() is None


def test_listeners_hear_every_change_until_unsubscribed() -> None:
    clock = FakeClock()
    registry = Registry(clock)
    events: list[RegistryEvent] = []
    unsubscribe = registry.subscribe(events.append)
    registry.register(UDEV_A)
    registry.stream_opened("udev", UDEV_A.endpoint, "c")
    registry.stream_opened("udev", UDEV_A.endpoint, "d")  # no status change: no event
    registry.stream_lost("udev", UDEV_A.endpoint, "c")  # d still streams: still Active
    registry.stream_lost("udev", UDEV_A.endpoint, "d")
    clock.now += 301
    registry.expire()
    assert events == [
        RegistryEvent("registered", "udev", UDEV_A.endpoint),
        RegistryEvent("status", "udev", UDEV_A.endpoint),
        RegistryEvent("status", "udev", UDEV_A.endpoint),
        RegistryEvent("removed", "udev", UDEV_A.endpoint),
    ]
    unsubscribe()
    registry.register(UDEV_B)
    assert len(events) == 4


async def test_expire_offline_announces_removal_on_time(autojump_clock: trio.abc.Clock) -> None:
    registry = Registry(clock=trio.current_time)
    removed_at: list[float] = []

    def on_event(event: RegistryEvent) -> None:
        if event.kind == "removed":
            removed_at.append(trio.current_time())

    registry.subscribe(on_event)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(expire_offline, registry)
        await trio.sleep(10)
        registry.register(UDEV_A)
        registry.stream_lost("udev", UDEV_A.endpoint, "c")  # offline at t=10
        await trio.sleep(100)
        registry.register(UDEV_B)
        registry.stream_lost("udev", UDEV_B.endpoint, "c")  # offline at t=110
        await trio.sleep(1000)
        nursery.cancel_scope.cancel()
    assert removed_at == [310.0, 410.0]  # nobody queried: the task did it, on time
