"""A handler's problems (DiscoverResponse.problems, our extension) reach the Configuration's
status: the pure status text and Events, `discover_changes`' only-on-change rule, and the real
gRPC Discover path from a standalone handler to the agent's DiscoveryResult (and embedded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio

from akri_trio.agent.discovery_streams import DiscoveryResult
from akri_trio.agent.events import condition_events
from akri_trio.agent.status import MAX_LINE_CHARS, MAX_LISTED
from akri_trio.discovery.interface import Properties, Send, discover_changes, report_problems
from akri_trio.discovery.registry import ACTIVE, Registry, embedded
from akri_trio.model.device import Device
from tests.agent.test_hostile_pure import _entry
from tests.discovery.test_discovery_e2e import discover, start_agent, start_handler


def entry(handler_problems: list[str] | tuple[str, ...], previous: Any = None) -> dict[str, Any]:
    """node-a's status entry for an onvif Configuration with one endpoint registered."""
    return _entry(
        handler="onvif",
        handlers={"embedded-onvif": ACTIVE},
        previous=previous,
        handler_problems=handler_problems,
    )


def healthy(e: dict[str, Any]) -> tuple[str, str, str]:
    (c,) = [c for c in e["conditions"] if c["type"] == "DiscoveryHealthy"]
    return c["status"], c["reason"], c["message"]


# ---- the status text and its Events (pure) ------------------------------------------------------


def test_no_handler_problems_is_a_healthy_condition() -> None:
    assert healthy(entry([])) == ("True", "Healthy", "")
    assert condition_events(None, entry([])) == []


def test_handler_problems_make_the_condition_false_with_their_text() -> None:
    line = "onvif: 2 camera(s) refused the configured credentials: a (x); b (y)"
    assert healthy(entry([line])) == ("False", "HandlerProblems", line)


def test_many_or_long_problems_are_bounded_like_every_condition() -> None:
    status, _, message = healthy(entry(["x" * 5000] * 25))
    parts = message.split("; ")
    assert status == "False" and len(parts) == MAX_LISTED + 1
    assert parts[-1] == f"and {25 - MAX_LISTED} more"
    assert all(len(p) <= MAX_LINE_CHARS + 3 for p in parts)


def test_an_event_when_the_problems_change_not_when_they_stay() -> None:
    one = entry(["1 camera(s) refused the configured credentials: a"])
    assert condition_events(None, one) == [
        ("DiscoveryProblems", "node-a: 1 camera(s) refused the configured credentials: a")
    ]
    same = entry(["1 camera(s) refused the configured credentials: a"], previous=one)
    assert same == one and condition_events(one, same) == []
    two = entry(["2 camera(s) refused the configured credentials: a; b"], previous=one)
    assert [r for r, _ in condition_events(one, two)] == ["DiscoveryProblems"]
    assert healthy(entry([], previous=two))[0] == "True"


# ---- a handler that reports problems ------------------------------------------------------------


@attrs.define
class Complaining:
    """Registers as debugEcho; sends one device, then reports each list of problems it is
    given (the test feeds them), in order."""

    lines: trio.MemoryReceiveChannel[list[str]]
    name: str = "debugEcho"
    shared: bool = False

    def parse_details(self, text: str) -> str:
        return text

    async def discover(self, details: str, properties: Properties, send: Send) -> None:
        await send([Device("cam0", {})])
        async for lines in self.lines:
            await report_problems(send, lines)
            await send([Device("cam0", {})])  # unchanged: nothing goes out for it
        await trio.sleep_forever()


async def test_discover_changes_passes_problems_on_only_when_they_change() -> None:
    feed, lines = trio.open_memory_channel[list[str]](10)
    for batch in (["a"], ["a"], [], [], ["b", "c"]):
        feed.send_nowait(batch)
    feed.close()
    devices: list[list[Device]] = []
    reported: list[tuple[str, ...]] = []

    async def send(got: list[Device]) -> None:
        devices.append(got)

    async def report(got: tuple[str, ...]) -> None:
        reported.append(got)

    with trio.move_on_after(1):
        await discover_changes(Complaining(lines), "", {}, send, report=report)
    assert devices == [[Device("cam0", {})]]
    assert reported == [("a",), (), ("b", "c")]


async def test_problems_cross_the_real_discover_stream_into_the_status(
    sock_dir: Path,
) -> None:
    registry = Registry(trio.current_time)
    feed, lines = trio.open_memory_channel[list[str]](0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, results = await discover(nursery, registry)
            _, endpoint = await start_handler(nursery, Complaining(lines), sock_dir)
            first = await results.until(lambda r: len(r.devices) == 1)
            assert first.handler_problems == ()

            await feed.send(["1 camera(s) refused the configured credentials: cam1 (no)"])
            got = await results.until(lambda r: bool(r.handler_problems))
            assert got.handler_problems == (
                f"{endpoint}: 1 camera(s) refused the configured credentials: cam1 (no)",
            )
            assert [d.device.id for d in got.devices] == ["cam0"]  # the list stays
            assert healthy(entry(got.handler_problems)) == (
                "False",
                "HandlerProblems",
                f"{endpoint}: 1 camera(s) refused the configured credentials: cam1 (no)",
            )

            # A flood is cut on arrival: as many lines as the status shows, each cut.
            await feed.send([f"{i}" + "x" * 10_000 for i in range(500)])
            flood = await results.until(lambda r: len(r.handler_problems) > 1)
            assert len(flood.handler_problems) == MAX_LISTED + 1
            assert flood.handler_problems[-1] == f"{endpoint}: and {500 - MAX_LISTED} more"
            assert all(
                len(p) <= len(endpoint) + 2 + MAX_LINE_CHARS + 3 for p in flood.handler_problems
            )

            await feed.send([])  # resolved: the problems go, the device stays
            cleared = await results.until(lambda r: r.handler_problems == ())
            assert [d.device.id for d in cleared.devices] == ["cam0"]
            nursery.cancel_scope.cancel()


async def test_an_embedded_handler_reports_problems_the_same_way() -> None:
    registry = Registry(trio.current_time)
    feed, lines = trio.open_memory_channel[list[str]](0)
    registry.register(embedded(Complaining(lines)))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            _, results = await discover(nursery, registry)
            await results.until(lambda r: len(r.devices) == 1)
            await feed.send(["it hurts"])
            got: DiscoveryResult = await results.until(lambda r: bool(r.handler_problems))
            assert [p.split(": ", 1)[1] for p in got.handler_problems] == ["it hurts"]
            await feed.send([])
            await results.until(lambda r: r.handler_problems == ())
            nursery.cancel_scope.cancel()
