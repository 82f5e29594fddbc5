"""The ONVIF device-service edge (zeep AsyncClient over httpx, bundled WSDL) against a device
service on a real socket.

No ONVIF device emulator is packaged on PyPI, npm or Debian (Debian's libonvif / onvif-tools
are clients), so `OnvifDeviceService` below is a small one written for these tests: h11 over a
trio TCP listener, lxml to read the request, and WS-Security UsernameToken digest verification
written from the OASIS spec (Base64(SHA-1(nonce + created + password))), independent of zeep's
own implementation. Its answers are ONVIF Core spec-shaped documents which the client decodes
through the bundled WSDL/XSD, so a schema or binding mismatch fails these tests.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import gzip
import hashlib
import logging
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import attrs
import h11
import pytest
import trio
from lxml import etree

from akri_trio.discovery.handlers.onvif import (
    Onvif,
    OnvifDetails,
    RefusalChanges,
    Refusals,
    next_refusals,
    parse_details,
    query_camera,
    refusal_problems,
    report_refused,
)
from akri_trio.discovery.handlers.onvif_device import (
    AnswerEncoded,
    AnswerTooLarge,
    AuthenticationFailed,
    Credential,
    DeviceFacts,
    device_document,
    open_device_client,
    resolve_credentials,
)
from akri_trio.discovery.handlers.onvif_probe import (
    ProbeMatch,
    ProbeReplies,
    new_message_id,
    probe_interfaces,
)
from akri_trio.discovery.interface import discover_changes
from akri_trio.model.device import Device

NS = {
    "s": "http://www.w3.org/2003/05/soap-envelope",
    "wsse": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd",
    "wsu": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd",
}
ENVELOPE = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<env:Envelope xmlns:env="http://www.w3.org/2003/05/soap-envelope"'
    ' xmlns:tds="http://www.onvif.org/ver10/device/wsdl"'
    ' xmlns:tt="http://www.onvif.org/ver10/schema"'
    ' xmlns:ter="http://www.onvif.org/ver10/error">'
    "<env:Body>{}</env:Body></env:Envelope>"
)
NOT_AUTHORIZED = (
    "<env:Fault><env:Code><env:Value>env:Sender</env:Value>"
    "<env:Subcode><env:Value>ter:NotAuthorized</env:Value></env:Subcode></env:Code>"
    '<env:Reason><env:Text xml:lang="en">Sender not Authorized</env:Text></env:Reason>'
    "</env:Fault>"
)
ENVELOPE_NOT_AUTHORIZED = ENVELOPE.format(NOT_AUTHORIZED)
# A Fault with no authentication subcode, as cameras answer a token they do not like.
ENVELOPE_SENDER_FAULT = ENVELOPE.format(
    "<env:Fault><env:Code><env:Value>env:Sender</env:Value></env:Code>"
    '<env:Reason><env:Text xml:lang="en">Unauthorized</env:Text></env:Reason></env:Fault>'
)
DIGEST_TYPE = (
    "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0"
    "#PasswordDigest"
)


def _date_time(now: dt.datetime) -> str:
    return (
        "<tds:GetSystemDateAndTimeResponse><tds:SystemDateAndTime>"
        "<tt:DateTimeType>NTP</tt:DateTimeType><tt:DaylightSavings>false</tt:DaylightSavings>"
        "<tt:TimeZone><tt:TZ>UTC0</tt:TZ></tt:TimeZone>"
        f"<tt:UTCDateTime><tt:Time><tt:Hour>{now.hour}</tt:Hour><tt:Minute>{now.minute}"
        f"</tt:Minute><tt:Second>{now.second}</tt:Second></tt:Time><tt:Date><tt:Year>{now.year}"
        f"</tt:Year><tt:Month>{now.month}</tt:Month><tt:Day>{now.day}</tt:Day></tt:Date>"
        "</tt:UTCDateTime></tds:SystemDateAndTime></tds:GetSystemDateAndTimeResponse>"
    )


DEVICE_INFORMATION = (
    "<tds:GetDeviceInformationResponse><tds:Manufacturer>Akri</tds:Manufacturer>"
    "<tds:Model>TestCam</tds:Model><tds:FirmwareVersion>1.0</tds:FirmwareVersion>"
    "<tds:SerialNumber>0001</tds:SerialNumber><tds:HardwareId>1</tds:HardwareId>"
    "</tds:GetDeviceInformationResponse>"
)


def _interfaces(ip: str, mac: str) -> str:
    # A disabled interface first, so "the enabled one carrying the service host" is exercised.
    return (
        "<tds:GetNetworkInterfacesResponse>"
        '<tds:NetworkInterfaces token="wlan0"><tt:Enabled>false</tt:Enabled>'
        "<tt:Info><tt:Name>wlan0</tt:Name><tt:HwAddress>66:77:88:99:AA:BB</tt:HwAddress></tt:Info>"
        "</tds:NetworkInterfaces>"
        '<tds:NetworkInterfaces token="eth0"><tt:Enabled>true</tt:Enabled>'
        f"<tt:Info><tt:Name>eth0</tt:Name><tt:HwAddress>{mac}</tt:HwAddress><tt:MTU>1500</tt:MTU>"
        "</tt:Info><tt:IPv4><tt:Enabled>true</tt:Enabled><tt:Config><tt:Manual>"
        f"<tt:Address>{ip}</tt:Address><tt:PrefixLength>24</tt:PrefixLength></tt:Manual>"
        "<tt:DHCP>false</tt:DHCP></tt:Config></tt:IPv4></tds:NetworkInterfaces>"
        "</tds:GetNetworkInterfacesResponse>"
    )


def password_digest(nonce: bytes, created: str, password: str) -> str:
    return base64.b64encode(
        hashlib.sha1(nonce + created.encode() + password.encode()).digest()
    ).decode()


@asynccontextmanager
async def serving_on(
    handle: Callable[[trio.SocketStream], Awaitable[None]], host: str = "127.0.0.1"
) -> AsyncIterator[str]:
    """Serve `handle` on a free port of `host` until the block exits; yields the device
    service URL there."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host=host))
        port = listeners[0].socket.getsockname()[1]
        try:
            yield f"http://{host}:{port}/onvif/device_service"
        finally:
            nursery.cancel_scope.cancel()


@attrs.define
class OnvifDeviceService:
    """One camera's device service. `credential` set: every operation except
    GetSystemDateAndTime (pre-auth by ONVIF Core 5.9.1) needs a valid digest token.
    `clock_skew`: how far this camera's clock is off real time."""

    ip: str = "127.0.0.1"
    mac: str = "00:11:22:33:44:55"
    credential: tuple[str, str] | None = None
    clock_skew: dt.timedelta = dt.timedelta(0)
    max_token_age: dt.timedelta = dt.timedelta(seconds=5)
    calls: list[tuple[str, str | None]] = attrs.field(factory=list)  # (operation, user)
    connections: int = 0  # accepted so far
    delay: float = 0.0  # seconds each answer takes
    in_flight: int = 0
    most_in_flight: int = 0  # the most requests being answered at once
    # How a call without a valid token is turned down: status, body, extra headers.
    refusal: tuple[int, str, tuple[tuple[str, str], ...]] = (400, ENVELOPE_NOT_AUTHORIZED, ())

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.clock_skew

    def authenticated_user(self, root: etree._Element) -> str | None:
        token = root.find("s:Header/wsse:Security/wsse:UsernameToken", NS)
        if token is None or self.credential is None:
            return None
        user = token.findtext("wsse:Username", namespaces=NS)
        password_el = token.find("wsse:Password", NS)
        nonce = token.findtext("wsse:Nonce", namespaces=NS)
        created = token.findtext("wsu:Created", namespaces=NS)
        if None in (user, password_el, nonce, created) or password_el.get("Type") != DIGEST_TYPE:
            return None
        when = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
        if abs(when - self.now()) > self.max_token_age:  # checked against OUR clock
            return None
        expected = password_digest(base64.b64decode(nonce), created, self.credential[1])
        if user != self.credential[0] or password_el.text != expected:
            return None
        return str(user)

    def answer(self, body: bytes) -> tuple[int, bytes, tuple[tuple[str, str], ...]]:
        root = etree.fromstring(body)
        request = root.find("s:Body", NS)[0]
        operation = etree.QName(request).localname
        user = self.authenticated_user(root)
        self.calls.append((operation, user))
        if operation == "GetSystemDateAndTime":
            payload = _date_time(self.now())
        elif self.credential is not None and user is None:
            status, text, headers = self.refusal
            return status, text.encode(), headers
        elif operation == "GetDeviceInformation":
            payload = DEVICE_INFORMATION
        elif operation == "GetNetworkInterfaces":
            payload = _interfaces(self.ip, self.mac)
        else:
            return 500, b"", ()
        return 200, ENVELOPE.format(payload).encode(), ()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        # A client that hangs up on a refusal without reading its body resets the connection.
        with contextlib.suppress(trio.BrokenResourceError):
            await self._serve_connection(stream)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                body = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        conn.receive_data(data)
                        if not data and conn.their_state is not h11.DONE:
                            return
                        continue
                    if isinstance(event, h11.Data):
                        body += event.data
                    if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                        break
                if isinstance(event, h11.ConnectionClosed):
                    return
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                try:
                    await trio.sleep(self.delay)
                    status, payload, extra = self.answer(body)
                finally:
                    self.in_flight -= 1
                headers = [
                    ("content-type", "application/soap+xml; charset=utf-8"),
                    ("content-length", str(len(payload))),
                    *extra,
                ]
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
                await stream.send_all(conn.send(h11.Data(data=payload)) or b"")
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()

    def serving(self, host: str = "127.0.0.1") -> AbstractAsyncContextManager[str]:
        """Serve until the block exits; yields the device service URL."""
        return serving_on(self.handle, host)


def _match(url: str, uuid: str = "5f5a69c2-e0ae-504f-829b-00fcdab169cc") -> ProbeMatch:
    return ProbeMatch(uuid=uuid, address=f"urn:uuid:{uuid}", xaddrs=(url,), scopes=())


async def test_no_credentials_needed() -> None:
    camera = OnvifDeviceService(ip="127.0.0.1", mac="00:11:22:33:44:55")
    async with camera.serving() as url, open_device_client() as client:
        facts = await client.query(url, None)
    assert facts == DeviceFacts(url, "127.0.0.1", "00:11:22:33:44:55")
    assert [op for op, _ in camera.calls] == [
        "GetSystemDateAndTime",
        "GetDeviceInformation",
        "GetNetworkInterfaces",
    ]


async def test_username_token_digest_accepted() -> None:
    camera = OnvifDeviceService(credential=("admin", "s3cret"))
    async with camera.serving() as url, open_device_client() as client:
        facts = await client.query(url, Credential("admin", "s3cret"))
    assert facts.mac_address == "00:11:22:33:44:55"
    assert facts.ip_address == "127.0.0.1"
    # GetSystemDateAndTime goes out without a token; the other two carry a valid one.
    assert camera.calls == [
        ("GetSystemDateAndTime", None),
        ("GetDeviceInformation", "admin"),
        ("GetNetworkInterfaces", "admin"),
    ]


async def test_token_created_follows_the_camera_clock() -> None:
    # The camera is 1 h ahead and accepts tokens within 5 s of its own clock: only a Created
    # shifted by the offset read from GetSystemDateAndTime gets in.
    camera = OnvifDeviceService(credential=("admin", "pw"), clock_skew=dt.timedelta(hours=1))
    async with camera.serving() as url, open_device_client() as client:
        facts = await client.query(url, Credential("admin", "pw"))
    assert facts.ip_address == "127.0.0.1"
    assert camera.calls[1] == ("GetDeviceInformation", "admin")


async def test_wrong_password_is_an_authentication_failure() -> None:
    camera = OnvifDeviceService(credential=("admin", "right"))
    async with camera.serving() as url, open_device_client() as client:
        with pytest.raises(AuthenticationFailed, match="admin"):
            await client.query(url, Credential("admin", "wrong"))


async def test_wrong_credentials_skip_the_camera_and_log(caplog: pytest.LogCaptureFixture) -> None:
    camera = OnvifDeviceService(credential=("admin", "right"))
    async with camera.serving() as url:
        with caplog.at_level(logging.WARNING):
            devices = await Onvif().confirm(
                parse_details(""), [_match(url)], {"default": Credential("admin", "wrong")}
            )
    assert devices == []
    assert any("camera 5f5a69c2" in r.getMessage() for r in caplog.records)


# ---- every shape of "no" counts as failed authentication (issue 21 item 13) ---------------------

REFUSALS = {
    "401 with a Fault body": (401, ENVELOPE_SENDER_FAULT, ()),
    "401 with nothing": (401, "", ()),
    "401 Digest challenge": (
        401,
        "<html>401 Unauthorized</html>",
        (("www-authenticate", 'Digest realm="cam", qop="auth", nonce="abc"'),),
    ),
    "401 Basic challenge": (401, "", (("www-authenticate", 'Basic realm="cam"'),)),
    "400 ter:NotAuthorized": (400, ENVELOPE_NOT_AUTHORIZED, ()),
    "500 ter:NotAuthorized": (500, ENVELOPE_NOT_AUTHORIZED, ()),
    "a Fault on GetDeviceInformation": (400, ENVELOPE_SENDER_FAULT, ()),
    "403 Forbidden": (403, "forbidden", ()),
}


async def confirm_one(url: str, uuid: str, password: str, refusals: Refusals) -> list[Device]:
    """One round of the handler's confirm step for one camera, as user admin."""
    credentials = {"default": Credential("admin", password)}
    return await Onvif().confirm(parse_details(""), [_match(url, uuid)], credentials, refusals)


@pytest.mark.parametrize("shape", sorted(REFUSALS))
async def test_every_refusal_shape_is_failed_authentication_logged_once(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    camera = OnvifDeviceService(credential=("admin", "right"), refusal=REFUSALS[shape])
    uuid = "5f5a69c2-e0ae-504f-829b-00fcdab169cc"
    refusals = Refusals()
    with trio.fail_after(20):
        async with camera.serving() as url, open_device_client() as client:
            with pytest.raises(AuthenticationFailed, match="rejected user 'admin'"):
                await client.query(url, Credential("admin", "wrong"))
            with caplog.at_level(logging.INFO):
                for _ in range(3):  # three rounds: no device, one line
                    devices = await confirm_one(url, uuid, "wrong", refusals)
                    assert devices == []
    lines = [r for r in caplog.records if "refuses the configured credentials" in r.getMessage()]
    assert [r.levelname for r in lines] == ["WARNING"]
    assert f"camera {uuid} refuses" in lines[0].getMessage()
    assert "(1 camera(s) refusing them)" in lines[0].getMessage()
    assert refusals.current.keys() == {uuid}
    # Nothing but the unauthenticated clock query and the refused one, each round.
    assert {op for op, _ in camera.calls} == {"GetSystemDateAndTime", "GetDeviceInformation"}


async def test_a_camera_that_accepts_the_credentials_again_is_logged_once() -> None:
    camera = OnvifDeviceService(credential=("admin", "right"))
    uuid = "5f5a69c2-e0ae-504f-829b-00fcdab169cc"
    refusals = Refusals(current={uuid: "it said no"})
    async with camera.serving() as url:
        devices = await confirm_one(url, uuid, "right", refusals)
    assert [d.properties["ONVIF_DEVICE_UUID"] for d in devices] == [uuid]
    assert refusals.current == {}


def test_refusal_changes_are_news_only() -> None:
    both = ("a", "b")
    assert next_refusals({}, {"a": "401"}, (), both) == (
        {"a": "401"},
        RefusalChanges({"a": "401"}, ()),
    )
    assert next_refusals({"a": "401"}, {"a": "401"}, (), both) == (
        {"a": "401"},
        RefusalChanges({}, ()),
    )
    assert next_refusals({"a": "401"}, {"a": "403"}, (), both) == (
        {"a": "403"},
        RefusalChanges({"a": "403"}, ()),
    )
    # a answered: it accepts them again; b timed out: no news, still refusing
    assert next_refusals({"a": "401", "b": "x"}, {}, ("a",), both) == (
        {"b": "x"},
        RefusalChanges({}, ("a",)),
    )
    # b is gone from the network: forgotten, without a line
    assert next_refusals({"a": "401", "b": "x"}, {"a": "401"}, (), ("a",)) == (
        {"a": "401"},
        RefusalChanges({}, ()),
    )


def test_the_status_line_counts_refusing_cameras_and_names_a_few() -> None:
    assert refusal_problems({}) == []
    assert refusal_problems({"b": "http://b rejected user 'admin'", "a": "http://a said no"}) == [
        "2 camera(s) refused the configured credentials: "
        "a (http://a said no); b (http://b rejected user 'admin')"
    ]
    (line,) = refusal_problems({f"cam{i}": "no" for i in range(5)})
    assert line == (
        "5 camera(s) refused the configured credentials: "
        "cam0 (no); cam1 (no); cam2 (no); and 2 more"
    )


@attrs.define
class Probed(Onvif):
    """The handler with its WS-Discovery round replaced by fixed matches (the probe has tests
    of its own); everything after it (queries, refusals, reports) is the handler's."""

    matches: tuple[ProbeMatch, ...] = ()

    async def probe(self, details: OnvifDetails) -> dict[str, ProbeMatch]:
        return {m.uuid: m for m in self.matches}


async def test_the_handler_reports_the_refusing_count_when_it_changes() -> None:
    camera = OnvifDeviceService(credential=("admin", "right"))
    uuid = "5f5a69c2-e0ae-504f-829b-00fcdab169cc"
    props: dict[str, bytes | None] = {"username_default": b"admin", "password_default": b"wrong"}
    sent: list[list[Device]] = []
    reported: list[tuple[str, ...]] = []
    changed = trio.Event()

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    async def report(lines: tuple[str, ...]) -> None:
        reported.append(lines)
        changed.set()

    with trio.fail_after(30):
        async with camera.serving() as url, trio.open_nursery() as nursery:
            handler = Probed(poll_interval=0.01, matches=(_match(url, uuid),))
            nursery.start_soon(
                functools.partial(discover_changes, report=report),
                handler,
                parse_details(""),
                props,
                send,
            )
            await changed.wait()
            changed = trio.Event()
            camera.credential = ("admin", "wrong")  # the camera now takes what we send
            await changed.wait()
            nursery.cancel_scope.cancel()
    (line,) = reported[0]
    assert line.startswith(
        f"1 camera(s) refused the configured credentials: {uuid} ({url} rejected user 'admin': "
    )
    assert reported[1:] == [()]  # accepted again: the problem is withdrawn
    assert sent[0] == [] and [d.properties["ONVIF_DEVICE_UUID"] for d in sent[-1]] == [uuid]


async def test_auth_required_but_no_credentials_reports_without_ip_mac() -> None:
    camera = OnvifDeviceService(credential=("admin", "right"))
    async with camera.serving() as url, open_device_client() as client:
        facts = await query_camera(client, _match(url), None)
    assert facts == DeviceFacts(url)


async def test_unreachable_xaddr_falls_through_to_the_next() -> None:
    camera = OnvifDeviceService()
    async with camera.serving() as url, open_device_client() as client:
        # Port 1 on loopback: connection refused.
        match = attrs.evolve(_match(url), xaddrs=("http://127.0.0.1:1/onvif/device_service", url))
        facts = await query_camera(client, match, None)
    assert facts is not None and facts.service_url == url


async def test_not_a_camera_is_dropped() -> None:
    async with open_device_client() as client:
        assert await query_camera(client, _match("http://127.0.0.1:1/x"), None) is None


async def test_handler_round_with_filters_and_credentials() -> None:
    """Onvif.confirm on fixed matches: credentials resolved from discoveryProperties,
    the wrong-credential camera skipped, the mac filter applied."""
    good = OnvifDeviceService(mac="AA:AA:AA:AA:AA:01", credential=("u", "p"))
    bad = OnvifDeviceService(mac="AA:AA:AA:AA:AA:02", credential=("u", "other"))
    open_cam = OnvifDeviceService(mac="AA:AA:AA:AA:AA:03")
    async with (
        good.serving() as good_url,
        bad.serving() as bad_url,
        open_cam.serving() as open_url,
    ):
        matches = [
            _match(good_url, "00000000-0000-0000-0000-000000000001"),
            _match(bad_url, "00000000-0000-0000-0000-000000000002"),
            _match(open_url, "00000000-0000-0000-0000-000000000003"),
        ]
        creds = resolve_credentials({"username_default": b"u", "password_default": b"p"})
        details = parse_details("macAddresses: {items: ['aa:aa:aa:aa:aa:03'], action: Exclude}")
        devices = await Onvif().confirm(details, matches, creds)
    assert [d.properties["ONVIF_DEVICE_MAC_ADDRESS"] for d in devices] == ["AA:AA:AA:AA:AA:01"]
    assert devices[0].id == f"{good_url}-00000000-0000-0000-0000-000000000001"


# ---- hostile device services: answers are bounded (issue 8, item 2) ----------------------------


@attrs.define
class FloodingService:
    """Answers every request with an endless body: announced as 400 MB (`announce`) or chunked
    without a length. Counts what it managed to send before the client hung up."""

    announce: bool
    sent: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        request = b""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with stream:
                while b"\r\n\r\n" not in request:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    request += data
                length = f"content-length: {400 << 20}" if self.announce else (
                    "transfer-encoding: chunked"
                )  # fmt: skip
                head = f"HTTP/1.1 200 OK\r\ncontent-type: application/soap+xml\r\n{length}\r\n\r\n"
                await stream.send_all(head.encode())
                chunk = b"<" * 65536
                if not self.announce:
                    chunk = b"%x\r\n%s\r\n" % (len(chunk), chunk)
                while self.sent < 400 << 20:
                    await stream.send_all(chunk)
                    self.sent += len(chunk)

    def serving(self) -> AbstractAsyncContextManager[str]:
        return serving_on(self.handle)


@pytest.mark.parametrize("announce", [True, False])
async def test_a_flooding_device_service_is_cut_off_at_the_limit(announce: bool) -> None:
    service = FloodingService(announce)
    with trio.fail_after(20):
        async with service.serving() as url, open_device_client(1 << 20) as client:
            with pytest.raises(AnswerTooLarge, match="limit is 1048576" if announce else "more"):
                await client.query(url, None)
    # Socket buffers hold a few MB at most; the client never read the 400 MB.
    assert service.sent < 32 << 20


async def test_a_flooding_camera_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = FloodingService(announce=False)
    with trio.fail_after(20):
        async with service.serving() as url, open_device_client(1 << 20) as client:
            assert await query_camera(client, _match(url), None) is None
    assert "answered more than 1048576 bytes" in caplog.text


@attrs.define
class EncodedService:
    """Answers every request with a gzip bomb (64 MiB of '<' in 64 KB on the wire), whatever
    the request asked for, and records each request's Accept-Encoding."""

    encoding: str = "gzip"
    accepted: list[str | None] = attrs.field(factory=list)

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with stream:
                while (event := conn.next_event()) is not h11.PAUSED:
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        conn.receive_data(data)
                    elif isinstance(event, h11.Request):
                        asked = dict(event.headers).get(b"accept-encoding", b"")
                        self.accepted.append(asked.decode())
                    elif isinstance(event, h11.EndOfMessage):
                        break
                payload = gzip.compress(b"<" * (64 << 20), 9)
                if self.encoding == "deflate":
                    payload = zlib.compress(b"<" * (64 << 20), 9)
                headers = [
                    ("content-type", "application/soap+xml"),
                    ("content-encoding", self.encoding),
                    ("content-length", str(len(payload))),
                ]
                await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
                await stream.send_all(conn.send(h11.Data(data=payload)) or b"")
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")

    def serving(self) -> AbstractAsyncContextManager[str]:
        return serving_on(self.handle)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compressed_answer_is_not_asked_for_and_never_decoded(
    encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 64 KB on the wire, far under the 1 MiB limit; decoded it would be 64 MiB (and a 0.5 MB
    # body made 1.6 GiB before).
    service = EncodedService(encoding)
    with trio.fail_after(20):
        async with service.serving() as url, open_device_client(1 << 20) as client:
            with pytest.raises(AnswerEncoded, match=f"content encoding '{encoding}'"):
                await client.query(url, None)
            assert await query_camera(client, _match(url), None) is None
    assert service.accepted == ["identity", "identity"]
    assert f"skipping camera 5f5a69c2-e0ae-504f-829b-00fcdab169cc: {url}" in caplog.text


# ---- credentials go only to the camera that answered (issue 8, item 1) -------------------------


def message_id_of(probe: bytes) -> str:
    """The MessageID of a Probe, as a responder reads it to answer."""
    found: str | None = etree.fromstring(probe).findtext(
        "{*}Header/{http://schemas.xmlsoap.org/ws/2004/08/addressing}MessageID"
    )
    assert found
    return found


PROBE_MATCH = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"'
    ' xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing"'
    ' xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery">'
    "<s:Header><a:RelatesTo>{relates_to}</a:RelatesTo></s:Header>"
    "<s:Body><d:ProbeMatches><d:ProbeMatch>"
    "<a:EndpointReference><a:Address>urn:uuid:{uuid}</a:Address></a:EndpointReference>"
    "<d:Types>NetworkVideoTransmitter</d:Types><d:XAddrs>{xaddrs}</d:XAddrs>"
    "</d:ProbeMatch></d:ProbeMatches></s:Body></s:Envelope>"
)


async def test_credentials_go_only_to_the_address_that_answered_the_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The reply comes from 127.0.0.1 but lists a device service on 127.0.0.2 first: before,
    # the handler sent the camera's credentials there. Both addresses are loopback.
    camera = OnvifDeviceService(credential=("admin", "s3cret"))
    trap = OnvifDeviceService(ip="127.0.0.2", credential=("admin", "s3cret"))
    uuid = "5f5a69c2-e0ae-504f-829b-00fcdab169cc"
    responder = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await responder.bind(("127.0.0.1", 0))

    async def respond(xaddrs: str) -> None:
        probe, sender = await responder.recvfrom(65535)
        reply = PROBE_MATCH.format(uuid=uuid, xaddrs=xaddrs, relates_to=message_id_of(probe))
        await responder.sendto(reply.encode(), sender)

    with responder, trio.fail_after(20):
        async with (
            camera.serving() as url,
            trap.serving("127.0.0.2") as trap_url,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(respond, f"{trap_url} http://camera.example/onvif {url}")
            replies = ProbeReplies(new_message_id())
            with trio.move_on_after(0.5):
                await probe_interfaces(
                    ["127.0.0.1"], replies, group=("127.0.0.1", responder.getsockname()[1])
                )
            assert [m.xaddrs for m in replies.matches.values()] == [(url,)]
            devices = await Onvif().confirm(
                parse_details(""),
                replies.matches.values(),
                {"default": Credential("admin", "s3cret")},
            )
    assert [d.properties["ONVIF_DEVICE_SERVICE_URL"] for d in devices] == [url]
    assert trap.calls == []
    assert ("GetDeviceInformation", "admin") in camera.calls
    report_refused(replies)
    assert "ignored 2 XAddrs on other hosts than the reply's sender: " + trap_url in caplog.text


# ---- WS-Discovery answers only what it asked (issue 21 item 3) ---------------------------------


def probe_matches(relates_to: str | None, devices: list[tuple[str, str]]) -> bytes:
    """A ProbeMatches datagram listing (uuid, xaddrs) devices, with RelatesTo when given."""
    header = f"<s:Header><a:RelatesTo>{relates_to}</a:RelatesTo></s:Header>" if relates_to else ""
    entries = "".join(
        "<d:ProbeMatch><a:EndpointReference><a:Address>urn:uuid:{}</a:Address>"
        "</a:EndpointReference><d:Types>NetworkVideoTransmitter</d:Types>"
        "<d:XAddrs>{}</d:XAddrs></d:ProbeMatch>".format(*device)
        for device in devices
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"'
        ' xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing"'
        ' xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery">'
        f"{header}<s:Body><d:ProbeMatches>{entries}</d:ProbeMatches></s:Body></s:Envelope>"
    ).encode()


async def probe_round(
    handler: Onvif, answer: Callable[[bytes, tuple[str, int]], Awaitable[None]]
) -> ProbeReplies:
    """One probe window from 127.0.0.1 against a stand-in for the multicast group on loopback,
    which hands our Probe and its source to `answer`; refusals are reported as the handler
    does after a round."""
    group = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await group.bind(("127.0.0.1", 0))

    async def hear_probe() -> None:
        probe, prober = await group.recvfrom(65535)
        await answer(probe, prober)

    replies = ProbeReplies(new_message_id(), handler.max_matches)
    with group:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hear_probe)
            with trio.move_on_after(1):
                await probe_interfaces(["127.0.0.1"], replies, group=group.getsockname())
            nursery.cancel_scope.cancel()
    report_refused(replies)
    return replies


async def test_unsolicited_probe_matches_get_no_camera_queried_and_no_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The attacker at 127.0.0.2 serves a device service of its own, to collect the digest.
    camera = OnvifDeviceService(credential=("admin", "s3cret"))
    trap = OnvifDeviceService(ip="127.0.0.2", credential=("admin", "s3cret"))
    attacker = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await attacker.bind(("127.0.0.2", 0))
    handler = Onvif()
    with attacker, trio.fail_after(20):
        async with camera.serving() as url, trap.serving("127.0.0.2") as trap_url:

            async def spray(probe: bytes, prober: tuple[str, int]) -> None:
                # It never saw the Probe (it is not told the MessageID), only the port.
                for relates_to in (None, new_message_id(), "uuid:NetworkVideoTransmitter"):
                    datagram = probe_matches(relates_to, [("6666-1", trap_url)])
                    await attacker.sendto(datagram, prober)
                # With the right MessageID, but from another address than the XAddrs name.
                datagram = probe_matches(message_id_of(probe), [("6666-2", url)])
                await attacker.sendto(datagram, prober)

            replies = await probe_round(handler, spray)
            devices = await handler.confirm(
                parse_details(""),
                replies.matches.values(),
                {"default": Credential("admin", "s3cret")},
            )
    assert replies.matches == {}
    assert devices == []
    assert trap.calls == [] and camera.calls == []  # nobody queried, no digest sent
    assert "ignored 3 ProbeMatches that answer no probe of this round" in caplog.text
    assert f"ignored 1 XAddrs on other hosts than the reply's sender: {url}" in caplog.text


async def test_a_round_keeps_at_most_max_matches_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = Onvif(max_matches=4)
    uuids = [f"00000000-0000-0000-0000-{i:012d}" for i in range(10)]

    async def answer(probe: bytes, prober: tuple[str, int]) -> None:
        responder = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with responder:
            await responder.bind(("127.0.0.1", 0))
            for uuid in uuids:  # one datagram per camera, then all of them again
                cam = [(uuid, f"http://127.0.0.1:1/{uuid}")]
                await responder.sendto(probe_matches(message_id_of(probe), cam), prober)
            every = [(u, f"http://127.0.0.1:1/{u}") for u in uuids]
            await responder.sendto(probe_matches(message_id_of(probe), every), prober)

    with trio.fail_after(20):
        replies = await probe_round(handler, answer)
    assert sorted(replies.matches) == uuids[:4]
    lines = [r.getMessage() for r in caplog.records if "past the cap" in r.getMessage()]
    assert lines == [
        "onvif: 12 ProbeMatches past the cap of 4 cameras a round (ONVIF_MAX_MATCHES) left out: "
        + " ".join(uuids[4:8])
    ]


async def test_cameras_are_queried_a_few_at_a_time_on_a_connection_each(
    autojump_clock: object,
) -> None:
    camera = OnvifDeviceService(delay=1.0)  # each answer takes a (virtual) second
    handler = Onvif(query_concurrency=2)
    await device_document()  # parsed in a thread: not on the virtual clock
    async with camera.serving() as url:
        matches = [_match(url, f"00000000-0000-0000-0000-{i:012d}") for i in range(7)]
        devices = await handler.confirm(parse_details(""), matches, {})
    assert len(devices) == 7
    assert camera.connections == 7  # three calls each, on a connection of its own
    assert camera.most_in_flight == 2
