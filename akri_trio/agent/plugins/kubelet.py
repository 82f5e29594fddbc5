"""Staying registered with the kubelet: serve a plugin socket, Register, notice restarts.

A restarted kubelet deletes every socket in its device-plugins directory (ours included) and
expects plugins to come back; upstream Akri never noticed and its resources vanished until the
agent restarted. Here one `KubeletWatch` stats the directory (one syscall per tick, whatever the
number of plugins) and wakes the plugins when it changes; each plugin whose socket is gone
re-serves on a new socket and registers again.

The re-register race: while the kubelet restarts, a Register can land after the new kubelet has
already wiped our fresh socket, and the kubelet then holds a registration for a socket that no
longer exists (1.20 was seen keeping two ListAndWatch streams). So before sending Register
(connecting to kubelet.sock proves the wipe is over) we check our socket is still the inode we
served; if not, we re-serve first.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import purerpc
import trio

from akri_trio.model import naming
from akri_trio.rpc.gen import deviceplugin_v1beta1_grpc as dp_grpc
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.uds import DEFAULT_LIMITS, ServerLimits, UnixChannel, serve_unix
from akri_trio.runtime import Backoff, Changed, sleep_to_tick

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
# How often the plugin directory and kubelet.sock are stat-ed for a kubelet restart: a restart
# takes seconds, and each look wakes an otherwise idle agent (2 s, with the other periodic
# looks on the same tick, keeps an idle agent under 0.05 % of a core).
POLL_S = 2.0


# sun_path holds 108 bytes with the NUL; gRPC C-core refuses paths over 107 characters.
MAX_SOCKET_PATH = 107


def socket_path(plugin_dir: Path, plugin: str, unix_seconds: int) -> Path:
    """Upstream's `<plugin>-<secs>.sock`, or a hashed short name when that would not fit in a
    Unix socket address (Configuration names may be up to 253 characters; the kubelet only
    needs the endpoint's file name, whatever it is)."""
    path = plugin_dir / naming.plugin_socket_name(plugin, unix_seconds)
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.blake2b(plugin.encode(), digest_size=8).hexdigest()
    return plugin_dir / naming.plugin_socket_name(f"akri-{digest}", unix_seconds)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _dir_stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


class KubeletWatch:
    """Wakes waiters whenever the device-plugins directory or kubelet.sock changes."""

    def __init__(self, plugin_dir: Path, period: float = POLL_S) -> None:
        self.plugin_dir = plugin_dir
        self.period = period
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self.changes = Changed()

    def _stamp(self) -> tuple[object, ...]:
        return (_dir_stamp(self.plugin_dir), _inode(self.kubelet_socket))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        last = self._stamp()
        task_status.started()
        while True:
            await sleep_to_tick(self.period)
            stamp = self._stamp()
            if stamp != last:
                last = stamp
                self.changes.bump()

    async def wait_gone(self, path: Path, inode: int) -> None:
        """Return once `path` no longer is the socket `inode` (deleted or replaced)."""
        version = self.changes.version
        while _inode(path) == inode:
            version = await self.changes.wait_past(version)


class SocketReplaced(Exception):
    pass


async def register(
    kubelet_socket: Path,
    endpoint: str,
    resource: str,
    options: dp.DevicePluginOptions,
    still_ours: Callable[[], bool],
) -> None:
    """One Register call. Raises OSError when the kubelet is not there, SocketReplaced when our
    socket was wiped meanwhile, purerpc errors when the kubelet refuses."""
    request = dp.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options
    )
    async with UnixChannel(kubelet_socket) as channel:
        if not still_ours():
            raise SocketReplaced(endpoint)
        try:
            await dp_grpc.RegistrationStub(channel).Register(request)
        except purerpc.RpcFailedError as exc:
            if not already_connected(str(exc), endpoint):
                raise


def already_connected(message: str, endpoint: str) -> bool:
    """The kubelet's refusal of a second Register for a socket it is already connected to: the
    first one held (its answer was lost, or arrived after our deadline), so we are registered.
    Retrying the same socket would be refused forever."""
    marker = "device plugin already connected: "
    return marker in message and message.rsplit(marker, 1)[1].strip().endswith("/" + endpoint)


async def _register_once(
    watch: KubeletWatch,
    path: Path,
    inode: int,
    resource: str,
    options: dp.DevicePluginOptions,
    attempt: int,
) -> str:
    """'ok', 'replaced' (our socket was wiped: re-serve) or 'retry' (kubelet not there yet)."""
    outcome = "ok"
    try:
        await register(
            watch.kubelet_socket, path.name, resource, options, lambda: _inode(path) == inode
        )
    except* SocketReplaced:
        outcome = "replaced"
    except* Exception as group:
        level = logging.INFO if attempt in (0, 10) or attempt % 100 == 0 else logging.DEBUG
        log.log(
            level,
            "registering %s with the kubelet (attempt %d): %r",
            resource,
            attempt + 1,
            group.exceptions[0],
        )
        outcome = "retry"
    return outcome


async def serve_registered(
    servicer: object,
    plugin_name: str,
    resource: str,
    options: dp.DevicePluginOptions,
    watch: KubeletWatch,
    *,
    on_registered: Callable[[], None] | None = None,
    limits: ServerLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `servicer` on a plugin socket (each connection within `limits`) and keep it
    registered, forever.

    Reports the first socket path once it accepts connections; registration (and each
    re-registration after a kubelet restart) follows, retried with backoff while the kubelet is
    away. The socket file is removed when this is cancelled.
    """
    started = False
    backoff = Backoff(base=0.1, cap=5.0)
    while True:
        path = socket_path(watch.plugin_dir, plugin_name, int(time.time()))
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(serve_unix, limits=limits), path, servicer)
            inode = _inode(path)
            if not started:
                task_status.started(path)
                started = True
            attempt = 0
            while inode is not None and _inode(path) == inode:
                outcome = await _register_once(watch, path, inode, resource, options, attempt)
                if outcome == "replaced":
                    break
                if outcome == "retry":
                    await trio.sleep(backoff.delay(attempt))
                    attempt += 1
                    continue
                log.info("registered %s (socket %s)", resource, path.name)
                if on_registered is not None:
                    on_registered()
                await watch.wait_gone(path, inode)
                log.info("plugin socket %s is gone (kubelet restart?): re-serving", path.name)
                break
            nursery.cancel_scope.cancel()
