"""onvif: IP cameras found by WS-Discovery and confirmed through their ONVIF device service.

Upstream's handler, Configuration-compatible (same discoveryDetails, discoveryProperties
credential formats, device ids and broker properties), minus its known misses: the Probe
declares its namespace prefix (#486), goes out on every multicast-capable interface rather than
the default route's only, and a camera that rejects our credentials is logged and skipped
rather than stalling the round (#659).

Layout: the decisions (details, filters, ids, properties) are pure functions here; the probe
lives in `onvif_probe`, the device service and credentials in `onvif_device`. `Onvif.discover`
is the loop: probe for `discoveryTimeoutSeconds` (the protocol's own window, the only timeout we
own), query the survivors concurrently (`query_concurrency` at a time, each on an HTTP
connection of its own and bounded by `device_timeout`: a round with hundreds of answers never
builds one connection pool holding them all), send the full list, sleep `poll_interval`.
Between rounds nothing runs: one sleeping task, ~0 % CPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import attrs
import trio

from akri_trio.discovery.filters import FilterList, parse_filter_list, passes
from akri_trio.discovery.handlers.onvif_device import (
    MAX_RESPONSE_BYTES,
    AnswerTooLarge,
    AuthenticationFailed,
    Credential,
    DeviceClient,
    DeviceFacts,
    credential_for,
    device_document,
    open_device_client,
    resolve_credentials,
)
from akri_trio.discovery.handlers.onvif_probe import (
    CONTAINER_INTERFACES,
    DEFAULT_MAX_MATCHES,
    ProbeMatch,
    ProbeReplies,
    choose_interfaces,
    local_interfaces,
    multicast_addresses,
    new_message_id,
    normalize_uuid,
    probe_interfaces,
)
from akri_trio.discovery.interface import (
    MAX_DETAILS_BYTES,
    InvalidDetails,
    Properties,
    Send,
    describe_kind,
    details_parser,
    load_mapping,
    max_details_bytes,
    positive_int_setting,
    report_problems,
)
from akri_trio.model.device import Device

log = logging.getLogger(__name__)

NAME: Final = "onvif"
SERVICE_URL: Final = "ONVIF_DEVICE_SERVICE_URL"
DEVICE_UUID: Final = "ONVIF_DEVICE_UUID"
IP_ADDRESS: Final = "ONVIF_DEVICE_IP_ADDRESS"
MAC_ADDRESS: Final = "ONVIF_DEVICE_MAC_ADDRESS"
# Ours, not upstream's (which hard-codes 10 s).
POLL_INTERVAL_ENV: Final = "ONVIF_POLL_INTERVAL_SECONDS"
DEVICE_TIMEOUT_ENV: Final = "ONVIF_DEVICE_TIMEOUT_SECONDS"
MAX_RESPONSE_BYTES_ENV: Final = "ONVIF_MAX_RESPONSE_BYTES"
MAX_MATCHES_ENV: Final = "ONVIF_MAX_MATCHES"
QUERY_CONCURRENCY_ENV: Final = "ONVIF_QUERY_CONCURRENCY"
# Cameras whose device service is queried at once, each on a connection of its own.
DEFAULT_QUERY_CONCURRENCY: Final = 16
# Comma-separated interface-name globs: probe only from these / never from these.
INTERFACES_ENV: Final = "ONVIF_INTERFACES"
EXCLUDE_INTERFACES_ENV: Final = "ONVIF_EXCLUDE_INTERFACES"
DEFAULT_POLL_INTERVAL: Final = 10.0
DEFAULT_DEVICE_TIMEOUT: Final = 5.0
# A probe window longer than this stalls every round; upstream's examples use 1-10 s.
MAX_DISCOVERY_TIMEOUT_S: Final = 300


@attrs.frozen
class OnvifDetails:
    ip_addresses: FilterList | None = None
    mac_addresses: FilterList | None = None
    scopes: FilterList | None = None
    uuids: FilterList | None = None
    discovery_timeout_seconds: int = 1


# ---- details (pure) -----------------------------------------------------------------------------


@details_parser
def parse_details(text: str, *, max_bytes: int = MAX_DETAILS_BYTES) -> OnvifDetails:
    """Upstream's OnvifDiscoveryDetails (camelCase keys; unknown keys ignored, as serde)."""
    doc = load_mapping(text, max_bytes=max_bytes)
    timeout = doc.get("discoveryTimeoutSeconds", 1)
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        problem = f"must be an integer, got {describe_kind(timeout)}"
        raise InvalidDetails("discoveryTimeoutSeconds", problem)
    if not 0 < timeout <= MAX_DISCOVERY_TIMEOUT_S:
        raise InvalidDetails(
            "discoveryTimeoutSeconds",
            f"must be between 1 and {MAX_DISCOVERY_TIMEOUT_S}, got {str(timeout)[:20]}",
        )
    return OnvifDetails(
        ip_addresses=parse_filter_list(doc, "ipAddresses"),
        mac_addresses=parse_filter_list(doc, "macAddresses"),
        scopes=parse_filter_list(doc, "scopes"),
        uuids=parse_filter_list(doc, "uuids"),
        discovery_timeout_seconds=timeout,
    )


# ---- filters (pure) -----------------------------------------------------------------------------


def passes_filter(filter_list: FilterList | None, values: Iterable[str | None]) -> bool:
    """Case-insensitive equality (upstream's ip/mac rule): Include keeps a device when one of
    its values equals an item, Exclude drops it then. An unknown value (None) matches nothing."""
    wanted = {item.lower() for item in filter_list.items} if filter_list else set()
    matched = any(v is not None and v.lower() in wanted for v in values)
    return passes(filter_list, matched)


def passes_scopes(filter_list: FilterList | None, scopes: Iterable[str]) -> bool:
    """Scopes match exactly, token by token (a scope URI is case-sensitive in its path)."""
    wanted = set(filter_list.items) if filter_list else set()
    return passes(filter_list, any(s in wanted for s in scopes))


def passes_uuid(filter_list: FilterList | None, device_uuid: str) -> bool:
    """uuids are compared normalized, so `urn:uuid:ABC` in a Configuration matches `abc`."""
    wanted = {normalize_uuid(i) for i in filter_list.items} if filter_list else set()
    return passes(filter_list, normalize_uuid(device_uuid) in wanted)


def probe_filter(details: OnvifDetails, match: ProbeMatch) -> bool:
    """What can be decided from the ProbeMatch alone, before any HTTP."""
    return passes_scopes(details.scopes, match.scopes) and passes_uuid(details.uuids, match.uuid)


def facts_filter(details: OnvifDetails, facts: DeviceFacts) -> bool:
    return passes_filter(details.ip_addresses, [facts.ip_address]) and passes_filter(
        details.mac_addresses, [facts.mac_address]
    )


# ---- devices (pure) -----------------------------------------------------------------------------


def device_id(service_url: str, device_uuid: str) -> str:
    return f"{service_url}-{normalize_uuid(device_uuid)}"


def to_device(match: ProbeMatch, facts: DeviceFacts) -> Device:
    properties = {SERVICE_URL: facts.service_url, DEVICE_UUID: match.uuid}
    if facts.ip_address is not None:
        properties[IP_ADDRESS] = facts.ip_address
    if facts.mac_address is not None:
        properties[MAC_ADDRESS] = facts.mac_address
    return Device(id=device_id(facts.service_url, match.uuid), properties=properties)


# ---- the handler --------------------------------------------------------------------------------


def _positive(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        log.warning("onvif: ignoring %s=%r (not a number)", key, raw)
        return default
    return value if value > 0 else default


async def query_camera(
    client: DeviceClient, match: ProbeMatch, credential: Credential | None
) -> DeviceFacts | None:
    """Try the camera's XAddrs in order; the first that answers is its service URL. None when
    none answers. Raises AuthenticationFailed when the camera rejects our credentials: the
    caller reports it (a misconfigured Secret should be visible, but must not cost us the
    other cameras)."""
    for url in match.xaddrs:
        try:
            return await client.query(url, credential)
        except AuthenticationFailed:
            raise
        except AnswerTooLarge as exc:
            log.warning("onvif: skipping camera %s: %s", match.uuid, exc)
            return None
        except Exception as exc:
            log.debug("onvif: %s (camera %s) did not answer: %r", url, match.uuid, exc)
    return None


@attrs.frozen
class RefusalChanges:
    """After a round: cameras that began refusing our credentials (or now say so
    differently), with how; and cameras that accept them again."""

    refusing: dict[str, str]
    recovered: tuple[str, ...]


def next_refusals(
    before: Mapping[str, str],
    refused: Mapping[str, str],
    answered: Iterable[str],
    queried: Iterable[str],
) -> tuple[dict[str, str], RefusalChanges]:
    """The cameras refusing after a round ({uuid: how}) and what changed, given those refusing
    before, this round's refusals, the uuids that answered and those queried at all. A camera
    queried that did neither (it timed out) keeps its state; one not queried (gone from the
    network) is forgotten without a word, so the count is of cameras present."""
    answered, queried = set(answered), set(queried)
    kept = {u: h for u, h in before.items() if u in queried and u not in answered}
    changes = RefusalChanges(
        refusing={u: h for u, h in sorted(refused.items()) if before.get(u) != h},
        recovered=tuple(sorted(u for u in before if u in answered)),
    )
    return kept | dict(refused), changes


# Cameras a status line names before "and N more" (each with the address and user it refused).
LISTED_REFUSALS: Final = 3


def refusal_problems(current: Mapping[str, str]) -> list[str]:
    """The line for the Configuration's status about the cameras refusing the configured
    credentials (uuid -> how it refused), or none when no camera refuses them."""
    if not current:
        return []
    listed = [f"{uuid} ({current[uuid]})" for uuid in sorted(current)[:LISTED_REFUSALS]]
    more = len(current) - LISTED_REFUSALS
    return [
        f"{len(current)} camera(s) refused the configured credentials: "
        + "; ".join(listed)
        + (f"; and {more} more" if more > 0 else "")
    ]


@attrs.define
class Refusals:
    """The cameras refusing the configured credentials, kept across one `discover`'s rounds
    so each camera is logged once per change, not once per round."""

    current: dict[str, str] = attrs.field(factory=dict)

    def update(
        self, refused: Mapping[str, str], answered: Iterable[str], queried: Iterable[str]
    ) -> None:
        """Take in a round (see `next_refusals`) and log what changed."""
        self.current, changes = next_refusals(self.current, refused, answered, queried)
        for uuid, how in changes.refusing.items():
            log.warning(
                "onvif: camera %s refuses the configured credentials, skipped: %s "
                "(%d camera(s) refusing them)",
                uuid, how, len(self.current),
            )  # fmt: skip
        for uuid in changes.recovered:
            log.info("onvif: camera %s accepts the configured credentials again", uuid)


def report_refused(replies: ProbeReplies) -> None:
    """One line per kind of reply a round refused, after the round."""
    if replies.unsolicited:
        log.warning(
            "onvif: ignored %d ProbeMatches that answer no probe of this round (RelatesTo is "
            "not our MessageID)",
            replies.unsolicited,
        )
    if replies.foreign:
        log.warning(
            "onvif: ignored %d XAddrs on other hosts than the reply's sender: %s",
            replies.foreign,
            " ".join(replies.foreign_xaddrs),
        )
    if replies.over_cap:
        log.warning(
            "onvif: %d ProbeMatches past the cap of %d cameras a round (%s) left out: %s",
            replies.over_cap,
            replies.max_matches,
            MAX_MATCHES_ENV,
            " ".join(replies.over_cap_uuids),
        )


def _globs(raw: str) -> tuple[str, ...]:
    return tuple(g.strip() for g in raw.split(",") if g.strip())


@attrs.define
class Onvif:
    """The handler. `interfaces` lists the local IPv4 addresses to probe from (default: every
    up, running, multicast-capable interface at the start of each round, chosen by name with
    `include_interfaces` / `exclude_interfaces`, see `choose_interfaces`)."""

    poll_interval: float = DEFAULT_POLL_INTERVAL
    device_timeout: float = DEFAULT_DEVICE_TIMEOUT
    include_interfaces: tuple[str, ...] = ()
    exclude_interfaces: tuple[str, ...] = CONTAINER_INTERFACES
    interfaces: Callable[[], Sequence[str]] | None = None
    max_details_bytes: int = MAX_DETAILS_BYTES
    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_matches: int = DEFAULT_MAX_MATCHES
    query_concurrency: int = DEFAULT_QUERY_CONCURRENCY
    name: str = NAME
    shared: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Onvif:
        env = os.environ if env is None else env
        exclude = env.get(EXCLUDE_INTERFACES_ENV)
        return cls(
            include_interfaces=_globs(env.get(INTERFACES_ENV, "")),
            exclude_interfaces=CONTAINER_INTERFACES if exclude is None else _globs(exclude),
            poll_interval=_positive(env, POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL),
            device_timeout=_positive(env, DEVICE_TIMEOUT_ENV, DEFAULT_DEVICE_TIMEOUT),
            max_details_bytes=max_details_bytes(env),
            max_response_bytes=positive_int_setting(
                env, MAX_RESPONSE_BYTES_ENV, MAX_RESPONSE_BYTES
            ),
            max_matches=positive_int_setting(env, MAX_MATCHES_ENV, DEFAULT_MAX_MATCHES),
            query_concurrency=positive_int_setting(
                env, QUERY_CONCURRENCY_ENV, DEFAULT_QUERY_CONCURRENCY
            ),
        )

    def parse_details(self, text: str) -> OnvifDetails:
        return parse_details(text, max_bytes=self.max_details_bytes)

    async def probe(self, details: OnvifDetails) -> dict[str, ProbeMatch]:
        """One WS-Discovery round: the deduplicated matches heard within the window."""
        replies = ProbeReplies(new_message_id(), self.max_matches)
        if self.interfaces is not None:
            addresses = list(self.interfaces())
        else:  # getifaddrs: microseconds, no thread hop needed
            chosen = choose_interfaces(
                local_interfaces(),
                include=self.include_interfaces,
                exclude=self.exclude_interfaces,
            )
            addresses = multicast_addresses(chosen)
        with trio.move_on_after(details.discovery_timeout_seconds):
            await probe_interfaces(addresses, replies)
        report_refused(replies)
        return replies.matches

    async def confirm(
        self,
        details: OnvifDetails,
        matches: Iterable[ProbeMatch],
        credentials: Mapping[str, Credential],
        refusals: Refusals | None = None,
    ) -> list[Device]:
        """The devices among `matches` that pass the filters and answer their device service,
        queried `query_concurrency` at a time, each on a connection of its own and within
        `device_timeout`. Cameras refusing the credentials are left out and reported through
        `refusals` (kept across rounds by the caller)."""
        found: list[Device] = []
        refused: dict[str, str] = {}
        answered: list[str] = []
        limiter = trio.CapacityLimiter(self.query_concurrency)

        async def one(match: ProbeMatch) -> None:
            facts = None
            async with limiter, open_device_client(self.max_response_bytes) as client:
                with trio.move_on_after(self.device_timeout) as scope:
                    try:
                        credential = credential_for(credentials, match.uuid)
                        facts = await query_camera(client, match, credential)
                    except AuthenticationFailed as exc:
                        refused[match.uuid] = str(exc)
                        return
            if scope.cancelled_caught:
                log.info("onvif: camera %s did not answer within %ss", match.uuid,
                         self.device_timeout)  # fmt: skip
                return
            if facts is not None:
                answered.append(match.uuid)
                if facts_filter(details, facts):
                    found.append(to_device(match, facts))

        queried = [match for match in matches if probe_filter(details, match)]
        async with trio.open_nursery() as nursery:
            for match in queried:
                nursery.start_soon(one, match)
        (refusals if refusals is not None else Refusals()).update(
            refused, answered, [match.uuid for match in queried]
        )
        return found

    async def discover(self, details: OnvifDetails, properties: Properties, send: Send) -> None:
        credentials = resolve_credentials(properties)
        refusals = Refusals()
        await device_document()  # parsed once per process, off the event loop
        while True:
            matches = await self.probe(details)
            devices = await self.confirm(details, matches.values(), credentials, refusals)
            await send(devices)
            await report_problems(send, refusal_problems(refusals.current))
            await trio.sleep(self.poll_interval)
