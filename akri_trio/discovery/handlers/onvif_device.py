"""Talking to a discovered camera's ONVIF device service, and the credentials to do it with.

A ProbeMatch only says "something answered"; upstream keeps a camera only when its device
service answers GetSystemDateAndTime (which ONVIF requires to work without authentication), and
learns its IP and MAC from GetNetworkInterfaces. We do the same through zeep's AsyncClient on
httpx, which runs natively under trio (research/stack.md §5), with two precautions:

- the WSDL and schemas are bundled (onvif_wsdl/, unmodified: the ONVIF licence forbids edits)
  and parsed once, in a worker thread, by a loader that refuses every non-local URL, so nothing
  is ever fetched and the event loop never blocks on 600 kB of XSD;
- `zeep.AsyncClient.create_service` returns a *sync* proxy (bug), so we build
  `AsyncServiceProxy` ourselves, one per device address.

Credentials come from discoveryProperties in upstream's four formats (`resolve_credentials`,
pure). The UsernameToken's Created time is shifted by the camera's own clock (from
GetSystemDateAndTime): cameras reject tokens outside a few seconds of *their* time, a common
cause of "auth timeouts" such as upstream #659.

Anything on the LAN can answer a probe, so an answer is read through `BoundedTransport`: at
most `max_response_bytes` (default 1 MiB) per HTTP response, refused up front when its
Content-Length says more and cut off when the body runs past it, never buffered whole. It asks
for no content encoding and refuses an answer in one (a 0.5 MB gzip body can decode to GBs).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import logging
import ssl
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import attrs
import httpx
import trio

from akri_trio.discovery.handlers.onvif_probe import normalize_uuid

log = logging.getLogger(__name__)

WSDL_DIR: Final = Path(__file__).with_name("onvif_wsdl")
DEVICE_WSDL: Final = WSDL_DIR / "devicemgmt.wsdl"
DEVICE_BINDING: Final = "{http://www.onvif.org/ver10/device/wsdl}DeviceBinding"

DEVICE_CREDENTIAL_LIST: Final = "device_credential_list"
DEVICE_CREDENTIAL_REF_LIST: Final = "device_credential_ref_list"
USERNAME_PREFIX: Final = "username_"
PASSWORD_PREFIX: Final = "password_"
DEFAULT_USERNAME: Final = "username_default"
DEFAULT_PASSWORD: Final = "password_default"
DEFAULT_ID: Final = "default"
# A device service's answers are a few kB; a camera's whole configuration is well under this.
MAX_RESPONSE_BYTES: Final = 1 << 20

# ---- credentials (pure) -------------------------------------------------------------------------


@attrs.frozen
class Credential:
    username: str
    password: str | None = attrs.field(default=None, repr=False)


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _json(value: bytes | None) -> Any:
    text = _text(value)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _list_names(properties: Mapping[str, bytes | None], key: str) -> list[str]:
    names = _json(properties.get(key))
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str)]


def _decoded_password(entry: Mapping[str, Any]) -> str | None:
    password = entry.get("password")
    if not isinstance(password, str):
        return None
    if entry.get("base64encoded") is True:
        try:
            return base64.b64decode(password, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    return password


def resolve_credentials(properties: Mapping[str, bytes | None]) -> dict[str, Credential]:
    """All credentials in discoveryProperties, keyed by normalized uuid (or "default").

    As upstream's CredentialStore, later sources override earlier ones for the same uuid:
    `device_credential_list`, then `device_credential_ref_list`, then `username_<uuid>` /
    `password_<uuid>` (`_` in the key stands for `-`), then `username_default` /
    `password_default`. Malformed JSON, non-UTF-8 values and missing usernames are ignored,
    never fatal: one bad Secret must not stop discovery of the other cameras.
    """
    found: dict[str, Credential] = {}

    for name in _list_names(properties, DEVICE_CREDENTIAL_LIST):
        table = _json(properties.get(name))
        if not isinstance(table, dict):
            continue
        for device, entry in table.items():
            if isinstance(entry, dict) and isinstance(entry.get("username"), str):
                found[normalize_uuid(device)] = Credential(
                    entry["username"], _decoded_password(entry)
                )

    for name in _list_names(properties, DEVICE_CREDENTIAL_REF_LIST):
        table = _json(properties.get(name))
        if not isinstance(table, dict):
            continue
        for device, ref in table.items():
            if not isinstance(ref, dict) or not isinstance(ref.get("username_ref"), str):
                continue
            username = _text(properties.get(ref["username_ref"]))
            if not username:
                continue
            password_ref = ref.get("password_ref")
            password = (
                _text(properties.get(password_ref)) if isinstance(password_ref, str) else None
            )
            found[normalize_uuid(device)] = Credential(username, password)

    for key, value in properties.items():
        if not key.startswith(USERNAME_PREFIX) or key == DEFAULT_USERNAME:
            continue
        device = key[len(USERNAME_PREFIX) :]
        username = _text(value)
        if not device or username is None:
            continue
        password = _text(properties.get(PASSWORD_PREFIX + device))
        found[normalize_uuid(device.replace("_", "-"))] = Credential(username, password)

    default_username = _text(properties.get(DEFAULT_USERNAME))
    if default_username is not None:
        found[DEFAULT_ID] = Credential(default_username, _text(properties.get(DEFAULT_PASSWORD)))
    return found


def credential_for(credentials: Mapping[str, Credential], device_uuid: str) -> Credential | None:
    """The credential for a camera: its own, else the default, else None (no WS-Security)."""
    return credentials.get(normalize_uuid(device_uuid)) or credentials.get(DEFAULT_ID)


# ---- answers as plain data (pure) ---------------------------------------------------------------


@attrs.frozen
class NetworkInterface:
    enabled: bool
    mac: str | None
    addresses: tuple[str, ...]  # IPv4, manual first, then DHCP / link-local


@attrs.frozen
class DeviceFacts:
    """What the device service told us. ip/mac are None when GetNetworkInterfaces failed."""

    service_url: str
    ip_address: str | None = None
    mac_address: str | None = None


class AuthenticationFailed(Exception):
    """The camera rejected our credentials (or demands some we do not have)."""


class CameraRefused(Exception):
    """A camera answered HTTP 401 or 403, whatever the body (a SOAP Fault, HTML, nothing)
    and whether or not it challenges for Digest or Basic authentication."""

    def __init__(self, url: str, status: int, challenge: str) -> None:
        scheme = challenge.split(None, 1)[0][:20] if challenge.strip() else ""
        asked = f" (asks for {scheme} authentication)" if scheme else ""
        super().__init__(f"{url} answered HTTP {status}{asked}")
        self.status = status


class AnswerTooLarge(Exception):
    """A device answered with more bytes than we read from one response."""


class AnswerEncoded(AnswerTooLarge):
    """A device answered in a content encoding (gzip, ...) we did not ask for: what it decodes
    to is not bounded by what came over the wire, so it is not read."""


def clock_offset(device_utc: dt.datetime | None, local_utc: dt.datetime) -> dt.timedelta:
    """How far the camera's clock is ahead of ours (zero when it did not say)."""
    if device_utc is None:
        return dt.timedelta(0)
    return device_utc - local_utc


def choose_address(
    interfaces: Sequence[NetworkInterface], service_url: str
) -> tuple[str | None, str | None]:
    """(ip, mac) of the camera: the enabled interface that carries the service URL's host if
    one does, else the first enabled interface with an IPv4 address, else the first with a MAC."""
    host = urlsplit(service_url).hostname or ""
    enabled = [i for i in interfaces if i.enabled]
    for iface in enabled:
        if host in iface.addresses:
            return host, iface.mac
    for iface in enabled:
        if iface.addresses:
            return iface.addresses[0], iface.mac
    for iface in enabled:
        if iface.mac:
            return None, iface.mac
    return None, None


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


def device_utc(answer: Any) -> dt.datetime | None:
    """UTCDateTime from a GetSystemDateAndTime answer (zeep objects or dicts), if complete."""
    date = _get(answer, "UTCDateTime", "Date")
    time = _get(answer, "UTCDateTime", "Time")
    try:
        return dt.datetime(
            int(date.Year), int(date.Month), int(date.Day),
            int(time.Hour), int(time.Minute), int(time.Second),
            tzinfo=dt.UTC,
        )  # fmt: skip
    except (AttributeError, TypeError, ValueError):
        return None


def network_interfaces(answer: Any) -> list[NetworkInterface]:
    """GetNetworkInterfaces' answer (a list of tt:NetworkInterface) as plain data."""
    result: list[NetworkInterface] = []
    for iface in answer or []:
        ipv4 = _get(iface, "IPv4")
        config = _get(ipv4, "Config")
        addresses: list[str] = []
        for group in ("Manual", "FromDHCP", "LinkLocal"):
            entries = _get(config, group)
            if entries is None:
                continue
            for entry in entries if isinstance(entries, list) else [entries]:
                address = _get(entry, "Address")
                if isinstance(address, str) and address and address not in addresses:
                    addresses.append(address)
        mac = _get(iface, "Info", "HwAddress")
        result.append(
            NetworkInterface(
                enabled=bool(_get(iface, "Enabled")) and _get(ipv4, "Enabled") is not False,
                mac=mac if isinstance(mac, str) and mac else None,
                addresses=tuple(addresses),
            )
        )
    return result


_AUTH_SUBCODES: Final = frozenset({"NotAuthorized", "FailedAuthentication", "InvalidSecurity"})


def is_authentication_failure(exc: BaseException) -> bool:
    """ONVIF signals bad credentials as a SOAP fault (ter:NotAuthorized, or WS-Security's
    wsse:FailedAuthentication, under any HTTP status) or, on many cameras, as HTTP 401/403
    with or without a body or an HTTP authentication challenge."""
    from zeep.exceptions import Fault, TransportError

    if isinstance(exc, CameraRefused):
        return True
    if isinstance(exc, TransportError):
        return exc.status_code in (401, 403)
    if isinstance(exc, Fault):
        names = [str(exc.code or "")]
        names += [str(getattr(s, "localname", s)) for s in exc.subcodes or []]
        return any(n.rsplit("}", 1)[-1].rsplit(":", 1)[-1] in _AUTH_SUBCODES for n in names)
    return False


# ---- the zeep edge ------------------------------------------------------------------------------

_document: Any = None
_document_lock: Final = threading.Lock()


def _load_document() -> Any:
    """Parse the bundled device WSDL (~0.25 s). Runs in a worker thread, once per process."""
    global _document
    with _document_lock:
        if _document is None:
            _document = _parse_document()
        return _document


def _parse_document() -> Any:
    import zeep
    import zeep.transports

    # zeep is partly annotated; we use it through Any rather than fight its signatures.
    zeep_any: Any = zeep
    Transport: Any = zeep.transports.Transport

    class LocalOnly(Transport):  # type: ignore[misc]
        """Serves schema imports from onvif_wsdl/ only. `./xmlmime`, `./envelope` and
        `./include` are shipped as *.xsd so that package data picks them up."""

        def load(self, url: str) -> bytes:
            path = Path(url)
            if "://" in url or not path.resolve().is_relative_to(WSDL_DIR.resolve()):
                raise ValueError(f"refusing to load {url!r}: ONVIF schemas are bundled")
            if not path.exists() and path.with_suffix(".xsd").exists():
                path = path.with_suffix(".xsd")
            return path.read_bytes()

    return zeep_any.wsdl.Document(str(DEVICE_WSDL), LocalOnly(), settings=zeep_any.Settings())


async def device_document() -> Any:
    """The parsed device WSDL, loaded at first use off the event loop and then shared."""
    if _document is not None:
        return _document
    return await trio.to_thread.run_sync(_load_document)


@attrs.define
class DeviceClient:
    """Shared HTTP connection pool + parsed WSDL, for the lifetime of one `discover`."""

    http: httpx.AsyncClient
    document: Any

    def _service(self, url: str, credential: Credential | None, offset: dt.timedelta) -> Any:
        import zeep
        import zeep.proxy
        import zeep.transports
        import zeep.wsse.username

        AsyncClient: Any = zeep.AsyncClient
        AsyncServiceProxy: Any = zeep.proxy.AsyncServiceProxy
        AsyncTransport: Any = zeep.transports.AsyncTransport
        UsernameToken: Any = zeep.wsse.username.UsernameToken

        wsse = None
        if credential is not None:
            wsse = UsernameToken(
                credential.username,
                credential.password or "",
                use_digest=True,
                created=dt.datetime.now(dt.UTC) + offset,
                zulu_timestamp=True,
            )
        transport = AsyncTransport(client=self.http, wsdl_client=_NoWsdlClient())
        client = AsyncClient(self.document, wsse=wsse, transport=transport)
        binding = client.wsdl.bindings[DEVICE_BINDING]
        return AsyncServiceProxy(client, binding, address=url)

    async def query(self, url: str, credential: Credential | None) -> DeviceFacts:
        """Ask one device service address. Raises when the camera does not answer
        GetSystemDateAndTime (not a camera for us) or `AuthenticationFailed` when it rejects
        the credential we were given. No timeout here: the caller owns it."""
        from zeep.exceptions import Fault

        answer = await self._service(url, None, dt.timedelta(0)).GetSystemDateAndTime()
        offset = clock_offset(device_utc(answer), dt.datetime.now(dt.UTC))
        service = self._service(url, credential, offset)
        try:
            # The first call that carries the credential: with GetSystemDateAndTime answered,
            # any Fault here is the camera turning the credential down.
            await service.GetDeviceInformation()
        except AnswerTooLarge:
            raise  # not a camera we can talk to safely: skip it, do not half-report it
        except Exception as exc:
            refused = is_authentication_failure(exc) or isinstance(exc, Fault)
            if refused and credential is not None:
                raise AuthenticationFailed(
                    f"{url} rejected user {credential.username!r}: {_refusal(exc)}"
                ) from exc
            if refused:  # no credential configured: upstream reports it, without IP/MAC
                log.info("onvif: %s requires credentials; reporting it without IP/MAC", url)
            else:
                log.info("onvif: %s answered, but not its device information: %r", url, exc)
            return DeviceFacts(url)
        try:
            interfaces = network_interfaces(await service.GetNetworkInterfaces())
        except AnswerTooLarge:
            raise
        except Exception as exc:
            if is_authentication_failure(exc) and credential is not None:
                raise AuthenticationFailed(
                    f"{url} rejected user {credential.username!r}: {_refusal(exc)}"
                ) from exc
            log.info("onvif: %s answered, but not its network interfaces: %r", url, exc)
            return DeviceFacts(url)
        ip, mac = choose_address(interfaces, url)
        return DeviceFacts(url, ip, mac)


def _refusal(exc: BaseException) -> str:
    """How a camera said no, in a few words for the log."""
    if isinstance(exc, CameraRefused):
        return str(exc).split(" answered ", 1)[-1]
    message = " ".join(str(getattr(exc, "message", None) or exc).split())[:120]
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


async def _refuse_unauthorized(response: httpx.Response) -> None:
    """httpx response hook: 401/403 is a refusal whatever the body says (zeep would read a
    Fault body as an ordinary Fault and lose the status)."""
    if response.status_code in (401, 403):
        challenge = response.headers.get("www-authenticate", "")
        raise CameraRefused(str(response.request.url), response.status_code, challenge)


class _NoWsdlClient:
    """Stands in for AsyncTransport's sync httpx.Client (only used to fetch WSDLs, which we
    never do), so no sync client is built per device."""

    def close(self) -> None:
        pass


class _BoundedBody(httpx.AsyncByteStream):
    """A response body that raises AnswerTooLarge once more than `limit` bytes came in."""

    def __init__(self, body: httpx.AsyncByteStream, limit: int, url: str) -> None:
        self._body = body
        self._limit = limit
        self._url = url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for chunk in self._body:
            received += len(chunk)
            if received > self._limit:
                raise AnswerTooLarge(f"{self._url} answered more than {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._body.aclose()


class BoundedTransport(httpx.AsyncBaseTransport):
    """httpx's transport, with every response body limited to `limit` bytes."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self.limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        # httpx offers "gzip, deflate" (and br/zstd when installed) and decodes without a
        # bound after the body was counted: ask for the body as it is, and read nothing else.
        request.headers["accept-encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        url = str(request.url)
        length = response.headers.get("content-length", "")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            raise AnswerEncoded(
                f"{url} answered in content encoding {encoding[:40]!r}, which we do not accept "
                "(its decoded size is unbounded)"
            )
        if length.isdigit() and int(length) > self.limit:
            await response.aclose()
            raise AnswerTooLarge(f"{url} announced {length} bytes; the limit is {self.limit}")
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _BoundedBody(response.stream, self.limit, url)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


_tls: ssl.SSLContext | None = None


async def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once per process off the event loop: loading the CA
    bundle takes 15-70 ms of CPU, which a transport built per camera with its own context would
    spend in the loop for every camera (a round of hundreds stalled it for a third of a second)."""
    global _tls
    if _tls is None:
        _tls = await trio.to_thread.run_sync(lambda: httpx.create_ssl_context(trust_env=False))
    return _tls


@asynccontextmanager
async def open_device_client(
    max_response_bytes: int = MAX_RESPONSE_BYTES,
) -> AsyncIterator[DeviceClient]:
    document = await device_document()
    transport = BoundedTransport(
        httpx.AsyncHTTPTransport(verify=await _tls_context(), trust_env=False), max_response_bytes
    )
    # trust_env=False: cameras are on the local network; a cluster-wide HTTP(S)_PROXY must not
    # capture LAN camera traffic. Timeouts are the caller's (trio cancel scopes).
    async with httpx.AsyncClient(
        timeout=None,
        trust_env=False,
        transport=transport,
        event_hooks={"response": [_refuse_unauthorized]},
    ) as http:
        yield DeviceClient(http, document)
