"""A discovery handler as its own process: serve v0.DiscoveryHandler and stay registered.

This is what `akri-trio discovery-handler <name>` runs (upstream: one binary per handler, in a
DaemonSet). Two jobs, under one nursery:

- serve `Discover` on a Unix socket (`$DISCOVERY_HANDLERS_DIRECTORY/<name>.sock`) or TCP. Each
  stream runs the handler (through `discover_changes`, so every message is the full list and
  only changes are sent) in a producer task owned by the server's long-lived nursery, handing
  lists to the purerpc response generator over a memory channel: trio forbids a generator from
  yielding inside a nursery, and purerpc wants a generator;
- keep the agent knowing about us. Upstream #558: a handler's registration is lost when the
  agent restarts. So we register with backoff until it works, then watch the agent's
  registration socket (inode change or disappearance = a new agent) and re-register; a Discover
  stream dropped by its client (the agent went away, or a Configuration left) also triggers a
  re-registration, which the agent treats as a harmless refresh.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Final

import purerpc
import trio

from akri_trio.discovery.interface import AnyHandler, InvalidDetails, discover_changes
from akri_trio.discovery.wire import properties_from_proto, response_to_proto
from akri_trio.model.device import Device
from akri_trio.rpc.gen import discovery_pb2 as pb
from akri_trio.rpc.gen.discovery_grpc import DiscoveryHandlerServicer, RegistrationStub
from akri_trio.rpc.uds import DEFAULT_LIMITS, ServerLimits, UnixChannel, serve_tcp, serve_unix
from akri_trio.runtime import Backoff, Changed

log = logging.getLogger(__name__)

DEFAULT_DIRECTORY: Final = Path("/var/lib/akri")
DIRECTORY_ENV: Final = "DISCOVERY_HANDLERS_DIRECTORY"
REGISTRATION_SOCKET: Final = "agent-registration.sock"
REGISTER_BACKOFF: Final = Backoff(base=0.5, cap=10.0)  # upstream retries every 10 s
WATCH_INTERVAL_S: Final = 1.0
REGISTER_TIMEOUT_S: Final = 10.0
# The agent connects to us: as our group (a handler run as non-root shares its group with the
# agent, see registration.share_with_group), or as root.
SOCKET_MODE: Final = 0o660


def handlers_directory(env: Mapping[str, str]) -> Path:
    return Path(env.get(DIRECTORY_ENV) or DEFAULT_DIRECTORY)


class DiscoveryHandlerService(DiscoveryHandlerServicer):
    """v0.DiscoveryHandler for one handler. `nursery` must outlive every stream (it runs the
    producers); `on_client_gone` is called when a client drops a stream we were serving."""

    def __init__(
        self,
        handler: AnyHandler,
        nursery: trio.Nursery,
        on_client_gone: Callable[[], None] = lambda: None,
    ) -> None:
        self.handler = handler
        self._nursery = nursery
        self._on_client_gone = on_client_gone

    async def Discover(  # the gRPC method name
        self, request: pb.DiscoverRequest
    ) -> AsyncIterator[pb.DiscoverResponse]:
        try:
            details = self.handler.parse_details(request.discovery_details)
        except InvalidDetails as exc:
            raise purerpc.InvalidArgumentError(str(exc)) from exc
        properties = properties_from_proto(request)

        # (devices, problems), one DiscoverResponse each; problems wait for the first list.
        send_lists, receive_lists = trio.open_memory_channel[tuple[list[Device], tuple[str, ...]]](
            0
        )
        producer_scope = trio.CancelScope()
        failure: list[Exception] = []
        last: tuple[list[Device] | None, tuple[str, ...]] = (None, ())

        async def send(devices: list[Device]) -> None:
            nonlocal last
            last = (devices, last[1])
            await send_lists.send((devices, last[1]))

        async def report(problems: tuple[str, ...]) -> None:
            nonlocal last
            last = (last[0], problems)
            if last[0] is not None:
                await send_lists.send((last[0], problems))

        async def produce() -> None:
            with producer_scope, send_lists:
                try:
                    await discover_changes(self.handler, details, properties, send, report=report)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the stream is gone; nobody wants the list
                except Exception as exc:
                    log.exception("discovery handler %s failed", self.handler.name)
                    failure.append(exc)

        self._nursery.start_soon(produce)
        finished = False
        try:
            async for devices, problems in receive_lists:
                yield response_to_proto(devices, problems)
            finished = True
        finally:
            # Synchronous on purpose: this may run from purerpc's aclose() in a cancelled
            # scope, or from the async-generator finalizer.
            producer_scope.cancel()
            receive_lists.close()
            if not finished:
                self._on_client_gone()
        if failure:
            raise purerpc.UnavailableError(f"{self.handler.name} failed: {failure[0]!r}")


# ---- registration -------------------------------------------------------------------------------


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


async def register_once(socket_path: Path, request: pb.RegisterDiscoveryHandlerRequest) -> None:
    """One RegisterDiscoveryHandler call; raises on any failure."""
    async with UnixChannel(socket_path) as channel:
        await RegistrationStub(channel).RegisterDiscoveryHandler(request)


async def keep_registered(
    socket_path: Path,
    request: pb.RegisterDiscoveryHandlerRequest,
    nudge: Changed | None = None,
    *,
    backoff: Backoff = REGISTER_BACKOFF,
    watch_interval: float = WATCH_INTERVAL_S,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Register with the agent at `socket_path`, retrying with backoff; then re-register
    whenever that socket is replaced or removed (a new agent), or when `nudge` is bumped.
    Reports started after the first successful registration. Runs until cancelled."""
    started = False
    attempt = 0
    nudge = nudge or Changed()
    while True:
        # The inode before the call: if the agent is replaced between here and the call, we
        # see a change afterwards and register once more, never once too few.
        inode = _inode(socket_path)
        nudged = nudge.version  # a nudge from here on asks for one more registration
        try:
            # An agent that accepted but never answers must not stall us forever.
            with trio.fail_after(REGISTER_TIMEOUT_S):
                await register_once(socket_path, request)
        except Exception as exc:  # any failure: the agent may be starting, or a new one coming
            delay = backoff.delay(attempt)
            attempt += 1
            log.warning("registering %s failed (%r); retry in %.1f s", request.name, exc, delay)
            await trio.sleep(delay)
            continue
        attempt = 0
        log.info("registered %s at %s with the agent", request.name, request.endpoint)
        if not started:
            started = True
            task_status.started()
        await _until_agent_changes(socket_path, inode, nudge, nudged, watch_interval)


async def _until_agent_changes(
    socket_path: Path, inode: int | None, nudge: Changed, nudged: int, watch_interval: float
) -> None:
    # One stat per interval is all the watching costs (and it works across the hostPath
    # mount that the agent and a handler pod share, where inotify may not).
    async with trio.open_nursery() as nursery:

        async def until_nudged() -> None:
            await nudge.wait_past(nudged)
            nursery.cancel_scope.cancel()

        nursery.start_soon(until_nudged)
        # A file has no Event to wait on: poll it.
        while True:
            await trio.sleep(watch_interval)
            if _inode(socket_path) != inode:
                break
        nursery.cancel_scope.cancel()


async def run_standalone(
    handler: AnyHandler,
    *,
    registration_socket: Path,
    socket_path: Path | None = None,
    network: tuple[str, int] | None = None,
    advertise_host: str | None = None,
    backoff: Backoff = REGISTER_BACKOFF,
    watch_interval: float = WATCH_INTERVAL_S,
    limits: ServerLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `handler` on `socket_path` (UDS) or `network` (host, port; 0 = any free port),
    each connection within `limits`, and keep it registered with the agent. Reports the
    registered endpoint once it is serving (registration keeps retrying in the background).
    Removes its socket when cancelled."""
    if (socket_path is None) == (network is None):
        raise ValueError("exactly one of socket_path and network")
    nudge = Changed()
    async with trio.open_nursery() as nursery:
        service = DiscoveryHandlerService(handler, nursery, on_client_gone=nudge.bump)
        if socket_path is not None:
            await nursery.start(
                functools.partial(serve_unix, mode=SOCKET_MODE, limits=limits), socket_path, service
            )
            endpoint = os.fspath(socket_path)
            kind = pb.RegisterDiscoveryHandlerRequest.UDS
        else:
            assert network is not None
            host, port = network
            bound: int = await nursery.start(
                functools.partial(serve_tcp, limits=limits), host, port, service
            )
            shown = advertise_host or host
            endpoint = f"http://[{shown}]:{bound}" if ":" in shown else f"http://{shown}:{bound}"
            kind = pb.RegisterDiscoveryHandlerRequest.NETWORK
        request = pb.RegisterDiscoveryHandlerRequest(
            name=handler.name, endpoint=endpoint, endpoint_type=kind, shared=handler.shared
        )
        nursery.start_soon(
            functools.partial(
                keep_registered,
                registration_socket,
                request,
                nudge,
                backoff=backoff,
                watch_interval=watch_interval,
            )
        )
        task_status.started(endpoint)
