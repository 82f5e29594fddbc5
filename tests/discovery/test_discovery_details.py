"""The handler interface's pure parts: details parsing, debugEcho's device list, send-on-change."""

from __future__ import annotations

import pytest
import trio

from akri_trio.discovery.handlers import UnknownHandler, load_handler
from akri_trio.discovery.handlers.debug_echo import (
    PROPERTY,
    DebugEcho,
    DebugEchoDetails,
    devices_for,
    parse_details,
    shared_from_env,
)
from akri_trio.discovery.interface import InvalidDetails, Properties, Send, discover_changes
from akri_trio.model.device import Device


def test_parse_details_yaml_and_json() -> None:
    assert parse_details("descriptions:\n  - foo0\n  - foo1\n") == DebugEchoDetails(
        ("foo0", "foo1")
    )
    assert parse_details('{"descriptions": ["a"]}') == DebugEchoDetails(("a",))
    assert parse_details("descriptions: []") == DebugEchoDetails(())


def test_parse_details_ignores_unknown_keys_like_upstream() -> None:
    assert parse_details("descriptions: [a]\nextra: 1") == DebugEchoDetails(("a",))


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("", "descriptions", "is required"),
        ("other: [a]", "descriptions", "is required"),
        ("descriptions:", "descriptions", "is required"),
        ("descriptions: foo", "descriptions", "must be a list of strings, got a string"),
        ("descriptions: {a: 1}", "descriptions", "got a mapping"),
        ("descriptions: [a, 3]", "descriptions[1]", "must be a string, got int"),
        ("descriptions: [a, [b]]", "descriptions[1]", "must be a string, got a list"),
        ("- a\n- b", None, "must be a mapping, got a list"),
        ("descriptions: [a", None, "not valid YAML"),
        ("descriptions: a: b", None, "not valid YAML"),
    ],
)
def test_parse_details_errors_name_the_field(text: str, field: str | None, fragment: str) -> None:
    with pytest.raises(InvalidDetails) as info:
        parse_details(text)
    assert info.value.field == field
    assert fragment in str(info.value)
    assert str(info.value).startswith("discoveryDetails" + (f".{field}" if field else ""))


def test_devices_for_availability() -> None:
    details = DebugEchoDetails(("foo0", "foo1"))
    expected = [
        Device("foo0", {PROPERTY: "foo0"}),
        Device("foo1", {PROPERTY: "foo1"}),
    ]
    assert devices_for(details, None) == expected
    assert devices_for(details, "ONLINE") == expected
    assert devices_for(details, "") == expected
    assert devices_for(details, "OFFLINE") == []
    assert devices_for(details, "OFFLINE\n") == []  # `echo OFFLINE > file`, as upstream's docs


@pytest.mark.parametrize(
    ("value", "shared"),
    [("true", True), ("1", True), ("TRUE", True), ("false", False), ("0", False), ("", False)],
)
def test_shared_from_env(value: str, shared: bool) -> None:
    assert shared_from_env({"DEBUG_ECHO_INSTANCES_SHARED": value}) is shared
    assert shared_from_env({}) is False


def test_load_handler_builds_debug_echo_from_env() -> None:
    handler = load_handler("debugEcho", {"DEBUG_ECHO_INSTANCES_SHARED": "true"})
    assert isinstance(handler, DebugEcho)
    assert handler.name == "debugEcho"
    assert handler.shared is True
    with pytest.raises(UnknownHandler, match="debugEcho"):
        load_handler("nope", {})


class _Scripted:
    """A handler that sends the given lists in order, then waits forever."""

    name = "scripted"
    shared = False

    def __init__(self, lists: list[list[Device]]) -> None:
        self.lists = lists

    def parse_details(self, text: str) -> str:
        return text

    async def discover(self, details: str, properties: Properties, send: Send) -> None:
        for devices in self.lists:
            await send(devices)
        await trio.sleep_forever()


async def test_discover_changes_sends_first_list_and_only_changes() -> None:
    a, b = Device("a"), Device("b")
    handler = _Scripted([[], [], [a, b], [b, a], [a], [a], []])
    sent: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    with trio.move_on_after(1):
        await discover_changes(handler, "", {}, send)
    # The first (empty) list always goes out; repeats and mere reorderings do not.
    assert sent == [[], [a, b], [a], []]
