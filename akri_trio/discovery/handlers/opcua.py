"""opcua: OPC UA servers found through FindServers on the configured discovery URLs.

Upstream's handler, with its Configuration format unchanged:

    opcuaDiscoveryMethod:
      standard:
        discoveryUrls: ["opc.tcp://10.0.0.5:4840/"]   # default ["opc.tcp://localhost:4840/"]
    applicationNames:                                  # optional FilterList
      items: ["SomeServer"]
      action: Include                                  # or Exclude; default Include
    allowedHosts: ["10.0.0.7"]                         # optional, ours; "*" = any host

Every `poll_interval` seconds (upstream: 10 s; env `OPCUA_DISCOVERY_INTERVAL_SECS`), for each
discovery URL (a server's own, or a Local Discovery Server's): a short TCP probe (upstream: 3 s,
because a FindServers against a dead host can hang for minutes), then FindServers. Of the
applications returned we keep those of type `Server` (not Client, ClientAndServer or
DiscoveryServer: upstream's rule; note asyncua servers default to ClientAndServer) whose
application name passes `applicationNames` (exact, case-sensitive). For each, the first
`opc.tcp` discovery URL (else the first URL) is the device: id = that URL, property
`OPCUA_DISCOVERY_URL` = that URL. The same server seen through two LDSes is one device.

Where we differ from upstream, on purpose:
- #624/#555: servers in containers report their container hostname (`opc.tcp://9a0f4aa79791:
  50000/`), which nobody else resolves. Upstream then pastes the server's path onto the whole
  LDS URL, LDS port included, which is wrong for any server registered with an LDS other than
  itself. We put the LDS URL's host in place of the unresolvable one and keep the server's own
  scheme, port and path.
- An LDS remembers registrations of servers that have died (asyncua's never forgets them;
  others keep them ~10 min). We TCP-probe each selected server URL too and drop the ones that
  do not answer, so a vanished server leaves the list at the next poll (`probe_servers=False`
  restores upstream's behaviour).
- A discovery URL without a port means the OPC UA default port 4840 (upstream skips it), and a
  URL that is not `opc.tcp://host[:port]` is rejected when the Configuration is validated
  rather than skipped silently at run time.

asyncua is asyncio-only: its FindServers runs on the process's one asyncio bridge thread
(`aio_bridge`), cancellable from trio. The probes and DNS lookups are plain trio.

A discovery server is on the network and may be anyone: asyncua buffers a message whatever
size its header claims, and lets the server's Acknowledge lift the client's own message limit.
So every byte a FindServers connection receives is counted at the socket, and the connection
is aborted past `max_response_bytes` (default 1 MiB, env `OPCUA_MAX_RESPONSE_BYTES`). Nor may
its answer turn the handler into a port scanner: the servers it lists are resolved and
probed at most `probe_concurrency` at a time (default 8, env `OPCUA_PROBE_CONCURRENCY`), and
only on hosts the Configuration allows: the discovery URL's own host, plus `allowedHosts`.
A listed server elsewhere is left out, unprobed, with a log line, and its host name is looked
up in DNS only when the answer could make it one we probe (`plan_server`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar
from urllib.parse import SplitResult, urlsplit

import attrs
import trio

from akri_trio.discovery import aio_bridge
from akri_trio.discovery.aio_bridge import AioBridge, BridgeStopped
from akri_trio.discovery.filters import FilterList, admits, parse_filter_list
from akri_trio.discovery.interface import (
    MAX_DETAILS_BYTES,
    InvalidDetails,
    Properties,
    Send,
    details_parser,
    load_mapping,
    max_details_bytes,
    positive_int_setting,
    str_list,
)
from akri_trio.model.device import Device

log = logging.getLogger(__name__)

NAME: Final = "opcua"
PROPERTY: Final = "OPCUA_DISCOVERY_URL"
INTERVAL_ENV: Final = "OPCUA_DISCOVERY_INTERVAL_SECS"
MAX_RESPONSE_BYTES_ENV: Final = "OPCUA_MAX_RESPONSE_BYTES"
# A FindServers answer lists a few servers in a few kB; an LDS with hundreds stays under this.
MAX_RESPONSE_BYTES: Final = 1 << 20
PROBE_CONCURRENCY_ENV: Final = "OPCUA_PROBE_CONCURRENCY"
PROBE_CONCURRENCY: Final = 8
ANY_HOST: Final = "*"
DEFAULT_DISCOVERY_URLS: Final = ("opc.tcp://localhost:4840/",)
DEFAULT_PORT: Final = 4840
OPC_TCP: Final = "opc.tcp"
# ua.ApplicationType.Server; kept here so the pure core needs no asyncua import.
APPLICATION_TYPE_SERVER: Final = 0

T = TypeVar("T")


# ---- details (pure) -----------------------------------------------------------------------------


@attrs.frozen
class OpcuaDetails:
    discovery_urls: tuple[str, ...] = DEFAULT_DISCOVERY_URLS
    application_names: FilterList | None = None
    allowed_hosts: tuple[str, ...] = ()  # lower-cased; besides each discovery URL's own host


@details_parser
def parse_details(text: str, *, max_bytes: int = MAX_DETAILS_BYTES) -> OpcuaDetails:
    """Upstream's `OpcuaDiscoveryDetails` (serde, camelCase); unknown keys are ignored."""
    doc = load_mapping(text, max_bytes=max_bytes)
    method = doc.get("opcuaDiscoveryMethod")
    if method is None:
        raise InvalidDetails("opcuaDiscoveryMethod", "is required")
    if not isinstance(method, dict) or len(method) != 1:
        raise InvalidDetails("opcuaDiscoveryMethod", "must be a mapping with one key: standard")
    (kind,) = method
    if kind != "standard":
        raise InvalidDetails(
            "opcuaDiscoveryMethod", f"unknown method {kind!r}; only `standard` is supported"
        )
    standard = method[kind]
    if standard is None:
        standard = {}
    if not isinstance(standard, dict):
        raise InvalidDetails("opcuaDiscoveryMethod.standard", "must be a mapping")
    urls_field = "opcuaDiscoveryMethod.standard.discoveryUrls"
    urls: tuple[str, ...]
    if standard.get("discoveryUrls") is None:
        urls = DEFAULT_DISCOVERY_URLS
    else:
        urls = str_list(standard["discoveryUrls"], urls_field)
    for i, url in enumerate(urls):
        problem = url_problem(url)
        if problem:
            raise InvalidDetails(f"{urls_field}[{i}]", problem)
    hosts: tuple[str, ...] = ()
    if doc.get("allowedHosts") is not None:
        hosts = tuple(
            h.strip().strip("[]").lower() for h in str_list(doc["allowedHosts"], "allowedHosts")
        )
    return OpcuaDetails(
        discovery_urls=urls,
        application_names=parse_filter_list(doc, "applicationNames"),
        allowed_hosts=hosts,
    )


def url_problem(url: str) -> str | None:
    """Why `url` is no usable discovery URL (None: it is)."""
    expected = "must be an opc.tcp://host[:port][/path] URL"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"{expected}: {exc}"
    if parts.scheme.lower() != OPC_TCP or not parts.hostname:
        return f"{expected}, got {url!r}"
    return None


# ---- choosing URLs (pure) -----------------------------------------------------------------------


@attrs.frozen
class Application:
    """The parts of a FindServers `ApplicationDescription` that discovery looks at."""

    name: str
    application_type: int
    discovery_urls: tuple[str, ...]


def preferred_url(app: Application) -> str | None:
    """The first opc.tcp discovery URL (it supports both security layers), else the first."""
    for url in app.discovery_urls:
        if url.lower().startswith(OPC_TCP + "://"):
            return url
    return app.discovery_urls[0] if app.discovery_urls else None


def selected_urls(apps: Iterable[Application], names: FilterList | None) -> list[str]:
    """The preferred URL of every `Server` application that passes the name filter."""
    urls = []
    for app in apps:
        if app.application_type != APPLICATION_TYPE_SERVER or not admits(names, app.name):
            continue
        url = preferred_url(app)
        if url:
            urls.append(url)
    return urls


def host_of(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def endpoint_of(url: str) -> tuple[str, int] | None:
    """(host, port) to probe for an opc.tcp URL; None for other schemes or garbage."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() != OPC_TCP or not parts.hostname:
        return None
    return parts.hostname, DEFAULT_PORT if port is None else port


def on_lds_host(url: str, lds_url: str) -> str:
    """`url` with its host replaced by the LDS URL's host (port, path, scheme kept)."""
    lds_host = host_of(lds_url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url
    if not lds_host or not parts.hostname:
        return url
    host = f"[{lds_host}]" if ":" in lds_host else lds_host
    netloc = host if port is None else f"{host}:{port}"
    if "@" in parts.netloc:
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" + netloc
    return SplitResult(parts.scheme, netloc, parts.path, parts.query, parts.fragment).geturl()


def host_allowed(url: str, lds_url: str, allowed_hosts: Iterable[str]) -> bool:
    """May a server URL listed by the discovery server at `lds_url` be probed and reported?
    Its host must be the discovery URL's host or one of `allowed_hosts` (`*`: any)."""
    host = host_of(url)
    if not host:
        return False
    allowed = {h.lower() for h in allowed_hosts}
    lds_host = host_of(lds_url)
    return (
        ANY_HOST in allowed or host.lower() in allowed or host.lower() == (lds_host or "").lower()
    )


@attrs.frozen
class ServerPlan:
    """What to do with a server URL a discovery server listed: use `url` (None: leave it
    out), unless `lookup` is set: then look that host name up first, and if it does not
    resolve use `fallback` instead."""

    url: str | None
    lookup: str | None = None
    fallback: str | None = None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def plan_server(url: str, lds_url: str, allowed_hosts: Iterable[str]) -> ServerPlan:
    """Decide on a listed server URL before any DNS lookup, so only what may be probed is
    resolved (a discovery server may list any name: each lookup is a DNS query it chose).

    A host that does not resolve stands for the discovery server's own host (#624: a
    container's hostname); a lookup is made only where its answer can matter: for a name the
    filter allows as it is (resolving: kept; not: on the discovery URL's host), and for a
    single-label name it does not allow (a container's hostname is one label: not resolving,
    it is put on the discovery URL's host; resolving, it is left out). A dotted name that is
    not allowed is left out unresolved; an IP address or the discovery URL's own host needs
    no lookup.
    """
    allowed = tuple(allowed_hosts)
    host = host_of(url)
    if not host:
        return ServerPlan(None)
    as_is = host_allowed(url, lds_url, allowed)
    if _is_ip(host) or host.lower() == (host_of(lds_url) or "").lower():
        return ServerPlan(url if as_is else None)
    rebuilt = on_lds_host(url, lds_url)
    fallback = rebuilt if host_allowed(rebuilt, lds_url, allowed) else None
    if as_is:
        return ServerPlan(url, lookup=host, fallback=fallback)
    if "." not in host.rstrip("."):
        return ServerPlan(None, lookup=host, fallback=fallback)
    return ServerPlan(None)


def merged(url_lists: Iterable[Iterable[str]]) -> list[str]:
    """All URLs, first occurrence wins (a server registered with two LDSes is one device)."""
    return list(dict.fromkeys(url for urls in url_lists for url in urls))


def devices_for(urls: Iterable[str]) -> list[Device]:
    return [Device(id=url, properties={PROPERTY: url}) for url in urls]


# ---- I/O edges ----------------------------------------------------------------------------------


async def tcp_reachable(host: str, port: int) -> bool:
    """Does something accept a TCP connection there? (The caller bounds the wait.)"""
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return False
    await stream.aclose()
    return True


async def resolves(host: str) -> bool:
    try:
        await trio.socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    return True


class AnswerTooLarge(Exception):
    """A server sent more bytes on one FindServers connection than we accept."""


def _count_received(uaclient: Any, max_bytes: int, exceeded: list[int]) -> None:
    """Make `uaclient`'s next connection abort once it has received more than `max_bytes`
    (appending the count to `exceeded`), before asyncua buffers or parses the excess."""
    make_protocol = uaclient._make_protocol

    def make_counting_protocol() -> Any:
        protocol = make_protocol()
        deliver = protocol.data_received
        received = 0

        def data_received(data: bytes) -> None:
            nonlocal received
            received += len(data)
            if received > max_bytes:
                if not exceeded:
                    exceeded.append(received)
                    if protocol.transport is not None:
                        protocol.transport.abort()
                return
            deliver(data)

        protocol.data_received = data_received
        return protocol

    uaclient._make_protocol = make_counting_protocol


async def find_servers(url: str, max_bytes: int = MAX_RESPONSE_BYTES) -> list[Application]:
    """FindServers on `url` (an asyncio coroutine: run it on the bridge). No session needed.
    Raises AnswerTooLarge when the server sends more than `max_bytes` on the connection."""
    from asyncua.client.client import (
        Client,
    )  # asyncio-only and slow to import: only where it is used

    client = Client(url)
    exceeded: list[int] = []
    _count_received(client.uaclient, max_bytes, exceeded)
    try:
        await client.connect_sessionless()
        try:
            descriptions = await client.find_servers()
        finally:
            await client.disconnect_sessionless()
    except Exception:
        if exceeded:
            raise AnswerTooLarge(f"{url} sent more than {max_bytes} bytes") from None
        raise
    return [
        Application(
            name=(d.ApplicationName.Text or "") if d.ApplicationName else "",
            application_type=int(d.ApplicationType),
            discovery_urls=tuple(u for u in (d.DiscoveryUrls or ()) if u),
        )
        for d in descriptions
    ]


async def _gather(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run the calls concurrently; results in call order."""
    results: list[Any] = [None] * len(calls)

    async def one(i: int) -> None:
        results[i] = await calls[i]()

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(one, i)
    return results


@attrs.define
class Opcua:
    """The handler. Times are seconds; `bridge` defaults to the process-wide one."""

    poll_interval: float = 10.0
    probe_timeout: float = 3.0
    request_timeout: float = 10.0
    probe_servers: bool = True
    max_details_bytes: int = MAX_DETAILS_BYTES
    max_response_bytes: int = MAX_RESPONSE_BYTES
    probe_concurrency: int = PROBE_CONCURRENCY
    bridge: AioBridge = attrs.field(factory=aio_bridge.shared)
    resolve: Callable[[str], Awaitable[bool]] = resolves  # does a host name resolve?
    shared: bool = True
    name: str = NAME

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Opcua:
        env = os.environ if env is None else env
        raw = env.get(INTERVAL_ENV, "").strip()
        interval = 10.0
        if raw:
            try:
                interval = float(raw)
            except ValueError:
                raise ValueError(
                    f"{INTERVAL_ENV} must be a number of seconds, got {raw!r}"
                ) from None
            if not interval > 0:
                raise ValueError(f"{INTERVAL_ENV} must be positive, got {raw!r}")
        return cls(
            poll_interval=interval,
            max_details_bytes=max_details_bytes(env),
            max_response_bytes=positive_int_setting(
                env, MAX_RESPONSE_BYTES_ENV, MAX_RESPONSE_BYTES
            ),
            probe_concurrency=positive_int_setting(env, PROBE_CONCURRENCY_ENV, PROBE_CONCURRENCY),
        )

    def parse_details(self, text: str) -> OpcuaDetails:
        return parse_details(text, max_bytes=self.max_details_bytes)

    async def discover(self, details: OpcuaDetails, properties: Properties, send: Send) -> None:
        last: list[Device] | None = None
        while True:
            devices = devices_for(await self.discover_once(details))
            if devices != last:
                last = devices
                await send(devices)
            await trio.sleep(self.poll_interval)

    async def discover_once(self, details: OpcuaDetails) -> list[str]:
        """One round over every discovery URL: the device URLs, in a stable order."""
        limiter = trio.CapacityLimiter(self.probe_concurrency)
        per_lds = await _gather(
            [partial(self._servers_at, url, details, limiter) for url in details.discovery_urls]
        )
        return merged(per_lds)

    async def _probe(self, url: str) -> bool:
        target = endpoint_of(url)
        if target is None:
            return False
        with trio.move_on_after(self.probe_timeout):
            return await tcp_reachable(*target)
        return False

    async def _servers_at(
        self, lds_url: str, details: OpcuaDetails, limiter: trio.CapacityLimiter
    ) -> list[str]:
        if not await self._probe(lds_url):
            log.info("opcua: %s does not accept TCP connections; skipped this round", lds_url)
            return []
        apps: list[Application] | None = None
        with trio.move_on_after(self.request_timeout):
            try:
                apps = await self.bridge.run(find_servers(lds_url, self.max_response_bytes))
            except BridgeStopped:
                raise
            except Exception as exc:  # a misbehaving server must not end discovery
                log.warning("opcua: FindServers on %s failed: %r", lds_url, exc)
                return []
        if apps is None:
            log.warning("opcua: FindServers on %s timed out", lds_url)
            return []
        selected = selected_urls(apps, details.application_names)
        urls = await _gather(
            [partial(self._usable, url, lds_url, details, limiter) for url in selected]
        )
        return [url for url in urls if url is not None]

    async def _usable(
        self, url: str, lds_url: str, details: OpcuaDetails, limiter: trio.CapacityLimiter
    ) -> str | None:
        async with limiter:
            return await self._usable_now(url, lds_url, details)

    async def _usable_now(self, listed: str, lds_url: str, details: OpcuaDetails) -> str | None:
        plan = plan_server(listed, lds_url, details.allowed_hosts)
        url = plan.url
        if plan.lookup is not None and not await self.resolve(plan.lookup):
            log.debug("opcua: %s does not resolve; using %s", listed[:200], plan.fallback)
            url = plan.fallback
        if url is None:
            log.info(
                "opcua: %s (listed by %s) is not on an allowed host; left out unprobed "
                "(allowedHosts widens this)",
                listed[:200],
                lds_url,
            )
            return None
        if self.probe_servers and endpoint_of(url) is not None and not await self._probe(url):
            log.info("opcua: server %s (listed by %s) is unreachable; left out", url, lds_url)
            return None
        return url
