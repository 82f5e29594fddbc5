"""Hostile discoveryDetails: every handler's parser answers with its details or InvalidDetails,
whatever the text (deep nesting, YAML tags whose constructors fail, impossible dates, giant
integers, oversized documents). test_discovery_e2e checks that such a document sent to a
standalone handler is the Configuration's problem, not the handler's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akri_trio.discovery.handlers import debug_echo, onvif, opcua, udev, zeroconf_handler
from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.discovery.interface import MAX_DETAILS_BYTES, InvalidDetails, load_mapping

PARSERS: dict[str, Callable[[str], object]] = {
    "debugEcho": debug_echo.parse_details,
    "onvif": onvif.parse_details,
    "opcua": opcua.parse_details,
    "udev": udev.parse_details,
    "zeroconf": zeroconf_handler.parse_details,
}
# Keys each handler reads, so generated documents reach past the top-level checks.
KEYS = [
    "descriptions",
    "udevRules",
    "groupRecursive",
    "permissions",
    "ipAddresses",
    "macAddresses",
    "scopes",
    "uuids",
    "discoveryTimeoutSeconds",
    "opcuaDiscoveryMethod",
    "standard",
    "discoveryUrls",
    "applicationNames",
    "items",
    "action",
    "kind",
    "kinds",
    "name",
    "host",
    "port",
    "txtRecords",
]
HOSTILE_SCALARS = [
    "!!int x",
    '!!int ""',
    "!!bool x",
    "!!float x",
    "!!timestamp x",
    "!!binary x",
    "!!set {a}",
    "!!str [1]",
    "!!python/object:os.system x",
    "2020-02-30",
    "2020-02-28",
    "9" * 5000,
    "9" * 400,
    "-1",
    "0",
    "1",
    "1e400",
    ".nan",
    "-.inf",
    "~",
    "true",
    "'false'",
    '"\\ud800"',
    "'(a+)+b'",
    "'[[:'",
    "'KERNEL==\"x\"'",
    "'KERNELS==\"(a|aa)*b\"'",
    "'ATTR{x}==\"[!]\"'",
    "opc.tcp://h:99999/",
    "opc.tcp://[::1/",
    "_http._tcp",
    "Include",
    "Exclude",
    "rwm",
    "&anchor x",
    "*anchor",
    "*undefined",
    "'\\x00'",
]


def flow(value: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    keys = st.sampled_from(KEYS)
    return st.one_of(
        st.lists(value, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(keys, value), max_size=4).map(
            lambda kvs: "{" + ", ".join(f"{k}: {v}" for k, v in kvs) + "}"
        ),
    )


VALUES = st.recursive(
    st.one_of(st.sampled_from(HOSTILE_SCALARS), st.text(max_size=12).map(repr)),
    flow,
    max_leaves=12,
)
DOCUMENTS = st.one_of(
    st.text(),
    st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=6).map(
        lambda kvs: "\n".join(f"{k}: {v}" for k, v in kvs)
    ),
    VALUES,
)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(sorted(PARSERS)), DOCUMENTS)
def test_any_text_is_parsed_or_invalid_details(handler: str, text: str) -> None:
    try:
        PARSERS[handler](text)
    except InvalidDetails as exc:
        # Not the safety net of `details_parser`: each case has a message of its own.
        assert "cannot be used" not in str(exc), str(exc)


CASES = {
    "deep nesting": "descriptions: " + "[" * 5000 + "]" * 5000,
    "a failing !!int": "descriptions: !!int x",
    "a failing !!bool": "descriptions: !!bool x",
    "an empty !!int": 'descriptions: !!int ""',
    "a failing !!timestamp": "descriptions: !!timestamp x",
    "an impossible date": "descriptions: 2020-02-30",
    "a giant integer": "descriptions: " + "9" * 5000,
    "an oversized document": "descriptions: [" + "a, " * MAX_DETAILS_BYTES + "]",
}


@pytest.mark.parametrize("handler", sorted(PARSERS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_documents_are_invalid_details(handler: str, case: str) -> None:
    with pytest.raises(InvalidDetails) as info:
        PARSERS[handler](CASES[case].replace("descriptions", "udevRules"))
    message = str(info.value)
    assert message.startswith("discoveryDetails") and "\n" not in message and len(message) < 300


def test_messages_say_what_is_wrong() -> None:
    for text, fragment in [
        ("a: " + "[" * 40 + "]" * 40, "nests deeper than 32 levels"),
        ("a: !!int x", "invalid literal for int()"),
        ("a: 2020-02-30", "day is out of range for month"),
        ("a: " + "9" * 5000, "Exceeds the limit (4300 digits)"),
        ("a: " + "x" * 70_000, "is 70003 bytes long; the limit is 65536"),
    ]:
        with pytest.raises(InvalidDetails, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            load_mapping(text)
    assert load_mapping("a: " + "x" * 70_000, max_bytes=80_000)["a"] == "x" * 70_000


def test_the_size_limit_is_a_setting() -> None:
    handler = DebugEcho.from_env({"AKRI_DISCOVERY_DETAILS_MAX_BYTES": "20"})
    assert handler.parse_details("descriptions: [a]").descriptions == ("a",)
    with pytest.raises(InvalidDetails, match="the limit is 20"):
        handler.parse_details("descriptions: [a, b, c, d, e, f]")
    with pytest.raises(ValueError, match="AKRI_DISCOVERY_DETAILS_MAX_BYTES"):
        DebugEcho.from_env({"AKRI_DISCOVERY_DETAILS_MAX_BYTES": "-1"})
