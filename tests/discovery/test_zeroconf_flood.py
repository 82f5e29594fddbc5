"""No mDNS record flood freezes the agent (issue 21 item 4).

A real mDNS responder on the loopback interface (another python-zeroconf instance, as in
test_zeroconf_handler.py) announces ten times `ZEROCONF_MAX_SERVICES` services of the
Configuration's kind, each with its PTR, SRV, TXT and A records, unsolicited, many to a packet.
The handler tracks the cap's worth, says so once, and sends them as devices, in the loop that
also serves a kubelet's Allocate calls: the loop stays under the lag bound and every Allocate is
answered (tests/support/flood.py). The announcements go out a batch at a time, each once the
handler's browser has passed on the last, so the kernel drops none of them.
"""

from __future__ import annotations

import pytest
import trio
from zeroconf import Zeroconf as ZeroconfLib
from zeroconf._dns import DNSRecord  # where the package defines them (not re-exported)
from zeroconf._protocol.outgoing import DNSOutgoing
from zeroconf.const import _FLAGS_AA, _FLAGS_QR_RESPONSE

from akri_trio.discovery.handlers import zeroconf_handler as zh
from akri_trio.discovery.handlers.zeroconf_handler import MAX_SERVICES, Zeroconf, parse_details
from akri_trio.model.device import Device
from akri_trio.runtime import Changed
from tests.discovery.test_zeroconf_handler import (
    KIND_TYPE,
    LOOPBACK,
    SHORT_KIND,
    responder,
    service,
)
from tests.support.flood import watched_loop

FLOOD = 10 * MAX_SERVICES
BATCH = 64  # services a batch: a few packets (python-zeroconf splits at mDNS's size limit)


def announce(zc: ZeroconfLib, first: int, count: int) -> None:
    """Announce services flood-<first>... (`count` of them), unsolicited. Blocking."""
    out = DNSOutgoing(_FLAGS_QR_RESPONSE | _FLAGS_AA)
    for n in range(first, first + count):
        info = service(f"flood-{n}", 9000 + n % 1000)
        records: list[DNSRecord] = [info.dns_pointer(), info.dns_service(), info.dns_text()]
        for record in [*records, *info.dns_addresses()]:
            out.add_answer_at_time(record, 0)
    zc.send(out)


class Heard:
    """Counts the handler's browser events for this test's kind, in the loop."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.added = 0
        self.changed = Changed()
        offer = zh._offer

        def counting_offer(channel: trio.MemorySendChannel[zh.Event], event: zh.Event) -> None:
            offer(channel, event)
            if event[0] == KIND_TYPE and event[2] == "added":
                self.added += 1
                self.changed.bump()

        monkeypatch.setattr(zh, "_offer", counting_offer)

    async def until_added(self, count: int) -> None:
        seen = self.changed.version
        while self.added < count:
            seen = await self.changed.wait_past(seen)


class Lists:
    """The device lists the handler sent."""

    def __init__(self) -> None:
        self.sent: list[list[Device]] = []
        self.changed = Changed()

    async def send(self, devices: list[Device]) -> None:
        self.sent.append(devices)
        self.changed.bump()

    async def until_one_of(self, count: int) -> None:
        seen = self.changed.version
        while not self.sent or len(self.sent[-1]) != count:
            seen = await self.changed.wait_past(seen)


async def test_a_flood_of_mdns_records_keeps_the_loop_responsive(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    heard, lists = Heard(monkeypatch), Lists()
    handler = Zeroconf(interfaces=LOOPBACK)
    details = parse_details(f"kind: {SHORT_KIND}")
    with trio.fail_after(300):  # a hang guard, not a timing
        async with responder() as peer, watched_loop() as watch, trio.open_nursery() as nursery:
            nursery.start_soon(handler.discover, details, {}, lists.send)
            # A service of the kind's own first: once it is a device, the handler browses.
            await peer.register(service("first", 8999))
            await lists.until_one_of(1)
            for first in range(0, FLOOD, BATCH):
                await trio.to_thread.run_sync(announce, peer.zc, first, BATCH)
                await heard.until_added(1 + first + BATCH)
            await lists.until_one_of(MAX_SERVICES)
            nursery.cancel_scope.cancel()
    watch.assert_held_up()
    assert heard.added == 1 + FLOOD
    assert len(lists.sent[-1]) == MAX_SERVICES
    assert caplog.text.count(f"tracking {MAX_SERVICES} services already") == 1
