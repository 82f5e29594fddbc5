"""No ONVIF reply flood freezes the agent (issue 21 item 4).

Ten times `ONVIF_MAX_MATCHES` ProbeMatches reach the handler's real probe socket on loopback,
one datagram each, every one answering this round's MessageID from the address its XAddrs name
(the worst case: the attacker sniffed the Probe) and naming a camera that answers. The round
keeps the cap's worth and queries them all, in the loop that also serves a kubelet's Allocate
calls: the loop stays under the lag bound and every Allocate is answered (tests/support/flood.py).
"""

from __future__ import annotations

import socket

import attrs
import pytest
import trio

from akri_trio.discovery.handlers.onvif import Onvif, parse_details, report_refused
from akri_trio.discovery.handlers.onvif_device import device_document
from akri_trio.discovery.handlers.onvif_probe import (
    DEFAULT_MAX_MATCHES,
    ProbeReplies,
    ProbeReply,
    new_message_id,
    probe_interfaces,
)
from akri_trio.runtime import Changed
from tests.discovery.test_onvif_device import OnvifDeviceService, message_id_of, probe_matches
from tests.support.flood import watched_loop

FLOOD = 10 * DEFAULT_MAX_MATCHES


@attrs.define
class HeardReplies(ProbeReplies):
    """ProbeReplies that count the datagrams taken in, so the test knows when all arrived."""

    heard: int = 0
    changed: Changed = attrs.field(factory=Changed)

    def add(self, reply: ProbeReply, sender: str, local_address: str) -> None:
        super().add(reply, sender, local_address)
        self.heard += 1
        self.changed.bump()


async def flood_round(handler: Onvif, url: str) -> HeardReplies:
    """A probe window from 127.0.0.1 (against a stand-in for the multicast group on loopback)
    that ends once all FLOOD ProbeMatches, each for a camera of its own at `url`, were taken
    in."""
    replies = HeardReplies(new_message_id(), handler.max_matches)
    group = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with group, attacker:
        await group.bind(("127.0.0.1", 0))
        await attacker.bind(("127.0.0.1", 0))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: probe_interfaces(["127.0.0.1"], replies, group=group.getsockname())
            )
            probe, prober = await group.recvfrom(65535)
            message_id = message_id_of(probe)
            for n in range(FLOOD):  # each send is a checkpoint: the probe socket keeps up
                camera = (f"00000000-0000-0000-0000-{n:012d}", url)
                await attacker.sendto(probe_matches(message_id, [camera]), prober)
            seen = 0
            while replies.heard < FLOOD:
                seen = await replies.changed.wait_past(seen)
            nursery.cancel_scope.cancel()
    report_refused(replies)
    return replies


async def test_a_flood_of_answering_probe_matches_keeps_the_loop_responsive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = Onvif()
    camera = OnvifDeviceService()
    await device_document()  # parsed once per process, as the handler does before its rounds
    with trio.fail_after(300):  # a hang guard, not a timing
        async with camera.serving() as url, watched_loop() as watch:
            replies = await flood_round(handler, url)
            devices = await handler.confirm(parse_details(""), replies.matches.values(), {})
    watch.assert_held_up()
    assert len(replies.matches) == DEFAULT_MAX_MATCHES
    assert replies.over_cap == FLOOD - DEFAULT_MAX_MATCHES
    assert len(devices) == DEFAULT_MAX_MATCHES
    assert camera.connections == DEFAULT_MAX_MATCHES  # a connection each
    assert camera.most_in_flight <= handler.query_concurrency
    assert caplog.text.count("past the cap of 256 cameras a round") == 1
