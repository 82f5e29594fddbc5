"""The agent's v0.Registration server: where discovery handlers announce themselves.

Handlers call RegisterDiscoveryHandler on
`$DISCOVERY_HANDLERS_DIRECTORY/agent-registration.sock` (mode 0600: only the node's privileged
handlers may register; with a handler group, see `share_with_group`, 0660 and that group's
handlers too, which then run as non-root). Requests are validated here, purely, before anything
reaches the registry: an empty or overlong name, or an endpoint that is overlong or does not
match its type, is answered with InvalidArgument and a message saying what is wrong; no request
can crash the server, and what is logged of a request is bounded. The same task also removes
handlers that stayed Offline past their grace period on time, since the registry itself has no
clock to wake it.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Final

import purerpc
import trio

from akri_trio.discovery.registry import EndpointType, Registration, Registry, RegistryEvent
from akri_trio.rpc.gen import discovery_pb2 as pb
from akri_trio.rpc.gen.discovery_grpc import RegistrationServicer
from akri_trio.rpc.uds import (
    DEFAULT_LIMITS,
    ServerLimits,
    TcpEndpoint,
    UnixEndpoint,
    parse_endpoint,
    serve_unix,
)
from akri_trio.runtime import Changed

log = logging.getLogger(__name__)

SOCKET_NAME: Final = "agent-registration.sock"
SOCKET_MODE: Final = 0o600
GROUP_SOCKET_MODE: Final = 0o660
# setgid: what handlers create here (their sockets) belongs to the group, so the agent, a
# member, can connect to them without root's DAC override (the DaemonSet drops ALL caps).
# sticky: a handler may unlink or rename over only its own user's files, never the registration
# socket or the socket of a handler of another user (Discover calls carry resolved Secrets).
GROUP_DIRECTORY_MODE: Final = 0o3770
# Upstream's handler names are a word ("udev", "debugEcho"); a Unix socket path is at most
# 108 bytes and an http://host:port endpoint not much longer.
MAX_NAME_LENGTH: Final = 128
MAX_ENDPOINT_LENGTH: Final = 1024
_SHOWN: Final = 60  # how much of a rejected value a message quotes
_TYPES = {
    pb.RegisterDiscoveryHandlerRequest.UDS: EndpointType.UDS,
    pb.RegisterDiscoveryHandlerRequest.NETWORK: EndpointType.NETWORK,
}


class InvalidRegistration(ValueError):
    pass


def registration_from_request(request: pb.RegisterDiscoveryHandlerRequest) -> Registration:
    """Validate a request (pure); raises InvalidRegistration with a message for the handler."""
    name = request.name
    if not name.strip():
        raise InvalidRegistration("name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidRegistration(
            f"name {name[:_SHOWN]!r}... is {len(name)} characters; the limit is {MAX_NAME_LENGTH}"
        )
    if name != name.strip() or any(c.isspace() or not c.isprintable() for c in name):
        raise InvalidRegistration(f"name {name!r} must not contain whitespace")
    kind = _TYPES.get(request.endpoint_type)
    if kind is None:
        raise InvalidRegistration(f"unknown endpoint_type {request.endpoint_type}")
    if not request.endpoint:
        raise InvalidRegistration("endpoint must not be empty")
    if len(request.endpoint) > MAX_ENDPOINT_LENGTH:
        raise InvalidRegistration(
            f"endpoint {request.endpoint[:_SHOWN]!r}... is {len(request.endpoint)} characters; "
            f"the limit is {MAX_ENDPOINT_LENGTH}"
        )
    try:
        target: UnixEndpoint | TcpEndpoint | None = parse_endpoint(request.endpoint)
    except ValueError as exc:
        if kind is EndpointType.NETWORK:
            raise InvalidRegistration(f"bad endpoint: {exc}") from exc
        target = None
    if kind is EndpointType.UDS and not (
        isinstance(target, UnixEndpoint) and os.path.isabs(target.path)
    ):
        raise InvalidRegistration(
            f"endpoint_type UDS needs an absolute socket path, got {request.endpoint!r}"
        )
    if kind is EndpointType.NETWORK and not isinstance(target, TcpEndpoint):
        raise InvalidRegistration(
            f"endpoint_type NETWORK needs http://host:port, got {request.endpoint!r}"
        )
    return Registration(name, request.endpoint, kind, request.shared)


class RegistrationService(RegistrationServicer):
    """v0.Registration, feeding `registry`."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def RegisterDiscoveryHandler(  # the gRPC method name
        self, input_message: pb.RegisterDiscoveryHandlerRequest
    ) -> pb.Empty:
        try:
            registration = registration_from_request(input_message)
        except InvalidRegistration as exc:
            log.warning("rejected a discovery handler registration: %s", exc)
            raise purerpc.InvalidArgumentError(str(exc)) from exc
        log.info(
            "discovery handler %s registered at %s (%s, shared=%s)",
            registration.name,
            registration.endpoint,
            registration.endpoint_type.value,
            registration.shared,
        )
        self.registry.register(registration)
        return pb.Empty()


async def expire_offline(registry: Registry) -> None:
    """Call `registry.expire()` whenever an Offline endpoint's grace period runs out, so its
    removal is announced on time. Runs until cancelled; sleeps when nothing is due."""
    changed = Changed()

    def on_event(event: RegistryEvent) -> None:
        changed.bump()

    unsubscribe = registry.subscribe(on_event)
    try:
        while True:
            seen = changed.version
            due = registry.next_expiry()
            with trio.move_on_at(due if due is not None else float("inf")):
                await changed.wait_past(seen)
            registry.expire()
    finally:
        unsubscribe()


def share_with_group(directory: Path, gid: int) -> None:
    """Let the handlers of group `gid` (non-root) use the handlers directory: group `gid`,
    mode 3770 (setgid and sticky). The agent owns the directory; changing its group to one the
    agent is a member of (the Pod's supplementalGroups) needs no capability."""
    try:
        if directory.stat().st_gid != gid:
            os.chown(directory, -1, gid)
        os.chmod(directory, GROUP_DIRECTORY_MODE)
    except PermissionError as exc:
        # Not ours to change (another owner, or the agent is not in the group): root's
        # handlers still work; the group's cannot register, and this says why.
        log.error("cannot share %s with group %d: %s", directory, gid, exc)


async def serve_registration(
    registry: Registry,
    socket_path: Path,
    *,
    mode: int = SOCKET_MODE,
    limits: ServerLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve v0.Registration on `socket_path` (`mode`, 0600 by default; a stale file is
    replaced, ours is removed on the way out; each connection within `limits`) and expire
    Offline handlers, until cancelled."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(expire_offline, registry)
        path: Path = await nursery.start(
            functools.partial(
                serve_unix, socket_path, RegistrationService(registry), mode=mode, limits=limits
            )
        )
        task_status.started(path)
