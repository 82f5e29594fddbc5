"""zeroconf against real mDNS registrations: a second python-zeroconf instance (its own sockets
and threads, as any other responder on the network) announces services on the loopback
interface only (127.0.0.1: multicast never leaves this machine), and the handler, also bound to
127.0.0.1, must see them appear, filter them, follow TXT updates and see them leave."""

from __future__ import annotations

import contextlib
import math
import secrets
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
from trio.testing import MockClock
from zeroconf import IPVersion, ServiceInfo
from zeroconf import Zeroconf as ZeroconfLib

from akri_trio.discovery.handlers import zeroconf_handler as zh
from akri_trio.discovery.handlers.zeroconf_handler import (
    ADDRESSES,
    CLOSE_BOUND_S,
    HOST,
    KIND,
    PORT,
    PREFIX,
    Zeroconf,
    _close_in_thread,
    parse_details,
)
from akri_trio.discovery.interface import discover_changes
from akri_trio.model.device import Device

# A service type of this test run's own: other runs on the machine (a developer's, CI's) announce
# on the same loopback multicast group, and their services must not show up here.
SHORT_KIND = f"_akri{secrets.token_hex(4)}._tcp"
KIND_TYPE = f"{SHORT_KIND}.local."
LOOPBACK = ("127.0.0.1",)


def service(instance: str, port: int, **txt: str) -> ServiceInfo:
    return ServiceInfo(
        KIND_TYPE,
        f"{instance}.{KIND_TYPE}",
        addresses=[socket.inet_aton("127.0.0.1")],
        port=port,
        properties=txt,
        server=f"{instance}-host.local.",
    )


class Responder:
    """A real mDNS responder on the loopback interface; its blocking calls run in threads."""

    def __init__(self, zc: ZeroconfLib) -> None:
        self.zc = zc

    async def register(self, info: ServiceInfo) -> None:
        # cooperating_responders: skip the 1.5 s uniqueness probe (the names are ours)
        await trio.to_thread.run_sync(
            partial(self.zc.register_service, info, cooperating_responders=True)
        )

    async def update(self, info: ServiceInfo) -> None:
        await trio.to_thread.run_sync(self.zc.update_service, info)

    async def unregister(self, info: ServiceInfo) -> None:
        await trio.to_thread.run_sync(self.zc.unregister_service, info)


@asynccontextmanager
async def responder() -> AsyncIterator[Responder]:
    zc = await trio.to_thread.run_sync(
        partial(ZeroconfLib, interfaces=list(LOOPBACK), ip_version=IPVersion.V4Only)
    )
    try:
        yield Responder(zc)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(zc.close)  # also says goodbye for what is left


async def threads_started_since(before: set[int | None]) -> list[str]:
    """Threads (but trio's idle workers) that were not there `before`, after a moment to go."""
    import threading

    await trio.sleep(0.2)
    return [
        t.name
        for t in threading.enumerate()
        if t.ident not in before and not t.name.startswith("Trio thread")
    ]


async def next_list(
    receive: trio.MemoryReceiveChannel[list[Device]], within: float
) -> list[Device]:
    with trio.fail_after(within):
        return await receive.receive()


async def test_services_appear_update_and_leave() -> None:
    handler = Zeroconf(interfaces=LOOPBACK, settle=0.5)
    details = parse_details(f"kind: {SHORT_KIND}")
    dev1 = service("dev1", 8001, model="X100", **{"fw-version": "1.2"})
    dev2 = service("dev2", 8002)
    send, receive = trio.open_memory_channel[list[Device]](10)
    async with responder() as peer, trio.open_nursery() as nursery:
        await peer.register(dev1)  # before discovery starts: found by the first query
        nursery.start_soon(discover_changes, handler, details, {}, send.send)
        # Under load resolution can outlast the settle window: an empty first list is then
        # correct ("nothing resolved yet"); what matters is the list that follows.
        first = await next_list(receive, 5)
        while not first:
            first = await next_list(receive, 5)
        assert [d.id for d in first] == [f"dev1.{KIND_TYPE}"]
        assert first[0].properties == {
            KIND: SHORT_KIND,
            f"{PREFIX}_NAME": "dev1",
            HOST: "dev1-host.local",
            f"{PREFIX}_ADDR": "127.0.0.1",
            ADDRESSES: "127.0.0.1",
            PORT: "8001",
            f"{PREFIX}_MODEL": "X100",
            f"{PREFIX}_FW_VERSION": "1.2",
        }

        start = trio.current_time()
        await peer.register(dev2)  # announced while we browse
        second = await next_list(receive, 3)
        assert [d.id for d in second] == [
            f"dev1.{KIND_TYPE}",
            f"dev2.{KIND_TYPE}",
        ]
        assert trio.current_time() - start < 2.0

        updated = service("dev1", 8001, model="X200")
        await peer.update(updated)
        third = await next_list(receive, 3)
        assert third[0].properties[f"{PREFIX}_MODEL"] == "X200"
        assert f"{PREFIX}_FW_VERSION" not in third[0].properties

        start = trio.current_time()
        await peer.unregister(dev2)  # goodbye packets
        fourth = await next_list(receive, 3)
        assert [d.id for d in fourth] == [f"dev1.{KIND_TYPE}"]
        assert trio.current_time() - start < 2.0

        with trio.move_on_after(1.5):  # nothing changes: nothing is sent
            raise AssertionError(f"sent without a change: {await receive.receive()}")
        nursery.cancel_scope.cancel()


async def test_first_list_comes_once_all_seen_are_resolved_not_at_the_settle_bound() -> None:
    handler = Zeroconf(interfaces=LOOPBACK, settle=60)  # the bound: far beyond fail_after
    infos = [service(f"early-{i}", 8100 + i) for i in range(5)]
    send, receive = trio.open_memory_channel[list[Device]](10)
    async with responder() as peer, trio.open_nursery() as nursery:
        for info in infos:
            await peer.register(info)
        nursery.start_soon(
            discover_changes, handler, parse_details(f"kind: {SHORT_KIND}"), {}, send.send
        )
        first = await next_list(receive, 10)
        assert [d.id for d in first] == [f"early-{i}.{KIND_TYPE}" for i in range(5)]
        nursery.cancel_scope.cancel()


async def test_configurations_share_one_instance_and_a_late_one_finds_cached_services() -> None:
    import threading

    handler = Zeroconf(interfaces=LOOPBACK, settle=5)
    before = {t.ident for t in threading.enumerate()}
    infos = [service("shared-a", 8201), service("shared-b", 8202)]
    first_send, first = trio.open_memory_channel[list[Device]](10)
    late_send, late = trio.open_memory_channel[list[Device]](10)
    all_of_them = [f"shared-{x}.{KIND_TYPE}" for x in "ab"]
    async with responder() as peer:
        for info in infos:
            await peer.register(info)
        async with trio.open_nursery() as nursery:
            every = parse_details(f"kind: {SHORT_KIND}")
            first_scope, first_done = trio.CancelScope(), trio.Event()

            async def first_discover() -> None:
                with first_scope:
                    await discover_changes(handler, every, {}, first_send.send)
                first_done.set()

            nursery.start_soon(first_discover)
            assert [d.id for d in await next_list(first, 10)] == all_of_them
            # Started after the first one resolved everything: the answers are in the shared
            # cache (responders suppress known answers), and the new browser must get them.
            only_b = parse_details(f"{{kind: {SHORT_KIND}, name: shared-b}}")
            nursery.start_soon(discover_changes, handler, only_b, {}, late_send.send)
            assert [d.id for d in await next_list(late, 10)] == all_of_them[1:]
            assert handler._instance._users == 2  # one Zeroconf for both
            # The first one ends; the shared instance stays open for the other, which still
            # follows changes.
            first_scope.cancel()
            with trio.fail_after(5):
                await first_done.wait()
            assert handler._instance._users == 1
            await peer.update(service("shared-b", 8202, model="Z"))
            updated = await next_list(late, 5)
            assert updated[0].properties[f"{PREFIX}_MODEL"] == "Z"
            nursery.cancel_scope.cancel()
    assert handler._instance._zc is None  # the last one out closed it
    assert await threads_started_since(before) == []


async def test_filters_by_name_port_txt_and_kinds() -> None:
    handler = Zeroconf(interfaces=LOOPBACK, settle=1.5)
    services = [
        service("printer-1", 9001, model="X100", secure="1"),
        service("printer-2", 9002, model="X200"),
        service("camera-1", 9003, model="X100"),
    ]
    other = ServiceInfo(
        "_akriother._udp.local.",
        "thing._akriother._udp.local.",
        addresses=[socket.inet_aton("127.0.0.1")],
        port=9004,
        server="thing.local.",
    )

    async def found(text: str) -> list[str]:
        send, receive = trio.open_memory_channel[list[Device]](10)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handler.discover, parse_details(text), {}, send.send)
            devices = await next_list(receive, 5)
            nursery.cancel_scope.cancel()
        return [d.id for d in devices]

    async with responder() as peer:
        for info in [*services, other]:
            await peer.register(info)
        p1, p2, c1 = (f"{n}.{KIND_TYPE}" for n in ("printer-1", "printer-2", "camera-1"))
        assert await found(f"kind: {KIND_TYPE}") == [c1, p1, p2]
        assert await found(f"{{kind: {SHORT_KIND}, name: 'printer-.*'}}") == [p1, p2]
        assert await found(f"{{kind: {SHORT_KIND}, name: 'printer'}}") == []  # full match
        assert await found(f"{{kind: {SHORT_KIND}, port: 9002}}") == [p2]
        assert await found(f"{{kind: {SHORT_KIND}, txtRecords: {{MODEL: X100}}}}") == [c1, p1]
        assert await found(f"{{kind: {SHORT_KIND}, txtRecords: {{secure: null}}}}") == [p1]
        assert await found(f"{{kind: {SHORT_KIND}, host: 'camera-1-host\\.local'}}") == [c1]
        assert await found(f"kinds: [{SHORT_KIND}, _akriother._udp]") == [
            c1,
            p1,
            p2,
            "thing._akriother._udp.local.",
        ]


async def test_cancellation_closes_zeroconf_promptly() -> None:
    import threading

    handler = Zeroconf(interfaces=LOOPBACK, settle=0.1)
    before = {t.ident for t in threading.enumerate()}

    async def send(devices: list[Device]) -> None:
        pass

    start = trio.current_time()
    with trio.move_on_after(0.5):
        await handler.discover(parse_details(f"kind: {SHORT_KIND}"), {}, send)
    assert trio.current_time() - start < 2.0
    # Zeroconf's loop thread and the browser thread are gone (trio's idle workers may stay)
    assert await threads_started_since(before) == []


async def test_a_stuck_close_is_left_behind_at_the_bound(autojump_clock: MockClock) -> None:
    """Closing runs shielded in a thread; one that hangs (a zeroconf thread that never joins)
    costs CLOSE_BOUND_S, not the shutdown of the agent that embeds the handler."""
    release = threading.Event()
    cancelled = trio.CancelScope()
    with cancelled:
        cancelled.cancel()  # as in a shutdown: the close runs under a cancelled scope
        await _close_in_thread(release.wait, "a stuck close")
    assert trio.current_time() == CLOSE_BOUND_S
    release.set()


# ---- floods of names that never resolve (issue 8, item 7) ---------------------------------------


class NeverResolves:
    """Stands in for python-zeroconf's blocking `get_service_info` of a name whose SRV never
    comes: each call holds its worker thread for the timeout (or until `release`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.running = 0
        self.peak = 0
        self.release = threading.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._changed = trio.Event()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until_running(self, count: int) -> None:
        while self.running < count:
            await self._changed.wait()

    def get_service_info(self, service_type: str, name: str, timeout: int) -> None:
        with self.lock:
            self.calls[name] += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._wake)
        self.release.wait(timeout / 1000)
        with self.lock:
            self.running -= 1


@asynccontextmanager
async def tracking(
    handler: Zeroconf, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[NeverResolves, trio.MemorySendChannel[tuple[str, str, str]]]]:
    monkeypatch.setattr(zh, "_cached_info", lambda *_: None)  # nothing in any cache
    zc = NeverResolves()
    events_in, events = trio.open_memory_channel[tuple[str, str, str]](math.inf)

    async def send(devices: list[Device]) -> None:
        pass

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                handler._track, zc, parse_details(f"kind: {SHORT_KIND}"), events, send
            )
            yield zc, events_in
            nursery.cancel_scope.cancel()
    finally:
        zc.release.set()  # let the abandoned worker threads finish


async def test_a_flood_of_unresolvable_names_does_not_starve_other_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = Zeroconf(resolve_timeout=5.0)
    async with tracking(handler, monkeypatch) as (zc, events_in):
        for i in range(200):
            events_in.send_nowait((KIND_TYPE, f"ghost-{i}.{KIND_TYPE}", "added"))
        await zc.until_running(handler.resolve_threads)
        # Everyone else's threads (trio's default limiter) are untouched by the flood.
        with trio.fail_after(1):
            await trio.to_thread.run_sync(lambda: None)
        assert zc.peak == handler.resolve_threads == 4


async def test_a_name_being_resolved_is_not_resolved_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = Zeroconf(resolve_timeout=5.0)
    async with tracking(handler, monkeypatch) as (zc, events_in):
        name = f"busy.{KIND_TYPE}"
        events_in.send_nowait((KIND_TYPE, name, "added"))
        await zc.until_running(1)
        for _ in range(20):
            events_in.send_nowait((KIND_TYPE, name, "updated"))
        await trio.sleep(0.2)
        assert zc.calls[name] == 1 and zc.peak == 1


async def test_tracked_services_are_capped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Zeroconf(resolve_timeout=5.0, max_services=3, resolve_threads=10)
    async with tracking(handler, monkeypatch) as (zc, events_in):
        for i in range(10):
            events_in.send_nowait((KIND_TYPE, f"n{i}.{KIND_TYPE}", "added"))
        await zc.until_running(3)
        await trio.sleep(0.2)
        assert sorted(zc.calls) == [f"n{i}.{KIND_TYPE}" for i in range(3)]
    assert caplog.text.count("tracking 3 services already") == 1
    assert Zeroconf.from_env({"ZEROCONF_MAX_SERVICES": "7"}).max_services == 7
