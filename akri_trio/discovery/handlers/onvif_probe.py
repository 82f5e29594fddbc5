"""WS-Discovery for ONVIF cameras: the Probe we multicast, the ProbeMatches we accept, and the
thin socket edge that sends one Probe per network interface.

Why a module of its own: upstream's probe is where ONVIF discovery most often goes wrong.
It writes `netwsdl:NetworkVideoTransmitter` without declaring `netwsdl` (#486; strict devices
drop it), and, like most ONVIF clients, it sends from one socket that the kernel routes out of the
default-route interface only, so cameras on a second NIC are never seen. Here the message is
built with a declared prefix, replies are parsed by namespace (not prefix: real cameras use `d:`,
`wsdd:`, `dn:`, default namespaces ...), and one socket per IPv4 interface address sends the
Probe with IP_MULTICAST_IF set to that address.

Anyone on the LAN can answer a Probe, and whatever XAddrs a reply lists is where the handler
then sends the camera's credentials. So a reply counts only when it answers this round's Probe
(its RelatesTo names our MessageID, `answers`) on a socket of this round (closed when the
window ends), and it only vouches for its own address: XAddrs on any other host are dropped as
it arrives (`from_source`), and a host name, which we cannot tie to the sender, counts as
another host. A round keeps at most `max_matches` devices (`merge_match`); what it refused is
counted in `ProbeReplies` for the caller to report once per round. Probes leave only from the node's
own interfaces: container bridges and veths (docker0, cni0, veth*, ...) are skipped unless
named in an include list (`choose_interfaces`), since a pod network is not a camera LAN.

Pure: `probe_message`, `parse_probe_reply`, `answers`, `from_source`, `ProbeReplies.add`,
`choose_interfaces`, `multicast_addresses`, `merge_match`, `normalize_uuid`. I/O:
`local_interfaces` (getifaddrs) and `probe_interfaces` (trio sockets).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fnmatch
import ipaddress
import logging
import os
import socket
import sys
import uuid as uuid_module
from collections.abc import Iterable, Sequence
from typing import Final
from urllib.parse import urlsplit

import attrs
import trio
from lxml import etree

log = logging.getLogger(__name__)

MULTICAST_GROUP: Final = "239.255.255.250"
WS_DISCOVERY_PORT: Final = 3702
MAX_DATAGRAM: Final = 65_535

NS_SOAP12: Final = "http://www.w3.org/2003/05/soap-envelope"
NS_ADDRESSING: Final = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
NS_DISCOVERY: Final = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
# WS-Discovery 1.1 (OASIS); ONVIF mandates the 2005/04 draft, but accepting both costs nothing.
NS_DISCOVERY_11: Final = "http://docs.oasis-open.org/ws-dd/ns/discovery/2009/01"
NS_ONVIF_NETWORK: Final = "http://www.onvif.org/ver10/network/wsdl"
PROBE_ACTION: Final = f"{NS_DISCOVERY}/Probe"
DISCOVERY_TO: Final = "urn:schemas-xmlsoap-org:ws:2005:04:discovery"
ANONYMOUS: Final = f"{NS_ADDRESSING}/role/anonymous"

_DISCOVERY_NAMESPACES: Final = (NS_DISCOVERY, NS_DISCOVERY_11)
# Devices one round keeps (ONVIF_MAX_MATCHES), and XAddrs per device.
DEFAULT_MAX_MATCHES: Final = 256
MAX_XADDRS: Final = 8


@attrs.frozen
class ProbeMatch:
    """One device as a ProbeMatch describes it. `uuid` is normalized (see `normalize_uuid`);
    `address` is the EndpointReference as sent."""

    uuid: str
    address: str
    xaddrs: tuple[str, ...]
    scopes: tuple[str, ...]
    types: tuple[str, ...] = ()


def normalize_uuid(address: str) -> str:
    """`urn:uuid:ABC` / `uuid:ABC` / `ABC` -> `abc` (upstream strips these prefixes and
    lower-cases, so ids stay stable whatever form a camera uses)."""
    value = address.strip()
    lowered = value.lower()
    for prefix in ("urn:", "uuid:"):
        if lowered.startswith(prefix):
            value, lowered = value[len(prefix) :], lowered[len(prefix) :]
    return lowered


def new_message_id() -> str:
    return f"urn:uuid:{uuid_module.uuid4()}"


def probe_message(message_id: str) -> bytes:
    """The SOAP 1.2 Probe for ONVIF NetworkVideoTransmitters, every prefix declared."""
    nsmap = {"s": NS_SOAP12, "a": NS_ADDRESSING, "d": NS_DISCOVERY, "dn": NS_ONVIF_NETWORK}
    must_understand = f"{{{NS_SOAP12}}}mustUnderstand"
    envelope = etree.Element(f"{{{NS_SOAP12}}}Envelope", nsmap=nsmap)
    header = etree.SubElement(envelope, f"{{{NS_SOAP12}}}Header")
    action = etree.SubElement(header, f"{{{NS_ADDRESSING}}}Action", {must_understand: "true"})
    action.text = PROBE_ACTION
    etree.SubElement(header, f"{{{NS_ADDRESSING}}}MessageID").text = message_id
    reply_to = etree.SubElement(header, f"{{{NS_ADDRESSING}}}ReplyTo")
    etree.SubElement(reply_to, f"{{{NS_ADDRESSING}}}Address").text = ANONYMOUS
    to = etree.SubElement(header, f"{{{NS_ADDRESSING}}}To", {must_understand: "true"})
    to.text = DISCOVERY_TO
    body = etree.SubElement(envelope, f"{{{NS_SOAP12}}}Body")
    probe = etree.SubElement(body, f"{{{NS_DISCOVERY}}}Probe")
    etree.SubElement(probe, f"{{{NS_DISCOVERY}}}Types").text = "dn:NetworkVideoTransmitter"
    return bytes(etree.tostring(envelope, xml_declaration=True, encoding="UTF-8"))


# No DTDs, no entities, no network: a datagram from the LAN is untrusted input.
_PARSER: Final = etree.XMLParser(
    resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False, recover=False
)


def _local(tag: object) -> str:
    return etree.QName(tag).localname if isinstance(tag, str) else ""


def _namespace(tag: object) -> str | None:
    return etree.QName(tag).namespace if isinstance(tag, str) else None


def _child(element: etree._Element, localname: str) -> etree._Element | None:
    for child in element:
        if _local(child.tag) == localname:
            return child
    return None


def _tokens(element: etree._Element | None) -> tuple[str, ...]:
    if element is None or element.text is None:
        return ()
    return tuple(element.text.split())


@attrs.frozen
class ProbeReply:
    """A WS-Discovery reply: what it says it answers (its RelatesTo header, if any) and its
    ProbeMatch entries."""

    relates_to: str | None
    matches: list[ProbeMatch]


def parse_probe_matches(data: bytes) -> list[ProbeMatch]:
    """The ProbeMatch entries of a WS-Discovery reply; [] for anything else (Hello, Bye, a
    Probe, garbage). Whether the reply answers our Probe is not looked at: see
    `parse_probe_reply` and `answers`."""
    return parse_probe_reply(data).matches


def answers(relates_to: str | None, message_id: str) -> bool:
    """Whether a reply's RelatesTo names our Probe's MessageID. Compared as uuids (prefix
    `urn:uuid:` / `uuid:`, case and braces aside), as cameras write it in assorted forms; one
    that names anything else (a camera that writes `uuid:NetworkVideoTransmitter`) does not
    answer us: an unsolicited ProbeMatches is how a host that never saw our Probe would get
    a camera's credentials."""
    if relates_to is None:
        return False
    ours = normalize_uuid(message_id).strip("{}")
    return bool(ours) and normalize_uuid(relates_to).strip("{}") == ours


def parse_probe_reply(data: bytes) -> ProbeReply:
    """A WS-Discovery reply's RelatesTo and ProbeMatch entries (none for a Hello, Bye, a
    Probe, garbage).

    Matching is by namespace and local name, never by prefix. A match without an
    EndpointReference address or without XAddrs is useless to us and skipped.
    """
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError:
        return ProbeReply(None, [])
    if _local(root.tag) != "Envelope":
        return ProbeReply(None, [])
    header = _child(root, "Header")
    relates_el = _child(header, "RelatesTo") if header is not None else None
    relates_to = (relates_el.text or "").strip() if relates_el is not None else None
    body = _child(root, "Body")
    if body is None:
        return ProbeReply(relates_to, [])
    matches: list[ProbeMatch] = []
    for container in body:
        if _local(container.tag) != "ProbeMatches":
            continue
        if _namespace(container.tag) not in _DISCOVERY_NAMESPACES:
            continue
        for entry in container:
            if _local(entry.tag) != "ProbeMatch":
                continue
            match = _probe_match(entry)
            if match is not None:
                matches.append(match)
    return ProbeReply(relates_to, matches)


def _probe_match(entry: etree._Element) -> ProbeMatch | None:
    epr = _child(entry, "EndpointReference")
    address_el = _child(epr, "Address") if epr is not None else None
    address = (address_el.text or "").strip() if address_el is not None else ""
    xaddrs = _tokens(_child(entry, "XAddrs"))
    if not address or not xaddrs:
        return None
    return ProbeMatch(
        uuid=normalize_uuid(address),
        address=address,
        xaddrs=xaddrs,
        scopes=_tokens(_child(entry, "Scopes")),
        types=_tokens(_child(entry, "Types")),
    )


def _on_host(url: str, source: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    try:
        host = urlsplit(url).hostname
        return host is not None and ipaddress.ip_address(host) == source
    except ValueError:  # a host name, or no URL at all
        return False


def from_source(matches: Iterable[ProbeMatch], source: str) -> tuple[list[ProbeMatch], list[str]]:
    """The matches of a reply from `source` (an IP address) with only the XAddrs on that
    address, and the XAddrs dropped. A match left without XAddrs is dropped too."""
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return [], [x for m in matches for x in m.xaddrs]
    kept: list[ProbeMatch] = []
    dropped: list[str] = []
    for match in matches:
        own = tuple(x for x in match.xaddrs if _on_host(x, address))
        dropped.extend(x for x in match.xaddrs if x not in own)
        if own:
            kept.append(attrs.evolve(match, xaddrs=own))
    return kept, dropped


def merge_match(merged: dict[str, ProbeMatch], match: ProbeMatch, max_devices: int) -> bool:
    """Merge one match into `merged`, deduplicated by uuid. A camera that answers on two
    interfaces (or repeats its reply, as WS-Discovery recommends) is one device: the first
    reply wins, later XAddrs are appended, up to MAX_XADDRS. False when the match is a new
    device and `merged` already holds `max_devices` (it is left out)."""
    seen = merged.get(match.uuid)
    if seen is None:
        if len(merged) >= max_devices:
            return False
        merged[match.uuid] = attrs.evolve(match, xaddrs=_distinct(match.xaddrs)[:MAX_XADDRS])
        return True
    extra = _distinct(x for x in match.xaddrs if x not in seen.xaddrs)
    if extra and len(seen.xaddrs) < MAX_XADDRS:
        xaddrs = (seen.xaddrs + extra)[:MAX_XADDRS]
        merged[match.uuid] = attrs.evolve(seen, xaddrs=xaddrs)
    return True


def _distinct(xaddrs: Iterable[str]) -> tuple[str, ...]:
    """`xaddrs` in order, each once (a repeated address must not use up MAX_XADDRS)."""
    return tuple(dict.fromkeys(xaddrs))


def merge_matches(matches: Iterable[ProbeMatch]) -> dict[str, ProbeMatch]:
    """`merge_match` over a whole list, without a device cap."""
    merged: dict[str, ProbeMatch] = {}
    for match in matches:
        merge_match(merged, match, max_devices=sys.maxsize)
    return merged


# ---- interfaces ---------------------------------------------------------------------------------

IFF_UP: Final = 0x1
IFF_LOOPBACK: Final = 0x8
IFF_RUNNING: Final = 0x40
IFF_MULTICAST: Final = 0x1000
# Container and VM plumbing (Docker, CNI plugins, libvirt, LXC, Podman, tunnels): never a
# camera LAN. Globs on the interface name.
CONTAINER_INTERFACES: Final = (
    "docker*",
    "br-*",
    "veth*",
    "cni*",
    "flannel*",
    "cali*",
    "vxlan*",
    "weave*",
    "kube-*",
    "cilium*",
    "lxc*",
    "virbr*",
    "podman*",
    "tunl*",
)


@attrs.frozen
class Interface:
    name: str
    flags: int
    address: str  # IPv4, dotted quad


def choose_interfaces(
    interfaces: Iterable[Interface],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = CONTAINER_INTERFACES,
) -> list[Interface]:
    """The interfaces to probe from, by name: those matching an `include` glob when any is
    given (exclusions then do not apply: naming an interface is asking for it), otherwise all
    but those matching an `exclude` glob."""

    def named(iface: Interface, globs: Sequence[str]) -> bool:
        return any(fnmatch.fnmatchcase(iface.name, g) for g in globs)

    if include:
        return [i for i in interfaces if named(i, include)]
    return [i for i in interfaces if not named(i, exclude)]


def multicast_addresses(interfaces: Iterable[Interface]) -> list[str]:
    """The IPv4 addresses to send a Probe from: every address of an interface that is up,
    running (has carrier) and multicast-capable (so loopback only if someone enabled multicast
    on it), each once, in order."""
    wanted = IFF_UP | IFF_RUNNING | IFF_MULTICAST
    chosen: list[str] = []
    for iface in interfaces:
        if iface.flags & wanted == wanted and iface.address not in chosen:
            try:
                ipaddress.IPv4Address(iface.address)
            except ValueError:
                continue
            chosen.append(iface.address)
    return chosen


class _Sockaddr(ctypes.Structure):
    _fields_ = [("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_ubyte * 14)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_Ifaddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.POINTER(_Sockaddr)),
    ("ifa_netmask", ctypes.POINTER(_Sockaddr)),
    ("ifa_ifu", ctypes.POINTER(_Sockaddr)),
    ("ifa_data", ctypes.c_void_p),
]


def local_interfaces() -> list[Interface]:
    """IPv4 interface addresses with their flags, from getifaddrs(3). The standard library has
    no way to list every address with its IFF_MULTICAST flag; this is a handful of microseconds
    and touches no network."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"getifaddrs: {os.strerror(errno)}")
    found: list[Interface] = []
    try:
        node = head
        while node:
            entry = node.contents
            addr = entry.ifa_addr
            if addr and addr.contents.sa_family == socket.AF_INET:
                # sockaddr_in: 2 bytes port, then the 4-byte address.
                raw = bytes(addr.contents.sa_data[2:6])
                found.append(
                    Interface(
                        name=(entry.ifa_name or b"").decode(errors="replace"),
                        flags=int(entry.ifa_flags),
                        address=socket.inet_ntoa(raw),
                    )
                )
            node = entry.ifa_next
    finally:
        libc.freeifaddrs(head)
    return found


# ---- the socket edge ----------------------------------------------------------------------------


@attrs.define
class ProbeReplies:
    """One round's Probe (its MessageID) and what `probe_interfaces` heard in answer; kept by
    the caller, so a cancelled window loses nothing. `matches` holds the devices (merged by
    uuid, at most `max_matches`); the counters say what was refused, for one report a round."""

    message_id: str
    max_matches: int = DEFAULT_MAX_MATCHES
    matches: dict[str, ProbeMatch] = attrs.field(factory=dict)
    senders: set[tuple[str, str]] = attrs.field(factory=set)  # (from address, via local addr)
    unsolicited: int = 0  # replies that answer no Probe of this round
    foreign: int = 0  # XAddrs on another host than their reply's sender (the first few below)
    foreign_xaddrs: list[str] = attrs.field(factory=list)
    over_cap: int = 0  # ProbeMatches of devices past max_matches (the first few uuids below)
    over_cap_uuids: list[str] = attrs.field(factory=list)

    def add(self, reply: ProbeReply, sender: str, local_address: str) -> None:
        """Take in one datagram's reply from `sender`, heard on `local_address` (pure)."""
        if not reply.matches:
            return
        if not answers(reply.relates_to, self.message_id):
            self.unsolicited += 1
            return
        matches, dropped = from_source(reply.matches, sender)
        self.foreign += len(dropped)
        _keep_a_few(self.foreign_xaddrs, dropped)
        for match in matches:
            if merge_match(self.matches, match, self.max_matches):
                self.senders.add((sender, local_address))
            else:
                self.over_cap += 1
                _keep_a_few(self.over_cap_uuids, [match.uuid])


def _keep_a_few(sample: list[str], more: Iterable[str], few: int = 4) -> None:
    for item in more:
        if len(sample) >= few:
            return
        if item not in sample:
            sample.append(item)


async def _open_probe_socket(local_address: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        # The whole point: leave through THIS interface, not the default route's. (Linux already
        # picks the device owning a bound source address for multicast; the option makes it
        # explicit and does not depend on that.)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(local_address))
        await sock.bind((local_address, 0))
    except BaseException:
        sock.close()
        raise
    return sock


async def probe_interfaces(
    local_addresses: Sequence[str],
    replies: ProbeReplies,
    *,
    group: tuple[str, int] = (MULTICAST_GROUP, WS_DISCOVERY_PORT),
) -> None:
    """Send the Probe from each local address and collect ProbeMatches into `replies` until
    cancelled: the caller owns the window (discoveryTimeoutSeconds). An interface that cannot
    send (address gone, no route) is logged and skipped; the others carry on. Every socket is
    closed on the way out."""
    message = probe_message(replies.message_id)
    sockets: list[tuple[str, trio.socket.SocketType]] = []
    try:
        for address in local_addresses:
            try:
                sock = await _open_probe_socket(address)
            except OSError as exc:
                log.warning("onvif: cannot probe from %s: %s", address, exc)
                continue
            sockets.append((address, sock))
            try:
                await sock.sendto(message, group)
            except OSError as exc:
                log.warning("onvif: probe from %s failed: %s", address, exc)
        async with trio.open_nursery() as nursery:
            for address, sock in sockets:
                nursery.start_soon(_receive, address, sock, replies)
    finally:
        for _, sock in sockets:
            sock.close()


async def _receive(local_address: str, sock: trio.socket.SocketType, replies: ProbeReplies) -> None:
    while True:
        try:
            data, sender = await sock.recvfrom(MAX_DATAGRAM)
        except OSError as exc:  # the interface went away mid-window: stop listening on it
            log.warning("onvif: receiving on %s failed: %s", local_address, exc)
            return
        replies.add(parse_probe_reply(data), str(sender[0]), local_address)
