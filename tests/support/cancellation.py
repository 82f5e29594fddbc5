"""Tools for the cancellation harness: what a task tree, a process and a directory hold, and
thin instruments around the real API client and the kubelet stand-in.

Nothing here mocks Kubernetes or gRPC: `Gate` and `Refusing` are hooks for the real `Client`'s
intercepting transport (tests/support/intercept.py; the real API server answers every request
they let through) that let a test hold a request at a chosen point or refuse it with a real
connection error;
`ControlledKubelet` is the grpcio stand-in with a way to drop a ListAndWatch stream and to hold
a Register call.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import os
import stat
import threading
import types
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx
import trio

from akri_trio.agent.plugins.claims import USAGE_FIELD_MANAGER
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from tests.support.intercept import Send
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_state

# ---- tasks --------------------------------------------------------------------------------------


def all_tasks() -> list[trio.lowlevel.Task]:
    """Every task of this trio run (system tasks included), by walking the tree from the root."""
    out: list[trio.lowlevel.Task] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        out.append(task)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return out


async def tasks_return_to(before: int) -> None:
    """Wait (at most 10 s) until this run has no more tasks than `before`: trio
    finalizes a collected async generator in a short-lived system task of its own, which may
    still be running at the moment a scenario ends. A leaked task stays, and fails here with
    the names of every task."""
    with contextlib.suppress(AssertionError):  # the assertion below names the tasks
        await until_state(lambda: len(all_tasks()) <= before, what="the tasks of before")
    tasks = all_tasks()
    assert len(tasks) == before, f"leaked tasks: {sorted(t.name for t in tasks)}"


def tasks_awaiting(function_name: str) -> list[trio.lowlevel.Task]:
    """Tasks with a frame of a function named `function_name` on their await stack."""
    found = []
    for task in all_tasks():
        try:
            names = {frame.f_code.co_name for frame, _ in task.iter_await_frames()}
        except Exception:  # a task finishing while we look: not parked
            continue
        if function_name in names:
            found.append(task)
    return found


def live_asyncgens(function: Callable[..., Any]) -> list[types.AsyncGeneratorType[Any, Any]]:
    """Async generators of `function` that have started or may still run (not finished, not
    closed), after a full collection: a parked ListAndWatch / Discover generator shows here."""
    code = getattr(function, "__code__", None)
    assert code is not None, f"{function!r} has no code object"
    gc.collect()
    return [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, types.AsyncGeneratorType)
        and obj.ag_code is code
        and obj.ag_frame is not None
    ]


# ---- file descriptors and socket files ------------------------------------------------------


def _unix_socket_paths() -> dict[str, str]:
    """socket inode -> bound path, for this host's Unix sockets (from /proc/net/unix)."""
    out: dict[str, str] = {}
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) >= 8:
                out[fields[6]] = fields[7]
    return out


def open_fds() -> dict[int, str]:
    """fd -> what it is (readlink of /proc/self/fd, Unix sockets with their path if bound)."""
    fds: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the listing's own fd, closed already
            continue
    paths = _unix_socket_paths()
    for fd, target in fds.items():
        if target.startswith("socket:["):
            inode = target[len("socket:[") : -1]
            if inode in paths:
                fds[fd] = f"{target} unix:{paths[inode]}"
    return fds


def _kind(target: str) -> str:
    return target.split("[", 1)[0] if "unix:" not in target else target.split(" ", 1)[1]


async def fds_return_to(before: Mapping[int, str]) -> None:
    """Wait (at most 10 s) until this process holds no more fds than `before`:
    grpcio's threads release a stopped server's fds a moment after `stop()` returns. Fails
    with what is extra."""
    try:
        await until_state(lambda: len(open_fds()) <= len(before), what="the fds of before")
    except AssertionError:
        now = open_fds()
        extra = Counter(_kind(t) for t in now.values()) - Counter(_kind(t) for t in before.values())
        new = {fd: t for fd, t in now.items() if before.get(fd) != t}
        raise AssertionError(
            f"{len(now) - len(before)} fds leaked: {dict(extra)}; new or reused: {new}"
        ) from None


def socket_files(directory: Path) -> list[str]:
    """Names of the Unix socket files in `directory` (nothing if it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if stat.S_ISSOCK(os.lstat(directory / n).st_mode))


# ---- the API client, instrumented ---------------------------------------------------------------


def is_usage_write(request: httpx.Request) -> bool:
    """The agent's deviceUsage writes are the PATCHes of its claims' field manager."""
    return (
        request.method == "PATCH" and request.url.params.get("fieldManager") == USAGE_FIELD_MANAGER
    )


def is_pod_create(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/pods")


class Hold(enum.Enum):
    """Where a `Gate` holds the request it stops until the component is cancelled."""

    BEFORE_SEND = "before-send"  # the request never reaches the API server
    ON_THE_WIRE = "on-the-wire"  # the test cancels as the request starts: either outcome
    AFTER_ANSWER = "after-answer"  # the server applied it; the component never sees the answer


class Gate:
    """An `Intercepting` hook: once `hold` is set, the `at`-th request `matches` accepts signals
    `reached` at the point `hold` names and then parks there until cancelled (ON_THE_WIRE goes
    on). One request only: `hold` goes back to None when it is taken."""

    def __init__(
        self, matches: Callable[[httpx.Request], bool], hold: Hold | None = None, at: int = 1
    ) -> None:
        self.matches, self.hold, self.at = matches, hold, at
        self.reached = trio.Event()
        self.counted = 0  # matching requests since `hold` was set
        self.started = 0
        self.answered = 0

    async def __call__(self, request: httpx.Request, send: Send) -> httpx.Response:
        hold = None
        if self.hold is not None and self.matches(request):
            self.counted += 1
            if self.counted == self.at:
                hold, self.hold = self.hold, None
                self.started += 1
        if hold is Hold.BEFORE_SEND:
            self.reached.set()
            await trio.sleep_forever()
        if hold is Hold.ON_THE_WIRE:
            self.reached.set()
        response = await send(request)
        if hold is not None:
            await response.aread()
            self.answered += 1
        if hold is Hold.AFTER_ANSWER:
            self.reached.set()
            await trio.sleep_forever()
        return response


class Refusing:
    """An `Intercepting` hook: while `down`, every request goes to `dead` (a client of a port
    nobody listens on) instead, and fails with a real `httpx.ConnectError`."""

    def __init__(self, dead: httpx.AsyncClient) -> None:
        self.dead = dead
        self.down = False
        self.refused: list[str] = []

    async def __call__(self, request: httpx.Request, send: Send) -> httpx.Response:
        if not self.down:
            return await send(request)
        self.refused.append(f"{request.method} {request.url.path}")
        await self.dead.request(request.method, request.url.path, params=request.url.params)
        raise AssertionError("a closed port answered")  # pragma: no cover


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# ---- the kubelet stand-in, with handles on its connections -----------------------------------


class _Answers(dict[str, list[tuple[str, str]]]):
    """The stand-in's `devices` map, counting every list stored per resource (each answer of a
    ListAndWatch stream, and the stand-in's own "stream ended: all Unhealthy" marking)."""

    def __init__(self) -> None:
        super().__init__()
        self.count: Counter[str] = Counter()

    def __setitem__(self, resource: str, devices: list[tuple[str, str]]) -> None:
        self.count[resource] += 1
        super().__setitem__(resource, devices)


class ControlledKubelet(KubeletStandin):
    """The grpcio kubelet stand-in, plus: drop a resource's ListAndWatch connection as a dying
    kubelet would, open a fresh stream to the same endpoint, and hold Register calls."""

    def __init__(self, plugin_dir: Path) -> None:
        super().__init__(plugin_dir)
        self.hold_register = threading.Event()  # set: Register calls park until released
        self.release_register = threading.Event()
        self.register_parked = threading.Event()
        self.register_calls = 0
        self.answers = _Answers()
        self.devices = self.answers

    def answered(self, resource: str) -> int:
        """How many device lists the stand-in has stored for `resource` so far."""
        with self._cond:
            return self.answers.count[resource]

    def _on_register(self, request: dp.RegisterRequest) -> None:
        with self._cond:
            self.register_calls += 1
        if self.hold_register.is_set():
            self.register_parked.set()
            self.release_register.wait(timeout=60)
            return
        super()._on_register(request)

    def disconnect(self, resource: str) -> None:
        """Close the channel carrying `resource`'s ListAndWatch (its connection goes away)."""
        channel: grpc.Channel = self._channels[resource]
        channel.close()

    def reconnect(self, resource: str) -> None:
        """Dial the registered endpoint again and open a new ListAndWatch stream."""
        super()._on_register(self.registrations[resource])

    def stop(self) -> None:
        self.release_register.set()
        super().stop()
