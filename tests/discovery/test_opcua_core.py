"""opcua's pure core: discoveryDetails as upstream writes them, the URL choice
(first opc.tcp, the #624 host rebuild), de-duplication and the device shape."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.filters import FilterList
from akri_trio.discovery.handlers import opcua
from akri_trio.discovery.handlers.opcua import (
    APPLICATION_TYPE_SERVER,
    DEFAULT_DISCOVERY_URLS,
    PROPERTY,
    Application,
    Opcua,
    OpcuaDetails,
    ServerPlan,
    devices_for,
    endpoint_of,
    host_allowed,
    merged,
    on_lds_host,
    parse_details,
    plan_server,
    preferred_url,
    selected_urls,
)
from akri_trio.discovery.interface import InvalidDetails
from akri_trio.model.device import Device

# ---- details --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "opcuaDiscoveryMethod:\n  standard: {}",
        "opcuaDiscoveryMethod:\n  standard:",
        "opcuaDiscoveryMethod: {standard: {discoveryUrls: null}}",
        '{"opcuaDiscoveryMethod": {"standard": {}}}',
    ],
)
def test_default_discovery_url_is_the_local_lds(text: str) -> None:
    assert parse_details(text) == OpcuaDetails(DEFAULT_DISCOVERY_URLS, None)
    assert DEFAULT_DISCOVERY_URLS == ("opc.tcp://localhost:4840/",)


def test_full_details_and_filter_defaults() -> None:
    text = """
    opcuaDiscoveryMethod:
      standard:
        discoveryUrls: [opc.tcp://10.0.0.1:4840/, "opc.tcp://lds.example:50000", opc.tcp://h]
    applicationNames:
      items: [a, b]
    ignoredByUpstreamToo: 1
    """
    assert parse_details(text) == OpcuaDetails(
        ("opc.tcp://10.0.0.1:4840/", "opc.tcp://lds.example:50000", "opc.tcp://h"),
        FilterList(("a", "b"), "Include"),
    )
    exclude = parse_details(
        "opcuaDiscoveryMethod: {standard: {discoveryUrls: []}}\n"
        "applicationNames: {items: [], action: Exclude}"
    )
    assert exclude == OpcuaDetails((), FilterList((), "Exclude"))


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("", "opcuaDiscoveryMethod", "is required"),
        ("applicationNames: {items: [a]}", "opcuaDiscoveryMethod", "is required"),
        ("opcuaDiscoveryMethod: standard", "opcuaDiscoveryMethod", "one key: standard"),
        ("opcuaDiscoveryMethod: {}", "opcuaDiscoveryMethod", "one key: standard"),
        ("opcuaDiscoveryMethod: {scan: {}}", "opcuaDiscoveryMethod", "unknown method 'scan'"),
        (
            "opcuaDiscoveryMethod: {standard: {}, scan: {}}",
            "opcuaDiscoveryMethod",
            "one key",
        ),
        ("opcuaDiscoveryMethod: {standard: [a]}", "opcuaDiscoveryMethod.standard", "mapping"),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: opc.tcp://h:1/}}",
            "opcuaDiscoveryMethod.standard.discoveryUrls",
            "must be a list of strings",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: [opc.tcp://h:1/, 7]}}",
            "opcuaDiscoveryMethod.standard.discoveryUrls[1]",
            "must be a string",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['http://h:1/']}}",
            "opcuaDiscoveryMethod.standard.discoveryUrls[0]",
            "opc.tcp://host",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp:///path']}}",
            "opcuaDiscoveryMethod.standard.discoveryUrls[0]",
            "opc.tcp://host",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://h:99999/']}}",
            "opcuaDiscoveryMethod.standard.discoveryUrls[0]",
            "port",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['10.0.0.1:4840']}}",
            "opcuaDiscoveryMethod.standard.discoveryUrls[0]",
            "opc.tcp://host",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {}}\napplicationNames: [a]",
            "applicationNames",
            "must be a mapping",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {}}\napplicationNames: {action: Include}",
            "applicationNames.items",
            "is required",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {}}\napplicationNames: {items: a}",
            "applicationNames.items",
            "must be a list of strings",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {}}\napplicationNames: {items: [a], action: include}",
            "applicationNames.action",
            "must be Include or Exclude, got 'include'",
        ),
        ("opcuaDiscoveryMethod: {standard: {}", None, "not valid YAML"),
    ],
)
def test_bad_details_name_the_field(text: str, field: str | None, fragment: str) -> None:
    with pytest.raises(InvalidDetails) as info:
        parse_details(text)
    assert info.value.field == field, str(info.value)
    assert fragment in str(info.value)


def test_handler_identity_and_env() -> None:
    handler = Opcua.from_env({})
    assert (handler.name, handler.shared, handler.poll_interval) == ("opcua", True, 10.0)
    assert Opcua.from_env({opcua.INTERVAL_ENV: "2.5"}).poll_interval == 2.5
    for bad in ("soon", "0", "-1"):
        with pytest.raises(ValueError, match=opcua.INTERVAL_ENV):
            Opcua.from_env({opcua.INTERVAL_ENV: bad})


def test_registered_in_builtin() -> None:
    from akri_trio.discovery.handlers import BUILTIN, load_handler

    if "opcua" not in BUILTIN:
        pytest.skip("the lead adds opcua to BUILTIN")
    assert isinstance(load_handler("opcua", {}), Opcua)


# ---- URL choice -----------------------------------------------------------------------------


def app(name: str, *urls: str, kind: int = APPLICATION_TYPE_SERVER) -> Application:
    return Application(name, kind, urls)


def test_preferred_url_is_the_first_opc_tcp_else_the_first() -> None:
    assert preferred_url(app("s", "https://h/x", "opc.tcp://h:1/a", "opc.tcp://h:2/")) == (
        "opc.tcp://h:1/a"
    )
    assert preferred_url(app("s", "OPC.TCP://h:1/")) == "OPC.TCP://h:1/"
    assert preferred_url(app("s", "https://h/x", "opc.wss://h/")) == "https://h/x"
    assert preferred_url(app("s")) is None


def test_selected_urls_keeps_servers_passing_the_filter() -> None:
    apps = [
        app("a", "opc.tcp://h:1/"),
        app("client", "opc.tcp://h:2/", kind=1),
        app("both", "opc.tcp://h:3/", kind=2),
        app("lds", "opc.tcp://h:4/", kind=3),
        app("nourl"),
        app("b", "https://h:5/", "opc.tcp://h:6/"),
    ]
    assert selected_urls(apps, None) == ["opc.tcp://h:1/", "opc.tcp://h:6/"]
    assert selected_urls(apps, FilterList(("b", "client"))) == ["opc.tcp://h:6/"]
    assert selected_urls(apps, FilterList(("b",), "Exclude")) == ["opc.tcp://h:1/"]


@pytest.mark.parametrize(
    ("url", "lds", "expected"),
    [
        # upstream #624: the container's hostname, the LDS is the server itself
        (
            "opc.tcp://9a0f4aa79791:50000/",
            "opc.tcp://172.20.71.120:50000/",
            "opc.tcp://172.20.71.120:50000/",
        ),
        # registered with an LDS elsewhere: the server keeps its own port and path
        (
            "opc.tcp://plc-7:4855/OPCUA/Sim",
            "opc.tcp://10.1.2.3:4840/",
            "opc.tcp://10.1.2.3:4855/OPCUA/Sim",
        ),
        ("opc.tcp://plc-7/x", "opc.tcp://10.1.2.3:4840/", "opc.tcp://10.1.2.3/x"),
        ("opc.tcp://plc-7:1/", "opc.tcp://[fd00::5]:4840/", "opc.tcp://[fd00::5]:1/"),
        ("opc.tcp://[fe80::1]:7/p", "opc.tcp://lds:4840", "opc.tcp://lds:7/p"),
    ],
)
def test_on_lds_host(url: str, lds: str, expected: str) -> None:
    assert on_lds_host(url, lds) == expected


hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5})?", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda ip: f"[{ip}]"),
)
ports = st.none() | st.integers(1, 65535)
paths = st.from_regex(r"(/[A-Za-z0-9_.-]{0,8}){0,3}", fullmatch=True)


def url_of(host: str, port: int | None, path: str) -> str:
    return f"opc.tcp://{host}{'' if port is None else f':{port}'}{path}"


@given(hosts, ports, paths, hosts, ports, paths)
def test_on_lds_host_takes_only_the_host(
    host: str, port: int | None, path: str, lds_host: str, lds_port: int | None, lds_path: str
) -> None:
    rebuilt = urlsplit(on_lds_host(url_of(host, port, path), url_of(lds_host, lds_port, lds_path)))
    assert rebuilt.hostname == urlsplit(f"x://{lds_host}").hostname
    assert rebuilt.port == port
    assert rebuilt.path == path
    assert rebuilt.scheme == "opc.tcp"


@given(hosts, ports, paths)
def test_endpoint_of_defaults_to_4840(host: str, port: int | None, path: str) -> None:
    target = endpoint_of(url_of(host, port, path))
    assert target is not None
    assert target[1] == (4840 if port is None else port)
    assert endpoint_of(f"https://{host}/") is None


@given(st.lists(st.lists(st.sampled_from("abcdef"), max_size=6), max_size=4))
def test_merged_keeps_first_occurrences_in_order(lists: list[list[str]]) -> None:
    out = merged(lists)
    flat = [x for xs in lists for x in xs]
    assert len(out) == len(set(out))
    assert set(out) == set(flat)
    assert out == sorted(set(flat), key=flat.index)


def test_devices_carry_the_url_as_id_and_property() -> None:
    assert devices_for(["opc.tcp://h:1/"]) == [
        Device("opc.tcp://h:1/", {PROPERTY: "opc.tcp://h:1/"})
    ]
    assert PROPERTY == "OPCUA_DISCOVERY_URL"


# ---- not a port scanner (issue 8, item 14) -----------------------------------------------------


def test_listed_servers_must_be_on_an_allowed_host() -> None:
    lds = "opc.tcp://10.0.0.5:4840/"
    assert host_allowed("opc.tcp://10.0.0.5:50000/x", lds, ())
    assert host_allowed("opc.tcp://LDS.example:1/", "opc.tcp://lds.EXAMPLE/", ())
    assert not host_allowed("opc.tcp://10.0.0.6:22/", lds, ())
    assert not host_allowed("opc.tcp://169.254.169.254:80/", lds, ())
    assert host_allowed("opc.tcp://10.0.0.6:4840/", lds, ("10.0.0.6",))
    assert host_allowed("opc.tcp://[fd00::6]:4840/", lds, ("fd00::6",))
    assert host_allowed("opc.tcp://anywhere:4840/", lds, ("*",))
    assert not host_allowed("garbage", lds, ())


def test_allowed_hosts_in_details() -> None:
    text = "opcuaDiscoveryMethod: {standard: {}}\nallowedHosts: [PLC-1, '[fd00::6]']"
    assert parse_details(text).allowed_hosts == ("plc-1", "fd00::6")
    with pytest.raises(InvalidDetails, match="allowedHosts"):
        parse_details("opcuaDiscoveryMethod: {standard: {}}\nallowedHosts: 5")
    assert Opcua.from_env({"OPCUA_PROBE_CONCURRENCY": "3"}).probe_concurrency == 3


# ---- listed names are resolved only when they may be probed (issue 21 item 12) ----------------

LDS = "opc.tcp://10.0.0.5:4840/"


@pytest.mark.parametrize(
    ("url", "allowed", "plan"),
    [
        # IP addresses and the discovery URL's own host need no lookup
        ("opc.tcp://10.0.0.5:50000/a", (), ServerPlan("opc.tcp://10.0.0.5:50000/a")),
        ("opc.tcp://10.0.0.6:50000/a", (), ServerPlan(None)),
        ("opc.tcp://[fd00::6]:1/", ("fd00::6",), ServerPlan("opc.tcp://[fd00::6]:1/")),
        ("opc.tcp://LDS.example:1/", (), ServerPlan("opc.tcp://LDS.example:1/")),
        # a dotted name the filter does not allow: left out, never looked up
        ("opc.tcp://exfil.attacker.example:1/", (), ServerPlan(None)),
        ("opc.tcp://a.b:1/", ("c.d",), ServerPlan(None)),
        # an allowed name: looked up; not resolving, it stands for the discovery server's host
        (
            "opc.tcp://plc.example:4841/x",
            ("plc.example",),
            ServerPlan("opc.tcp://plc.example:4841/x", "plc.example", "opc.tcp://10.0.0.5:4841/x"),
        ),
        (
            "opc.tcp://any.where:1/",
            ("*",),
            ServerPlan("opc.tcp://any.where:1/", "any.where", "opc.tcp://10.0.0.5:1/"),
        ),
        # a container's hostname (one label, #624): looked up, used on the LDS host if unknown
        (
            "opc.tcp://9a0f4aa79791:50000/",
            (),
            ServerPlan(None, "9a0f4aa79791", "opc.tcp://10.0.0.5:50000/"),
        ),
        ("garbage", (), ServerPlan(None)),
    ],
)
def test_plan_server_resolves_only_what_may_be_probed(
    url: str, allowed: tuple[str, ...], plan: ServerPlan
) -> None:
    lds = "opc.tcp://lds.example/" if "LDS.example" in url else LDS
    assert plan_server(url, lds, allowed) == plan


async def test_listed_names_the_filter_drops_are_never_looked_up() -> None:
    looked_up: list[str] = []

    async def resolve(host: str) -> bool:
        looked_up.append(host)
        return host == "plc.example"

    handler = Opcua(probe_servers=False, resolve=resolve)
    details = OpcuaDetails(discovery_urls=(LDS,), allowed_hosts=("plc.example", "gone.example"))
    listed = {
        "opc.tcp://10.0.0.5:50000/": "opc.tcp://10.0.0.5:50000/",
        "opc.tcp://plc.example:4840/": "opc.tcp://plc.example:4840/",
        "opc.tcp://gone.example:4841/": "opc.tcp://10.0.0.5:4841/",
        "opc.tcp://container1:4842/": "opc.tcp://10.0.0.5:4842/",
        "opc.tcp://169.254.169.254:80/": None,
        **{f"opc.tcp://n{i}.exfil.example:1/": None for i in range(100)},
    }
    for url, expected in listed.items():
        assert await handler._usable_now(url, LDS, details) == expected
    assert looked_up == ["plc.example", "gone.example", "container1"]
