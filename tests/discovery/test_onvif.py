"""The onvif handler's pure cores: Probe building, ProbeMatch parsing (real-world replies with
assorted prefixes), filters, credentials, details, ids and properties. No sockets here."""

from __future__ import annotations

import base64
import json
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from akri_trio.discovery.filters import FilterList
from akri_trio.discovery.handlers.onvif import (
    DEVICE_UUID,
    IP_ADDRESS,
    MAC_ADDRESS,
    SERVICE_URL,
    Onvif,
    OnvifDetails,
    device_id,
    facts_filter,
    parse_details,
    passes_filter,
    passes_scopes,
    passes_uuid,
    probe_filter,
    to_device,
)
from akri_trio.discovery.handlers.onvif_device import (
    Credential,
    DeviceFacts,
    NetworkInterface,
    choose_address,
    credential_for,
    resolve_credentials,
)
from akri_trio.discovery.handlers.onvif_probe import (
    IFF_LOOPBACK,
    IFF_MULTICAST,
    IFF_RUNNING,
    IFF_UP,
    MAX_XADDRS,
    Interface,
    ProbeMatch,
    answers,
    choose_interfaces,
    from_source,
    merge_matches,
    multicast_addresses,
    normalize_uuid,
    parse_probe_matches,
    parse_probe_reply,
    probe_message,
)
from akri_trio.discovery.interface import InvalidDetails

# ---- Probe --------------------------------------------------------------------------------------


def test_probe_declares_every_prefix_it_uses() -> None:
    """Upstream #486: `netwsdl:` used but never declared. Resolve the QName in Types against
    the element's own in-scope namespaces, as a strict device would."""
    root = etree.fromstring(probe_message("urn:uuid:1234"))
    types = root.find(".//{http://schemas.xmlsoap.org/ws/2005/04/discovery}Types")
    prefix, local = types.text.split(":")
    assert types.nsmap[prefix] == "http://www.onvif.org/ver10/network/wsdl"
    assert local == "NetworkVideoTransmitter"
    a = "{http://schemas.xmlsoap.org/ws/2004/08/addressing}"
    assert root.findtext(f".//{a}MessageID") == "urn:uuid:1234"
    assert root.findtext(f".//{a}Action") == (
        "http://schemas.xmlsoap.org/ws/2005/04/discovery/Probe"
    )
    assert root.findtext(f".//{a}To") == "urn:schemas-xmlsoap-org:ws:2005:04:discovery"
    assert root.tag == "{http://www.w3.org/2003/05/soap-envelope}Envelope"


def test_probe_is_understood_by_an_independent_ws_discovery_stack() -> None:
    """WSDiscovery (PyPI) parses our Probe into the type we ask for."""
    from wsdiscovery.message import parseSOAPMessage

    env = parseSOAPMessage(probe_message("urn:uuid:42"), "192.0.2.9")
    assert env.getAction() == "http://schemas.xmlsoap.org/ws/2005/04/discovery/Probe"
    [qname] = env.getTypes()
    assert qname.getNamespace() == "http://www.onvif.org/ver10/network/wsdl"
    assert qname.getLocalname() == "NetworkVideoTransmitter"


# ---- ProbeMatch: replies from real cameras, as quoted in public repositories --------------------

# (line breaks inside <Scopes> added to fit the line length; tokens unchanged)
TAPO_C200 = b"""<?xml version="1.0" encoding="UTF-8"?>
<SOAP-ENV:Envelope xmlns:SOAP-ENV="http://www.w3.org/2003/05/soap-envelope"
 xmlns:wsa="http://schemas.xmlsoap.org/ws/2004/08/addressing"
 xmlns:wsdd="http://schemas.xmlsoap.org/ws/2005/04/discovery"
 xmlns:tdn="http://www.onvif.org/ver10/network/wsdl">
<SOAP-ENV:Header>
 <wsa:MessageID>uuid:a86f9421-b764-4256-8762-5ed0d8602a9c</wsa:MessageID>
 <wsa:RelatesTo>uuid:a86f9421-b764-4256-8762-5ed0d8602a9c</wsa:RelatesTo>
 <wsa:Action SOAP-ENV:mustUnderstand="true">http://schemas.xmlsoap.org/ws/2005/04/discovery/ProbeMatches</wsa:Action>
</SOAP-ENV:Header>
<SOAP-ENV:Body><wsdd:ProbeMatches><wsdd:ProbeMatch>
 <wsa:EndpointReference>
  <wsa:Address>uuid:3fa1fe68-b915-4053-a3e1-c006c3afec0e</wsa:Address>
  <wsa:ReferenceProperties></wsa:ReferenceProperties>
  <wsa:PortType>ttl</wsa:PortType>
 </wsa:EndpointReference>
 <wsdd:Types>tdn:NetworkVideoTransmitter</wsdd:Types>
 <wsdd:Scopes>onvif://www.onvif.org/name/TP-IPC onvif://www.onvif.org/hardware/MODEL
 onvif://www.onvif.org/Profile/Streaming onvif://www.onvif.org/location/ShenZhen
 onvif://www.onvif.org/type/NetworkVideoTransmitter </wsdd:Scopes>
 <wsdd:XAddrs>http://192.168.12.128:2020/onvif/device_service</wsdd:XAddrs>
 <wsdd:MetadataVersion>1</wsdd:MetadataVersion>
</wsdd:ProbeMatch></wsdd:ProbeMatches></SOAP-ENV:Body></SOAP-ENV:Envelope>"""

# Upper-case hex in the uuid, tdn prefix, no whitespace.
GENERIC_NVT = (
    b'<?xml version="1.0" encoding="utf-8"?><SOAP-ENV:Envelope'
    b' xmlns:tdn="http://www.onvif.org/ver10/network/wsdl"'
    b' xmlns:wsa="http://schemas.xmlsoap.org/ws/2004/08/addressing"'
    b' xmlns:wsdd="http://schemas.xmlsoap.org/ws/2005/04/discovery"'
    b' xmlns:SOAP-ENV="http://www.w3.org/2003/05/soap-envelope"><SOAP-ENV:Header>'
    b"<wsa:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/ProbeMatches</wsa:Action>"
    b"<wsa:RelatesTo>uuid:759a9a95-610f-40a9-bf26-fe2c2836ed50</wsa:RelatesTo>"
    b"</SOAP-ENV:Header><SOAP-ENV:Body><wsdd:ProbeMatches><wsdd:ProbeMatch>"
    b"<wsa:EndpointReference><wsa:Address>urn:uuid:4fe963b6-e06a-409b-8000-3C970E326186"
    b"</wsa:Address></wsa:EndpointReference><wsdd:Types>tdn:NetworkVideoTransmitter</wsdd:Types>"
    b"<wsdd:Scopes>onvif://www.onvif.org/type/NetworkVideoTransmitter</wsdd:Scopes>"
    b"<wsdd:XAddrs>http://192.168.10.183:8080/onvif/device_service</wsdd:XAddrs>"
    b"<wsdd:MetadataVersion>10</wsdd:MetadataVersion></wsdd:ProbeMatch></wsdd:ProbeMatches>"
    b"</SOAP-ENV:Body></SOAP-ENV:Envelope>"
)

# RelatesTo that matches nothing we sent; `discows` prefix; two XAddrs.
NVT_BROKEN_RELATES_TO = b"""<?xml version="1.0" encoding="UTF-8"?>
<SOAP-ENV:Envelope xmlns:SOAP-ENV="http://www.w3.org/2003/05/soap-envelope"
 xmlns:wsa="http://schemas.xmlsoap.org/ws/2004/08/addressing"
 xmlns:wsdd="http://schemas.xmlsoap.org/ws/2005/04/discovery"
 xmlns:discows="http://www.onvif.org/ver10/network/wsdl">
  <SOAP-ENV:Header>
    <wsa:MessageID>urn:uuid:5928e397-6df7-4673-8000-12db0000153c</wsa:MessageID>
    <wsa:RelatesTo>uuid:NetworkVideoTransmitter</wsa:RelatesTo>
    <wsdd:AppSequence MessageNumber="8" InstanceId="0"/>
  </SOAP-ENV:Header>
  <SOAP-ENV:Body>
    <wsdd:ProbeMatches>
      <wsdd:ProbeMatch>
        <wsa:EndpointReference>
          <wsa:Address>urn:uuid:5928d907-1787-49f8-8000-002900004823</wsa:Address>
        </wsa:EndpointReference>
        <wsdd:Types>discows:NetworkVideoTransmitter</wsdd:Types>
        <wsdd:Scopes>onvif://www.onvif.org/Profile/Streaming onvif://www.onvif.org/name/NVT</wsdd:Scopes>
        <wsdd:XAddrs>http://192.168.1.51:8004 http://[fe80::1]:8004</wsdd:XAddrs>
        <wsdd:MetadataVersion>1</wsdd:MetadataVersion>
      </wsdd:ProbeMatch>
    </wsdd:ProbeMatches>
  </SOAP-ENV:Body>
</SOAP-ENV:Envelope>"""

# No EndpointReference at all (a cheap camera): no uuid, so no id; skipped.
NO_ENDPOINT_REFERENCE = (
    b'<?xml version="1.0" encoding="UTF-8"?><SOAP-ENV:Envelope'
    b' xmlns:SOAP-ENV="http://www.w3.org/2003/05/soap-envelope"'
    b' xmlns:wsdd="http://schemas.xmlsoap.org/ws/2005/04/discovery"><SOAP-ENV:Body>'
    b"<wsdd:ProbeMatches><wsdd:ProbeMatch><wsdd:XAddrs>http://192.168.1.129:8899/onvif/"
    b"device_service</wsdd:XAddrs><wsdd:Scopes>onvif://www.onvif.org/name/IP-Camera"
    b"</wsdd:Scopes></wsdd:ProbeMatch></wsdd:ProbeMatches></SOAP-ENV:Body></SOAP-ENV:Envelope>"
)

# Default namespaces instead of prefixes, WS-Discovery 1.1 namespace.
DEFAULT_NAMESPACES = b"""<Envelope xmlns="http://www.w3.org/2003/05/soap-envelope"><Body>
<ProbeMatches xmlns="http://docs.oasis-open.org/ws-dd/ns/discovery/2009/01"><ProbeMatch>
<EndpointReference xmlns="http://www.w3.org/2005/08/addressing"><Address>urn:uuid:ABC</Address>
</EndpointReference><Scopes>a b</Scopes><XAddrs>http://10.0.0.1/onvif/device_service</XAddrs>
</ProbeMatch></ProbeMatches></Body></Envelope>"""


def test_tapo_c200() -> None:
    [m] = parse_probe_matches(TAPO_C200)
    assert m.uuid == "3fa1fe68-b915-4053-a3e1-c006c3afec0e"
    assert m.address == "uuid:3fa1fe68-b915-4053-a3e1-c006c3afec0e"
    assert m.xaddrs == ("http://192.168.12.128:2020/onvif/device_service",)
    assert "onvif://www.onvif.org/location/ShenZhen" in m.scopes
    assert len(m.scopes) == 5  # the trailing space makes no empty token
    assert m.types == ("tdn:NetworkVideoTransmitter",)


def test_upper_case_uuid_is_lowered() -> None:
    [m] = parse_probe_matches(GENERIC_NVT)
    assert m.uuid == "4fe963b6-e06a-409b-8000-3c970e326186"


def test_a_reply_names_what_it_relates_to() -> None:
    reply = parse_probe_reply(NVT_BROKEN_RELATES_TO)
    assert reply.relates_to == "uuid:NetworkVideoTransmitter"
    [m] = reply.matches
    assert m.uuid == "5928d907-1787-49f8-8000-002900004823"
    assert m.xaddrs == ("http://192.168.1.51:8004", "http://[fe80::1]:8004")
    assert parse_probe_reply(DEFAULT_NAMESPACES).relates_to is None


@given(st.uuids().map(str), st.sampled_from(["", "uuid:", "urn:uuid:", "URN:UUID:"]), st.booleans())
def test_answers_compares_relates_to_as_uuids(u: str, prefix: str, upper: bool) -> None:
    ours = f"urn:uuid:{u}"
    assert answers(prefix + (u.upper() if upper else u), ours)
    assert answers(f"uuid:{{{u}}}", ours)
    assert not answers(None, ours)
    assert not answers("", ours)
    assert not answers("uuid:NetworkVideoTransmitter", ours)
    assert not answers(f"urn:uuid:{u}0", ours)


def test_match_without_endpoint_reference_is_skipped() -> None:
    assert parse_probe_matches(NO_ENDPOINT_REFERENCE) == []


def test_default_namespaces_and_ws_discovery_1_1() -> None:
    [m] = parse_probe_matches(DEFAULT_NAMESPACES)
    assert (m.uuid, m.scopes) == ("abc", ("a", "b"))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not xml",
        b"<a/>",
        probe_message("urn:uuid:1"),  # our own Probe, looped back
        # a ProbeMatches element in the wrong namespace
        b'<e:Envelope xmlns:e="http://www.w3.org/2003/05/soap-envelope"><e:Body>'
        b'<x:ProbeMatches xmlns:x="urn:other"><x:ProbeMatch/></x:ProbeMatches></e:Body>'
        b"</e:Envelope>",
        # an entity expansion attempt
        b'<?xml version="1.0"?><!DOCTYPE e [<!ENTITY x "xxxxxxxx">]><e>&x;&x;</e>',
    ],
)
def test_non_matches_are_empty(data: bytes) -> None:
    assert parse_probe_matches(data) == []


@given(st.binary(max_size=300))
def test_parser_never_raises(data: bytes) -> None:
    assert isinstance(parse_probe_matches(data), list)


uuids = st.uuids().map(str)


@given(uuids, st.sampled_from(["", "uuid:", "urn:uuid:", "URN:UUID:"]), st.booleans())
def test_normalize_uuid(u: str, prefix: str, upper: bool) -> None:
    raw = prefix + (u.upper() if upper else u)
    assert normalize_uuid(raw) == u.lower()
    assert normalize_uuid(normalize_uuid(raw)) == u.lower()


matches = st.builds(
    ProbeMatch,
    uuid=st.sampled_from(["a", "b", "c"]),
    address=st.just("urn:uuid:x"),
    xaddrs=st.lists(st.sampled_from(["http://1", "http://2", "http://3"]), min_size=1).map(tuple),
    scopes=st.just(()),
)


@given(st.lists(matches))
def test_merge_dedupes_by_uuid_keeping_first_reply(ms: list[ProbeMatch]) -> None:
    merged = merge_matches(ms)
    assert set(merged) == {m.uuid for m in ms}
    for uuid, m in merged.items():
        firsts = [x for x in ms if x.uuid == uuid]
        first = tuple(dict.fromkeys(firsts[0].xaddrs))[:MAX_XADDRS]
        assert m.xaddrs[: len(first)] == first
        assert len(m.xaddrs) <= MAX_XADDRS
        assert len(set(m.xaddrs)) == len(m.xaddrs)  # each address once
        everything = {x for f in firsts for x in f.xaddrs}
        assert set(m.xaddrs) <= everything
        if len(everything) <= MAX_XADDRS:  # room for all: every other XAddr is appended
            assert set(m.xaddrs) == everything


# ---- interfaces ---------------------------------------------------------------------------------

OK = IFF_UP | IFF_RUNNING | IFF_MULTICAST


def test_multicast_addresses_picks_every_suitable_interface() -> None:
    interfaces = [
        Interface("lo", IFF_UP | IFF_RUNNING | IFF_LOOPBACK, "127.0.0.1"),
        Interface("eth0", OK, "192.0.2.2"),
        Interface("eth0", OK, "192.0.2.3"),  # a secondary address: its own subnet, probe it
        Interface("eth1", OK, "198.51.100.7"),
        Interface("cni0", IFF_UP | IFF_MULTICAST, "10.244.0.1"),  # no carrier
        Interface("tun0", IFF_UP | IFF_RUNNING, "10.8.0.1"),  # no multicast
        Interface("eth2", IFF_RUNNING | IFF_MULTICAST, "203.0.113.1"),  # down
        Interface("eth1", OK, "198.51.100.7"),  # listed twice
    ]
    assert multicast_addresses(interfaces) == ["192.0.2.2", "192.0.2.3", "198.51.100.7"]


def test_loopback_only_when_multicast_enabled_on_it() -> None:
    lo = Interface("lo", OK | IFF_LOOPBACK, "127.0.0.1")
    assert multicast_addresses([lo]) == ["127.0.0.1"]


# ---- filters ------------------------------------------------------------------------------------

actions = st.sampled_from(["Include", "Exclude"])
words = st.text(alphabet=string.ascii_letters + string.digits + ":.-/", min_size=1, max_size=12)


@given(st.lists(words, max_size=4), actions, st.lists(st.none() | words, max_size=3))
def test_equality_filter_is_case_insensitive_include_exclude(
    items: list[str], action: str, values: list[str | None]
) -> None:
    fl = FilterList(tuple(items), action)  # type: ignore[arg-type]
    hit = any(v is not None and v.lower() in {i.lower() for i in items} for v in values)
    assert passes_filter(fl, values) is (hit if action == "Include" else not hit)
    # case never matters
    swapped = [v.swapcase() if v else v for v in values]
    assert passes_filter(fl, swapped) is passes_filter(fl, values)
    # Include and Exclude are complements; no filter passes everything
    other = FilterList(tuple(items), "Exclude" if action == "Include" else "Include")
    assert passes_filter(other, values) is not passes_filter(fl, values)
    assert passes_filter(None, values)


@given(st.lists(words, max_size=4), actions, st.lists(words, max_size=4))
def test_scope_filter_is_exact_token_match(
    items: list[str], action: str, scopes: list[str]
) -> None:
    fl = FilterList(tuple(items), action)  # type: ignore[arg-type]
    hit = bool(set(items) & set(scopes))
    assert passes_scopes(fl, scopes) is (hit if action == "Include" else not hit)


def test_scope_filter_examples() -> None:
    fl = FilterList(("onvif://www.onvif.org/name/TP-IPC",))
    [m] = parse_probe_matches(TAPO_C200)
    assert passes_scopes(fl, m.scopes)
    assert not passes_scopes(FilterList(("onvif://www.onvif.org/name/tp-ipc",)), m.scopes)
    assert not passes_scopes(FilterList(("onvif://www.onvif.org/name",)), m.scopes)  # no prefix
    assert not passes_scopes(
        FilterList(("onvif://www.onvif.org/name/TP-IPC",), "Exclude"), m.scopes
    )


@given(uuids, st.sampled_from(["", "uuid:", "urn:uuid:"]), st.booleans(), actions)
def test_uuid_filter_normalizes_both_sides(u: str, prefix: str, upper: bool, action: str) -> None:
    item = prefix + (u.upper() if upper else u)
    fl = FilterList((item,), action)  # type: ignore[arg-type]
    assert passes_uuid(fl, u) is (action == "Include")
    assert passes_uuid(fl, "urn:uuid:" + u) is (action == "Include")
    other = "00000000-0000-0000-0000-000000000000"
    if u != other:
        assert passes_uuid(fl, other) is (action == "Exclude")


def test_probe_and_facts_filters_compose() -> None:
    [m] = parse_probe_matches(TAPO_C200)
    details = OnvifDetails(
        scopes=FilterList(("onvif://www.onvif.org/Profile/Streaming",)),
        uuids=FilterList(("urn:uuid:3FA1FE68-B915-4053-A3E1-C006C3AFEC0E",)),
        ip_addresses=FilterList(("10.0.0.9",), "Exclude"),
        mac_addresses=FilterList(("aa:bb:cc:dd:ee:ff",)),
    )
    assert probe_filter(details, m)
    assert facts_filter(details, DeviceFacts("u", "10.0.0.1", "AA:BB:CC:DD:EE:FF"))
    assert not facts_filter(details, DeviceFacts("u", "10.0.0.9", "AA:BB:CC:DD:EE:FF"))
    # an Include on mac when the mac is unknown drops the device; an Exclude keeps it
    assert not facts_filter(details, DeviceFacts("u", "10.0.0.1", None))
    assert facts_filter(OnvifDetails(ip_addresses=FilterList(("x",), "Exclude")), DeviceFacts("u"))


# ---- ids and properties -------------------------------------------------------------------------


def test_device_id_and_properties() -> None:
    [m] = parse_probe_matches(GENERIC_NVT)
    url = m.xaddrs[0]
    d = to_device(m, DeviceFacts(url, "192.168.10.183", "00:11:22:33:44:55"))
    assert d.id == (
        "http://192.168.10.183:8080/onvif/device_service-4fe963b6-e06a-409b-8000-3c970e326186"
    )
    assert d.properties == {
        SERVICE_URL: url,
        DEVICE_UUID: "4fe963b6-e06a-409b-8000-3c970e326186",
        IP_ADDRESS: "192.168.10.183",
        MAC_ADDRESS: "00:11:22:33:44:55",
    }
    bare = to_device(m, DeviceFacts(url))
    assert set(bare.properties) == {SERVICE_URL, DEVICE_UUID}
    assert device_id("http://h/x", "urn:uuid:ABC") == "http://h/x-abc"


def test_choose_address_prefers_the_interface_carrying_the_service_host() -> None:
    ifaces = [
        NetworkInterface(True, "AA", ("10.0.0.5",)),
        NetworkInterface(True, "BB", ("192.168.1.7",)),
        NetworkInterface(False, "CC", ("192.168.1.8",)),
    ]
    assert choose_address(ifaces, "http://192.168.1.7/onvif/device_service") == (
        "192.168.1.7",
        "BB",
    )
    assert choose_address(ifaces, "http://192.168.1.8/x") == ("10.0.0.5", "AA")  # disabled
    assert choose_address([NetworkInterface(True, "DD", ())], "http://h/") == (None, "DD")
    assert choose_address([], "http://h/") == (None, None)


# ---- credentials --------------------------------------------------------------------------------

U1 = "5f5a69c2-e0ae-504f-829b-00fcdab169cc"
U2 = "6a67158b-42b1-400b-8afe-1bec9a5d7909"
U3 = "7a21dc67-8438-5588-1547-4d1349048438"


def _props(**values: str | bytes | None) -> dict[str, bytes | None]:
    return {k: v.encode() if isinstance(v, str) else v for k, v in values.items()}


def test_per_device_username_password() -> None:
    props = _props(
        **{f"username_{U1.replace('-', '_')}": "u1", f"password_{U1.replace('-', '_')}": "p1"}
    )
    creds = resolve_credentials(props)
    assert creds == {U1: Credential("u1", "p1")}
    assert credential_for(creds, f"urn:uuid:{U1.upper()}") == Credential("u1", "p1")
    assert credential_for(creds, U2) is None


def test_default_credential_is_the_fallback() -> None:
    creds = resolve_credentials(_props(username_default="admin", password_default="pw"))
    assert credential_for(creds, U2) == Credential("admin", "pw")
    # a username without a password is still a credential (password None)
    assert resolve_credentials(_props(username_default="admin")) == {
        "default": Credential("admin", None)
    }


def test_device_credential_list_with_base64() -> None:
    list1 = json.dumps(
        {
            U1: {"username": "uname_1", "password": "password_1"},
            U2: {"username": "uname_3", "password": "YWRtaW4=", "base64encoded": True},
        }
    )
    list2 = json.dumps({U3: {"username": "uname_2"}})
    props = _props(
        device_credential_list=json.dumps(["secret_list1", "secret_list2", "missing"]),
        secret_list1=list1,
        secret_list2=list2,
    )
    assert resolve_credentials(props) == {
        U1: Credential("uname_1", "password_1"),
        U2: Credential("uname_3", "admin"),
        U3: Credential("uname_2", None),
    }


def test_device_credential_ref_list() -> None:
    refs = json.dumps(
        {
            U1: {"username_ref": "device_1_username", "password_ref": "device_1_password"},
            U2: {"username_ref": "absent"},
            U3: {"username_ref": "device_3_username"},
        }
    )
    props = _props(
        device_credential_ref_list=json.dumps(["refs"]),
        refs=refs,
        device_1_username="user_foo",
        device_1_password="password_foo",
        device_3_username="user_bar",
    )
    assert resolve_credentials(props) == {
        U1: Credential("user_foo", "password_foo"),
        U3: Credential("user_bar", None),
    }


def test_precedence_matches_upstream() -> None:
    """list < ref list < username_<uuid>: later sources override for the same device."""
    key = U1.replace("-", "_")
    props = _props(
        device_credential_list=json.dumps(["l"]),
        l=json.dumps({U1: {"username": "from-list", "password": "a"}}),
        device_credential_ref_list=json.dumps(["r"]),
        r=json.dumps({U1: {"username_ref": "ru"}}),
        ru="from-ref",
    )
    assert resolve_credentials(props)[U1].username == "from-ref"
    props |= _props(**{f"username_{key}": "from-prop"})
    assert resolve_credentials(props)[U1].username == "from-prop"


@pytest.mark.parametrize(
    "props",
    [
        {"device_credential_list": b"not json"},
        {"device_credential_list": b'{"a": 1}'},
        {"device_credential_list": b'["l"]', "l": b"[1, 2]"},
        {"device_credential_list": b'["l"]', "l": b'{"x": {"password": "no user"}}'},
        {"device_credential_list": b'["l"]', "l": None},
        {"device_credential_ref_list": b'["r"]', "r": b'{"x": "y"}'},
        {"username_": b"nobody"},
        {f"username_{U1}": b"\xc8\xc8\xc8"},  # not UTF-8
        {"username_default": None},
    ],
)
def test_malformed_credentials_are_ignored(props: dict[str, bytes | None]) -> None:
    assert resolve_credentials(props) == {}


def test_bad_base64_password_becomes_none() -> None:
    props = _props(
        device_credential_list='["l"]',
        l=json.dumps({U1: {"username": "u", "password": "%%%", "base64encoded": True}}),
    )
    assert resolve_credentials(props) == {U1: Credential("u", None)}


def test_non_utf8_password_is_dropped_not_the_user() -> None:
    props = {f"username_{U1}": b"u", f"password_{U1}": b"\xc8\xc8"}
    assert resolve_credentials(props) == {U1: Credential("u", None)}


@given(st.dictionaries(st.text(max_size=20), st.none() | st.binary(max_size=40), max_size=8))
def test_resolve_credentials_never_raises(props: dict[str, bytes | None]) -> None:
    resolve_credentials(props)


@given(uuids, st.text(min_size=1, max_size=10), st.text(max_size=10))
def test_base64_round_trip(u: str, user: str, password: str) -> None:
    encoded = base64.b64encode(password.encode()).decode()
    props = _props(
        device_credential_list='["l"]',
        l=json.dumps({u: {"username": user, "password": encoded, "base64encoded": True}}),
    )
    assert credential_for(resolve_credentials(props), u) == Credential(user, password)


def test_credentials_are_not_in_reprs() -> None:
    assert "hunter2" not in repr(Credential("u", "hunter2"))


# ---- details ------------------------------------------------------------------------------------


def test_defaults() -> None:
    assert parse_details("") == OnvifDetails()
    assert parse_details("{}").discovery_timeout_seconds == 1


def test_full_details() -> None:
    details = parse_details(
        """
        ipAddresses: {items: [10.0.0.1], action: Exclude}
        macAddresses: {items: ["00:11:22:33:44:55"]}
        scopes: {items: ["onvif://www.onvif.org/name/x"], action: Include}
        uuids: {items: ["urn:uuid:abc"]}
        discoveryTimeoutSeconds: 3
        somethingElse: ignored
        """
    )
    assert details == OnvifDetails(
        ip_addresses=FilterList(("10.0.0.1",), "Exclude"),
        mac_addresses=FilterList(("00:11:22:33:44:55",)),
        scopes=FilterList(("onvif://www.onvif.org/name/x",)),
        uuids=FilterList(("urn:uuid:abc",)),
        discovery_timeout_seconds=3,
    )


def test_json_details() -> None:
    assert parse_details('{"discoveryTimeoutSeconds": 2}').discovery_timeout_seconds == 2


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("discoveryTimeoutSeconds: soon", "discoveryTimeoutSeconds"),
        ("discoveryTimeoutSeconds: 1.5", "discoveryTimeoutSeconds"),
        ("discoveryTimeoutSeconds: true", "discoveryTimeoutSeconds"),
        ("discoveryTimeoutSeconds: 0", "discoveryTimeoutSeconds"),
        ("discoveryTimeoutSeconds: -3", "discoveryTimeoutSeconds"),
        ("ipAddresses: [10.0.0.1]", "ipAddresses"),
        ("macAddresses: {action: Include}", "macAddresses.items"),
        ("scopes: {items: 3}", "scopes.items"),
        ("uuids: {items: [a, 3]}", "uuids.items[1]"),
        ("uuids: {items: [a], action: include}", "uuids.action"),
        ("ipAddresses: {items: [a], action: Drop}", "ipAddresses.action"),
        ("- a list", None),
        ("a: [", None),
    ],
)
def test_bad_details_name_the_field(text: str, field: str | None) -> None:
    with pytest.raises(InvalidDetails) as info:
        parse_details(text)
    assert info.value.field == field
    if field:
        assert str(info.value).startswith(f"discoveryDetails.{field}:")


def test_handler_identity_and_env() -> None:
    h = Onvif.from_env({})
    assert (h.name, h.shared, h.poll_interval) == ("onvif", True, 10.0)
    h = Onvif.from_env(
        {"ONVIF_POLL_INTERVAL_SECONDS": "2.5", "ONVIF_DEVICE_TIMEOUT_SECONDS": "nope"}
    )
    assert (h.poll_interval, h.device_timeout) == (2.5, 5.0)
    assert (h.max_matches, h.query_concurrency) == (256, 16)
    h = Onvif.from_env({"ONVIF_MAX_MATCHES": "40", "ONVIF_QUERY_CONCURRENCY": "3"})
    assert (h.max_matches, h.query_concurrency) == (40, 3)


def test_builtin_factory_path_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line the lead adds to BUILTIN works (set here only for this test)."""
    from akri_trio.discovery.handlers import BUILTIN, load_handler

    monkeypatch.setitem(BUILTIN, "onvif", "akri_trio.discovery.handlers.onvif:Onvif.from_env")
    assert isinstance(load_handler("onvif", {}), Onvif)


# ---- the loop -----------------------------------------------------------------------------------


async def test_rounds_follow_poll_interval_and_only_changes_are_sent(
    autojump_clock: object,
) -> None:
    """With no interface to probe from there is nothing to wait for (no window), so rounds
    start every poll_interval; the unchanged (empty) list goes out once."""
    import trio

    from akri_trio.discovery.handlers.onvif_device import device_document
    from akri_trio.discovery.interface import discover_changes
    from akri_trio.model.device import Device

    await device_document()  # parsed once per process, off the loop
    rounds: list[float] = []

    def no_interfaces() -> list[str]:
        rounds.append(trio.current_time())
        return []

    handler = Onvif(poll_interval=10.0, interfaces=no_interfaces)
    sent: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    with trio.move_on_after(35.5):
        await discover_changes(handler, parse_details("discoveryTimeoutSeconds: 2"), {}, send)
    start = rounds[0]
    assert [round(t - start, 6) for t in rounds] == [0.0, 10.0, 20.0, 30.0]
    assert sent == [[]]


# ---- hostile LANs: XAddrs from the sender only, no container interfaces -----------------------


def test_only_xaddrs_on_the_senders_address_are_kept() -> None:
    match = ProbeMatch(
        "u",
        "urn:uuid:u",
        (
            "http://192.0.2.9/onvif/device_service",
            "http://198.51.100.1:80/onvif/device_service",  # another host
            "http://cam.example/onvif/device_service",  # a name: cannot be tied to the sender
            "http://[2001:db8::1]/onvif",
            "not a url",
        ),
        (),
    )
    kept, dropped = from_source([match], "192.0.2.9")
    assert [m.xaddrs for m in kept] == [("http://192.0.2.9/onvif/device_service",)]
    assert dropped == list(match.xaddrs[1:])
    assert from_source([match], "198.51.100.7") == ([], list(match.xaddrs))
    assert from_source([match], "garbage") == ([], list(match.xaddrs))


def test_container_interfaces_are_skipped_unless_included() -> None:
    names = ["eth0", "docker0", "br-1a2b", "veth12ab", "cni0", "flannel.1", "cali123", "wlan0"]
    interfaces = [Interface(n, OK, f"192.0.2.{i}") for i, n in enumerate(names, 1)]
    assert [i.name for i in choose_interfaces(interfaces)] == ["eth0", "wlan0"]
    assert [i.name for i in choose_interfaces(interfaces, include=["docker0", "eth*"])] == [
        "eth0",
        "docker0",
    ]
    assert len(choose_interfaces(interfaces, exclude=())) == len(names)


def test_interface_options_from_the_environment() -> None:
    default = Onvif.from_env({})
    assert default.include_interfaces == () and "veth*" in default.exclude_interfaces
    chosen = Onvif.from_env({"ONVIF_INTERFACES": "eth1, bond*", "ONVIF_EXCLUDE_INTERFACES": "eth9"})
    assert chosen.include_interfaces == ("eth1", "bond*")
    assert chosen.exclude_interfaces == ("eth9",)
    assert Onvif.from_env({"ONVIF_EXCLUDE_INTERFACES": ""}).exclude_interfaces == ()
