"""zeroconf's pure core: details, filters, property names and device building."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.handlers import zeroconf_handler as zh
from akri_trio.discovery.handlers.zeroconf_handler import (
    Service,
    ZeroconfDetails,
    devices_for,
    env_key,
    instance_name,
    matches,
    ordered_addresses,
    parse_details,
    properties_of,
)
from akri_trio.discovery.interface import InvalidDetails
from akri_trio.discovery.linear_regex import Regex

EXAMPLES = Path(__file__).resolve().parents[2] / "k8s" / "examples"


def svc(instance: str = "dev", port: int = 80, *txt: tuple[str, str | None], **kw: str) -> Service:
    return Service(
        full_name=f"{instance}._http._tcp.local.",
        kind=kw.get("kind", "_http._tcp"),
        instance=instance,
        host=kw.get("host", "dev.local"),
        addresses=tuple(kw.get("addresses", "10.0.0.1").split(",")),
        port=port,
        txt=tuple(txt),
    )


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("kind: _http._tcp", ("_http._tcp",)),
        ("kind: _http._tcp.local.", ("_http._tcp",)),
        ("kind: _http._tcp.local", ("_http._tcp",)),
        ("kind: _printer._sub._http._tcp", ("_printer._sub._http._tcp",)),
        ("kinds: [_ipp._tcp, _coap._udp.local., _ipp._tcp]", ("_ipp._tcp", "_coap._udp")),
    ],
)
def test_kinds_are_normalized(text: str, kinds: tuple[str, ...]) -> None:
    details = parse_details(text)
    assert details.kinds == kinds
    assert details.service_types == [f"{k}.local." for k in kinds]


def test_all_filters() -> None:
    details = parse_details(
        "kind: _http._tcp\nname: 'dev-[0-9]+'\nhost: '10\\.0\\..*'\nport: 8080\n"
        "txtRecords: {Model: X1, secure: true, n: 3, any: null}"
    )
    assert details.name is not None and details.name.source == "dev-[0-9]+"
    assert details.port == 8080
    assert details.txt_records == (("any", None), ("model", "X1"), ("n", "3"), ("secure", "true"))


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("", "kind", "exactly one of"),
        ("kind: _a._tcp\nkinds: [_b._tcp]", "kind", "exactly one of"),
        ("kind: http", "kind", "DNS-SD service type"),
        ("kind: _http._sctp", "kind", "DNS-SD service type"),
        ("kind: [_http._tcp]", "kind", "must be a string"),
        ("kinds: []", "kinds", "at least one"),
        ("kinds: _http._tcp", "kinds", "must be a list of strings"),
        ("kinds: [_http._tcp, nope]", "kinds[1]", "DNS-SD service type"),
        ("kind: _http._tcp\nname: '('", "name", "not a valid regular expression"),
        ("kind: _http._tcp\nname: 3", "name", "must be a string"),
        ("kind: _http._tcp\nhost: '[a'", "host", "not a valid regular expression"),
        ("kind: _http._tcp\nport: 0", "port", "1-65535"),
        ("kind: _http._tcp\nport: '80'", "port", "1-65535"),
        ("kind: _http._tcp\nport: true", "port", "1-65535"),
        ("kind: _http._tcp\ntxtRecords: [a]", "txtRecords", "mapping"),
        ("kind: _http._tcp\ntxtRecords: {a: [1]}", "txtRecords.a", "string, number or null"),
        ("kind: _http._tcp\ntxtRecords: {1: a}", "txtRecords", "keys must be strings"),
        ("kind: [_http", None, "not valid YAML"),
    ],
)
def test_bad_details_name_the_field(text: str, field: str | None, fragment: str) -> None:
    with pytest.raises(InvalidDetails) as info:
        parse_details(text)
    assert info.value.field == field, str(info.value)
    assert fragment in str(info.value)


def test_filters() -> None:
    base = ZeroconfDetails(kinds=("_http._tcp",))
    s = svc("dev-1", 8080, ("Model", "X1"), ("flag", None), ("model", "shadowed"))
    assert matches(base, s)
    assert not matches(ZeroconfDetails(kinds=("_ipp._tcp",)), s)
    assert matches(ZeroconfDetails(kinds=("_HTTP._tcp",)), s)  # DNS names ignore case
    for pattern, ok in [("dev-[0-9]", True), ("dev", False), ("DEV-1", False), (".*", True)]:
        assert matches(attrs_evolve(base, name=Regex(pattern)), s) is ok, pattern
    assert matches(attrs_evolve(base, host=Regex(r"dev\.local")), s)
    assert matches(attrs_evolve(base, host=Regex(r"10\.0\.0\.1")), s)  # or an address
    assert not matches(attrs_evolve(base, host=Regex("dev")), s)
    assert matches(attrs_evolve(base, port=8080), s)
    assert not matches(attrs_evolve(base, port=80), s)
    assert matches(attrs_evolve(base, txt_records=(("model", "X1"),)), s)  # first wins
    assert not matches(attrs_evolve(base, txt_records=(("model", "shadowed"),)), s)
    assert matches(attrs_evolve(base, txt_records=(("flag", None),)), s)
    assert not matches(attrs_evolve(base, txt_records=(("flag", ""),)), s)
    assert not matches(attrs_evolve(base, txt_records=(("missing", None),)), s)


def attrs_evolve(details: ZeroconfDetails, **changes: Any) -> ZeroconfDetails:
    import attrs

    return attrs.evolve(details, **changes)


@given(st.text(alphabet="abc-.", max_size=8), st.text(alphabet="abc-.", max_size=8))
def test_name_filter_is_a_full_regex_match(instance: str, pattern: str) -> None:
    details = ZeroconfDetails(kinds=("_http._tcp",), name=Regex(re.escape(pattern)))
    assert matches(details, svc(instance)) is (instance == pattern)


@given(st.text(min_size=1, max_size=12))
def test_env_key_is_a_valid_env_name(key: str) -> None:
    name = env_key(key)
    assert re.fullmatch(r"AKRI_ZEROCONF_DEVICE_[A-Z0-9_]+", name)
    assert len(name) == len("AKRI_ZEROCONF_DEVICE_") + len(key.upper())


def test_properties_fixed_names_win_and_empty_values() -> None:
    s = svc(
        "dev",
        631,
        ("port", "9999"),
        ("fw.version", "2"),
        ("flag", None),
        addresses="10.0.0.7,fd00::7",
    )
    assert properties_of(s) == {
        zh.KIND: "_http._tcp",
        zh.INSTANCE: "dev",
        zh.HOST: "dev.local",
        zh.ADDR: "10.0.0.7",
        zh.ADDRESSES: "10.0.0.7,fd00::7",
        zh.PORT: "631",
        "AKRI_ZEROCONF_DEVICE_FW_VERSION": "2",
        "AKRI_ZEROCONF_DEVICE_FLAG": "",
    }


def test_ordered_addresses_and_instance_names() -> None:
    assert ordered_addresses(["fd00::1", "10.0.0.9", "10.0.0.10", "10.0.0.9"]) == (
        "10.0.0.9",
        "10.0.0.10",
        "fd00::1",
    )
    assert instance_name("My Printer._ipp._tcp.local.", "_ipp._tcp.local.") == "My Printer"
    assert instance_name("a.b._ipp._tcp.local.", "_IPP._tcp.local.") == "a.b"


def test_devices_are_sorted_filtered_and_keyed_by_full_name() -> None:
    details = ZeroconfDetails(kinds=("_http._tcp",), port=80)
    devices = devices_for(details, [svc("b"), svc("a"), svc("c", 81)])
    assert [d.id for d in devices] == ["a._http._tcp.local.", "b._http._tcp.local."]


def test_from_env() -> None:
    assert zh.Zeroconf.from_env({}).interfaces is None
    handler = zh.Zeroconf.from_env({zh.INTERFACES_ENV: "127.0.0.1, eth0"})
    assert handler.interfaces == ("127.0.0.1", "eth0")
    assert (handler.name, handler.shared) == ("zeroconf", True)


@pytest.mark.parametrize("example", ["zeroconf.yaml", "opcua.yaml"])
def test_k8s_examples_parse(example: str) -> None:
    from akri_trio.discovery.handlers import opcua

    doc = yaml.safe_load((EXAMPLES / example).read_text())
    handler = doc["spec"]["discoveryHandler"]
    parse = {"zeroconf": parse_details, "opcua": opcua.parse_details}[handler["name"]]
    parse(handler["discoveryDetails"])


@pytest.mark.parametrize("field", ["name", "host"])
@pytest.mark.parametrize("regex", ["(a+)+b", "(a|aa)*b"])
def test_catastrophic_name_and_host_filters_return_at_once(field: str, regex: str) -> None:
    import time

    details = parse_details(f"kind: _http._tcp\n{field}: '{regex}'")
    hostile = "a" * 40  # Python's `re` backtracks for hours here
    service = Service(
        f"{hostile}._http._tcp.local.", "_http._tcp", hostile, hostile, ("10.0.0.1",), 80
    )
    start = time.perf_counter()
    assert not matches(details, service)
    assert time.perf_counter() - start < 3.0  # backtracking takes hours; linear, microseconds


def test_lookaround_is_refused_as_re2_cannot_do_it_in_linear_time() -> None:
    with pytest.raises(InvalidDetails, match="name: is not a valid regular expression"):
        parse_details("kind: _http._tcp\nname: '(?=a)a'")
