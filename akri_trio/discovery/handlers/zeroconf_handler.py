"""zeroconf: services announced over mDNS / DNS-SD (Bonjour, Avahi) as devices.

Upstream Akri had a zeroconf prototype (never shipped as a working handler); this one keeps its
Configuration keys and property names where it had them and defines the rest:

    kind: _http._tcp              # or kinds: [_http._tcp, _ipp._tcp]; ".local." optional
    name: "printer-.*"            # optional: regex, FULL match on the instance name
    host: "plc-[0-9]+\\.local"     # optional: regex, FULL match on the host name (no final
                                  #   dot) or on any of the service's addresses
    port: 8080                    # optional: exact
    txtRecords:                   # optional: every key must be present; a value must be equal
      model: X100                 #   (keys case-insensitive as DNS-SD says; null = any value)
      secure: null

Regexes rather than globs or exact strings: exact names are valid regexes (escape dots if you
care), and udev's post-filters upstream are full-match regexes too. They run on RE2
(`linear_regex`): names come from anyone on the LAN, so matching must be linear in them.

One device per resolved service instance. id = the service's full name
(`My Printer._ipp._tcp.local.`). Properties (broker env vars):

    AKRI_ZEROCONF_DEVICE_KIND       _ipp._tcp
    AKRI_ZEROCONF_DEVICE_NAME       My Printer            (the instance name)
    AKRI_ZEROCONF_DEVICE_HOST       printer-3.local       (SRV target, no final dot)
    AKRI_ZEROCONF_DEVICE_ADDR       10.0.0.7              (the first address; the prototype's)
    AKRI_ZEROCONF_DEVICE_ADDRESSES  10.0.0.7,fd00::7      (all, IPv4 first)
    AKRI_ZEROCONF_DEVICE_PORT       631
    AKRI_ZEROCONF_DEVICE_<KEY>      one per TXT record: key upper-cased, every character
                                    outside A-Z0-9 turned into `_`; a key without a value
                                    gives "". The fixed names above win over a TXT record
                                    that maps onto them.

How it runs: python-zeroconf's threaded API (`Zeroconf` runs its own loop thread; AsyncZeroconf
cannot run under trio, research/stack.md §5). A `ServiceBrowser` calls back in its own thread;
the callback only hands the event to trio through the trio token and a memory channel.
Resolution reads the cache first (the browser's answers usually carry SRV, TXT and A records)
and only then runs the blocking `get_service_info` in a worker thread, abandoned on
cancellation. Browser events come from multicast traffic, so appearances and goodbyes show
within about a second, and nothing runs while nothing changes. One Zeroconf instance serves
every Configuration of a handler (each gets its own browser): its sockets and loop thread are
opened by the first `discover` and closed when the last one ends, cancellation included. The pod
needs `hostNetwork: true` to see the LAN's mDNS.

Anyone on the LAN can announce names, also names that never resolve, each of which holds a
worker thread for `resolve_timeout` per attempt. So resolutions run on the handler's own small
CapacityLimiter (`resolve_threads`, default 4), never on trio's default one that the rest of
the process (the agent's udev scans, file reads, ...) shares; a name already being resolved is
not resolved again (a newer event for it makes the running resolution start over); and at most
`max_services` names (default 1024, env `ZEROCONF_MAX_SERVICES`) are tracked per
Configuration, further ones ignored with a warning.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import math
import os
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from functools import partial
from typing import Any, Final

import attrs
import trio

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
from akri_trio.discovery.linear_regex import Regex, RegexError
from akri_trio.model.device import Device
from akri_trio.runtime import Changed

log = logging.getLogger(__name__)

CLOSE_BOUND_S: Final = 5.0

NAME: Final = "zeroconf"
PREFIX: Final = "AKRI_ZEROCONF_DEVICE"
KIND: Final = f"{PREFIX}_KIND"
INSTANCE: Final = f"{PREFIX}_NAME"
HOST: Final = f"{PREFIX}_HOST"
ADDR: Final = f"{PREFIX}_ADDR"
ADDRESSES: Final = f"{PREFIX}_ADDRESSES"
PORT: Final = f"{PREFIX}_PORT"
FIXED: Final = frozenset({KIND, INSTANCE, HOST, ADDR, ADDRESSES, PORT})
# Comma-separated addresses or interface names to use; unset = all interfaces.
INTERFACES_ENV: Final = "ZEROCONF_INTERFACES"
MAX_SERVICES_ENV: Final = "ZEROCONF_MAX_SERVICES"
MAX_SERVICES: Final = 1024
RESOLVE_THREADS: Final = 4

_KIND_RE = re.compile(r"(_[A-Za-z0-9-]{1,63}\._sub\.)?_[A-Za-z0-9-]{1,15}\._(tcp|udp)")


# ---- details (pure) -----------------------------------------------------------------------------


@attrs.frozen
class ZeroconfDetails:
    """`kinds` are bare service types (`_http._tcp`); patterns are compiled, full-match."""

    kinds: tuple[str, ...]
    name: Regex | None = None
    host: Regex | None = None
    port: int | None = None
    txt_records: tuple[tuple[str, str | None], ...] = ()  # keys lower-cased

    @property
    def service_types(self) -> list[str]:
        return [f"{kind}.local." for kind in self.kinds]


def normalize_kind(kind: str, field: str) -> str:
    bare = kind.strip().rstrip(".")
    if bare.lower().endswith(".local"):
        bare = bare[: -len(".local")]
    if not _KIND_RE.fullmatch(bare):
        raise InvalidDetails(
            field, f"must be a DNS-SD service type like `_http._tcp` (got {kind!r})"
        )
    return bare


def _pattern(doc: Mapping[str, Any], field: str) -> Regex | None:
    value = doc.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidDetails(field, "must be a string (a regular expression)")
    try:
        return Regex(value)
    except RegexError as exc:
        raise InvalidDetails(field, f"is not a valid regular expression: {exc}") from None


@details_parser
def parse_details(text: str, *, max_bytes: int = MAX_DETAILS_BYTES) -> ZeroconfDetails:
    doc = load_mapping(text, max_bytes=max_bytes)
    has_kind, has_kinds = doc.get("kind") is not None, doc.get("kinds") is not None
    if has_kind == has_kinds:
        raise InvalidDetails("kind", "exactly one of `kind` or `kinds` is required")
    if has_kind:
        if not isinstance(doc["kind"], str):
            raise InvalidDetails("kind", "must be a string")
        kinds: tuple[str, ...] = (normalize_kind(doc["kind"], "kind"),)
    else:
        raw = str_list(doc["kinds"], "kinds")
        if not raw:
            raise InvalidDetails("kinds", "must name at least one service type")
        kinds = tuple(dict.fromkeys(normalize_kind(k, f"kinds[{i}]") for i, k in enumerate(raw)))

    port = doc.get("port")
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536
    ):
        raise InvalidDetails("port", f"must be a port number (1-65535), got {port!r}")

    txt = doc.get("txtRecords")
    records: dict[str, str | None] = {}
    if txt is not None:
        if not isinstance(txt, dict):
            raise InvalidDetails("txtRecords", "must be a mapping of key to value (or null)")
        for key, value in txt.items():
            if not isinstance(key, str) or not key:
                raise InvalidDetails("txtRecords", f"keys must be strings, got {key!r}")
            if isinstance(value, bool) or value is None:
                # YAML `true` is the text "true" in a TXT record
                records[key.lower()] = None if value is None else str(value).lower()
            elif isinstance(value, str | int | float):
                records[key.lower()] = str(value)
            else:
                raise InvalidDetails(f"txtRecords.{key}", "must be a string, number or null")
    return ZeroconfDetails(
        kinds=kinds,
        name=_pattern(doc, "name"),
        host=_pattern(doc, "host"),
        port=port,
        txt_records=tuple(sorted(records.items())),
    )


# ---- services, filters, devices (pure) ----------------------------------------------------------


@attrs.frozen
class Service:
    """A resolved DNS-SD service instance, as plain data."""

    full_name: str  # "My Printer._ipp._tcp.local."
    kind: str  # "_ipp._tcp"
    instance: str  # "My Printer"
    host: str  # "printer-3.local"
    addresses: tuple[str, ...]
    port: int
    txt: tuple[tuple[str, str | None], ...] = ()  # as announced (case kept), in order


def instance_name(full_name: str, service_type: str) -> str:
    suffix = "." + service_type
    if full_name.lower().endswith(suffix.lower()):
        return full_name[: -len(suffix)]
    return full_name


def ordered_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """Distinct addresses, IPv4 before IPv6, each group in numeric order."""
    parsed = {ipaddress.ip_address(a.split("%", 1)[0]): a for a in addresses}
    return tuple(parsed[ip] for ip in sorted(parsed, key=lambda ip: (ip.version, ip)))


def matches(details: ZeroconfDetails, service: Service) -> bool:
    if service.kind.lower() not in {k.lower() for k in details.kinds}:
        return False
    if details.name is not None and not details.name.fullmatch(service.instance):
        return False
    if details.host is not None and not any(
        details.host.fullmatch(candidate) for candidate in (service.host, *service.addresses)
    ):
        return False
    if details.port is not None and service.port != details.port:
        return False
    announced: dict[str, str | None] = {}
    for key, value in service.txt:
        announced.setdefault(key.lower(), value)  # DNS-SD: the first occurrence counts
    for key, wanted in details.txt_records:
        if key not in announced:
            return False
        if wanted is not None and announced[key] != wanted:
            return False
    return True


def env_key(txt_key: str) -> str:
    return f"{PREFIX}_" + re.sub(r"[^A-Z0-9]", "_", txt_key.upper())


def properties_of(service: Service) -> dict[str, str]:
    props: dict[str, str] = {}
    for key, value in service.txt:
        name = env_key(key)
        if name not in FIXED:
            props.setdefault(name, "" if value is None else value)
    props.update(
        {
            KIND: service.kind,
            INSTANCE: service.instance,
            HOST: service.host,
            ADDR: service.addresses[0] if service.addresses else "",
            ADDRESSES: ",".join(service.addresses),
            PORT: str(service.port),
        }
    )
    return props


def devices_for(details: ZeroconfDetails, services: Iterable[Service]) -> list[Device]:
    return sorted(
        (
            Device(id=s.full_name, properties=properties_of(s))
            for s in services
            if matches(details, s)
        ),
        key=lambda d: d.id,
    )


def service_from_info(info: Any, service_type: str) -> Service | None:
    """A zeroconf `ServiceInfo` as a `Service`; None when it lacks what a device needs."""
    if info is None or not info.server or not info.port:
        return None
    txt = tuple(
        (
            key.decode("utf-8", "replace"),
            None if value is None else value.decode("utf-8", "replace"),
        )
        for key, value in (info.properties or {}).items()
    )
    bare_type = service_type.rstrip(".")
    if bare_type.lower().endswith(".local"):
        bare_type = bare_type[: -len(".local")]
    return Service(
        full_name=info.name,
        kind=bare_type,
        instance=instance_name(info.name, service_type),
        host=info.server.rstrip("."),
        addresses=ordered_addresses(info.parsed_scoped_addresses()),
        port=int(info.port),
        txt=txt,
    )


# ---- I/O edge -----------------------------------------------------------------------------------

Event = tuple[str, str, str]  # (service type, full name, "added" | "updated" | "removed")


@attrs.define
class Zeroconf:
    """The handler. `interfaces`: addresses or interface names (None = all interfaces)."""

    interfaces: tuple[str, ...] | None = None
    resolve_timeout: float = 3.0
    resolve_attempts: int = 3
    # The first list waits for the initial burst of answers: until every service seen so far is
    # resolved and nothing new came for `quiet` seconds, or at most `settle` seconds (also the
    # wait before an empty first list: silence cannot tell "none" from "not yet").
    settle: float = 1.0
    quiet: float = 0.25
    max_details_bytes: int = MAX_DETAILS_BYTES
    max_services: int = MAX_SERVICES
    resolve_threads: int = RESOLVE_THREADS
    shared: bool = True
    name: str = NAME
    _instance: _SharedInstance = attrs.field(
        factory=lambda: _SharedInstance(), init=False, eq=False, repr=False
    )
    _limiter: trio.CapacityLimiter | None = attrs.field(
        default=None, init=False, eq=False, repr=False
    )

    def resolve_limiter(self) -> trio.CapacityLimiter:
        """The threads every resolution of this handler shares (made on first use, in trio)."""
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(self.resolve_threads)
        return self._limiter

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Zeroconf:
        env = os.environ if env is None else env
        raw = [i.strip() for i in env.get(INTERFACES_ENV, "").split(",") if i.strip()]
        return cls(
            interfaces=tuple(raw) or None,
            max_details_bytes=max_details_bytes(env),
            max_services=positive_int_setting(env, MAX_SERVICES_ENV, MAX_SERVICES),
        )

    def parse_details(self, text: str) -> ZeroconfDetails:
        return parse_details(text, max_bytes=self.max_details_bytes)

    async def discover(self, details: ZeroconfDetails, properties: Properties, send: Send) -> None:
        import zeroconf as zc_lib  # only where it is used

        events_in, events = trio.open_memory_channel[Event](math.inf)
        token = trio.lowlevel.current_trio_token()

        def on_change(
            zeroconf: zc_lib.Zeroconf,
            service_type: str,
            name: str,
            state_change: zc_lib.ServiceStateChange,
        ) -> None:  # in the browser's thread: only hand over
            event = (service_type, name, state_change.name.lower())
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(_offer, events_in, event)

        interfaces: Any = list(self.interfaces) if self.interfaces else zc_lib.InterfaceChoice.All
        async with self._instance.use(partial(zc_lib.Zeroconf, interfaces=interfaces)) as zc:
            browser: zc_lib.ServiceBrowser | None = None
            try:
                browser = await trio.to_thread.run_sync(
                    partial(zc_lib.ServiceBrowser, zc, details.service_types, handlers=[on_change])
                )
                await self._track(zc, details, events, send)
            finally:
                events_in.close()
                if browser is not None:
                    await _close_in_thread(browser.cancel, "zeroconf browser")

    async def _track(
        self,
        zc: Any,
        details: ZeroconfDetails,
        events: trio.MemoryReceiveChannel[Event],
        send: Send,
    ) -> None:
        services: dict[str, Service] = {}
        # Names seen and not removed, each with the number of its latest event (one counter
        # for all, so a name removed and seen again never repeats an earlier number).
        generation: dict[str, int] = {}
        numbers = itertools.count(1)
        seen_any = False
        in_flight: set[str] = set()  # names being resolved right now
        limiter = self.resolve_limiter()
        changed = Changed()
        last: list[Device] | None = None
        activity = Changed()  # bumped by every event and every finished resolution
        over_cap = False

        async def resolve(service_type: str, name: str) -> None:
            try:
                while name in generation:
                    gen = generation[name]
                    await resolve_once(service_type, name, gen)
                    if generation.get(name) == gen:
                        return  # no newer event came meanwhile
            finally:
                in_flight.discard(name)
                activity.bump()

        def take(info: Any, service_type: str, name: str) -> bool:
            """Record a resolved service (True), or False when `info` is incomplete."""
            service = service_from_info(info, service_type)
            if service is None:
                return False
            if services.get(name) != service:
                services[name] = service
                changed.bump()
            return True

        async def resolve_once(service_type: str, name: str, gen: int) -> None:
            # The browser's answers usually carry SRV, TXT and A records along: then the cache
            # has it all and no thread is needed (load_from_cache is thread-safe by design).
            if take(_cached_info(zc, service_type, name), service_type, name):
                return
            for attempt in range(self.resolve_attempts):
                info = await trio.to_thread.run_sync(
                    partial(
                        zc.get_service_info,
                        service_type,
                        name,
                        timeout=int(self.resolve_timeout * 1000),
                    ),
                    abandon_on_cancel=True,
                    limiter=limiter,
                )
                if generation.get(name) != gen:
                    return  # removed (or updated again) meanwhile: a newer event decides
                if take(info, service_type, name):
                    return
                log.debug("zeroconf: %s not resolved (attempt %d)", name, attempt + 1)
            log.info("zeroconf: could not resolve %s; ignoring it until it changes", name)

        async def publish(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            nonlocal last
            task_status.started()
            with trio.move_on_after(self.settle):
                while True:  # the first burst: until all seen are resolved and it went quiet
                    with trio.move_on_after(self.quiet) as silence:
                        await activity.wait_past(activity.version)
                    if silence.cancelled_caught and seen_any and not in_flight:
                        break
            while True:
                seen = changed.version
                devices = devices_for(details, services.values())
                if devices != last:
                    last = devices
                    await send(devices)
                await changed.wait_past(seen)

        async with trio.open_nursery() as nursery:
            await nursery.start(publish)
            async for service_type, name, what in events:
                activity.bump()
                seen_any = True
                if what == "removed":
                    generation.pop(name, None)  # a resolution in flight stops at its next check
                    if services.pop(name, None) is not None:
                        changed.bump()
                    over_cap = over_cap and len(generation) >= self.max_services
                    continue
                if name not in generation and len(generation) >= self.max_services:
                    if not over_cap:  # once per time the cap is reached
                        log.warning(
                            "zeroconf: tracking %d services already; ignoring new ones such as %s",
                            self.max_services,
                            name[:100],
                        )
                        over_cap = True
                    continue
                generation[name] = next(numbers)
                if name not in in_flight:  # else the running resolution starts over
                    in_flight.add(name)
                    nursery.start_soon(resolve, service_type, name)


def _cached_info(zc: Any, service_type: str, name: str) -> Any:
    """A ServiceInfo filled from `zc`'s cache, or None when the cache lacks part of it."""
    from zeroconf import ServiceInfo

    info = ServiceInfo(service_type, name)
    return info if info.load_from_cache(zc) else None


def _offer(channel: trio.MemorySendChannel[Event], event: Event) -> None:
    with contextlib.suppress(trio.ClosedResourceError):
        channel.send_nowait(event)


async def _close_in_thread(close: Callable[[], object], what: str) -> None:
    """Run a blocking close in a thread, shielded from cancellation (it must happen) but bounded:
    past CLOSE_BOUND_S the thread is left to finish on its own, so a stuck close cannot hold up
    the shutdown of the process that embeds the handler."""
    with trio.move_on_after(CLOSE_BOUND_S, shield=True) as bounded:
        await trio.to_thread.run_sync(close, abandon_on_cancel=True)
    if bounded.cancelled_caught:
        log.warning(
            "%s did not close within %.0f s; its thread finishes on its own", what, CLOSE_BOUND_S
        )


class _SharedInstance:
    """One python-zeroconf `Zeroconf` for all of a handler's `discover` calls: opened by the
    first user, closed (in a thread, shielded) when the last one leaves; a user arriving while
    the previous instance closes gets a new one."""

    def __init__(self) -> None:
        self._zc: Any = None
        self._users = 0
        self._opening = trio.Lock()

    @contextlib.asynccontextmanager
    async def use(self, open_instance: Callable[[], Any]) -> AsyncIterator[Any]:
        async with self._opening:
            if self._zc is None:
                self._zc = await trio.to_thread.run_sync(open_instance)
            self._users += 1
            zc = self._zc
        try:
            yield zc
        finally:
            self._users -= 1
            if self._users == 0 and self._zc is zc:
                self._zc = None
                await _close_in_thread(zc.close, "zeroconf instance")
