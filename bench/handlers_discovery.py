"""Handlers: discovery of many mDNS services (zeroconf) and many OPC UA servers (opcua).

    .venv/bin/python -m bench.handlers_discovery [--services 200] [--servers 20]
        [--opcua-poll 2.0] [--kills 3] [--idle 10] [--rounds 15] [--only mdns|opcua]

No cluster: each handler is driven directly (`handler.discover(details, {}, send)` under trio,
`send` time-stamps every list it is given). Everything is on the loopback interface.

mDNS. A responder process (python-zeroconf's AsyncZeroconf bound to 127.0.0.1, as another host's
responder would be) registers `--services` services of type `_akribench._tcp.local.` and waits
for their announcements to end. Then, in this process, twice the same script:
  floor    python-zeroconf itself: a `Zeroconf` bound to 127.0.0.1 and a `ServiceBrowser` whose
           callback resolves every added service with `get_service_info` (the library's own
           browser example), nothing else;
  handler  the zeroconf handler (`interfaces=("127.0.0.1",)`, shipped `settle`).
For each: t0 = just before the `Zeroconf` is built; time to the first device (floor: first
service resolved; handler: first list with a device) and to all of them; then one service more
is registered (t0 = the command is written to the responder) -> time until it is seen resolved
/ listed; it is unregistered -> time until it is gone (the browser reports the removal when the
goodbye packet arrives); then the CPU of this process over `--idle` s while nothing changes (the
only thing running in it is the floor's browser, or the handler). The floor's phase runs first;
1.5 s pass between phases (a responder multicasts a record at most once a second). Then
`--mdns-rounds` more rounds of first/all only: floor, handler, handler with settle 0 (its
first list goes out at once, then one per change: the pipeline without the batching window).

Loopback artefact: a querier's first question asks for a unicast answer (QU); on one host every
instance binds 127.0.0.1:5353 with SO_REUSEPORT, so the kernel may hand the unicast answer to
another instance's socket, and the answer comes with the next (multicast) query ~1 s later.
Both sides are exposed alike; that is why first/all are p50 and best of several rounds.

OPC UA. One asyncua server as Local Discovery Server (type DiscoveryServer) and `--servers`
asyncua servers (type Server), each its own process, started in parallel; each registers with the
LDS (RegisterServer) and then says READY; we also check each accepts TCP. Then, interleaved,
`--rounds` times each:
  floor    raw asyncua on a plain asyncio loop in a thread: TCP connect to the LDS, FindServers
           (sessionless connect, FindServers, disconnect), TCP connect to each Server listed;
  round    the handler's `discover_once` (the same, through the aio bridge, plus its name
           resolution of each server host).
Then the handler's `discover` with `--opcua-poll`: time to its first list (all servers); its CPU
per poll while nothing changes; then `--kills` times: wait a random phase of the poll, SIGKILL
one server (the LDS keeps listing it; the handler's TCP probe drops it) -> time until the list
no longer has it. Expect poll phase + one round: at most `--opcua-poll` + a round.
asyncua is imported before anything is timed (its import time is reported apart).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from akri_trio.discovery.aio_bridge import AioBridge
from akri_trio.discovery.handlers.opcua import Opcua, OpcuaDetails
from akri_trio.discovery.handlers.zeroconf_handler import Zeroconf, parse_details
from akri_trio.model.device import Device
from bench._common import machine, ms, now, summary, table, write_run
from tests.support.opcua_server import SERVER_SCRIPT

T = TypeVar("T")
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"
SERVICE_TYPE = "_akribench._tcp.local."
WAIT_S = 30.0  # any single wait in this benchmark
RUN_LIMIT_S = 300.0  # the whole run


# ---- small helpers ------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}x" if floor > 0 and math.isfinite(value) else "n/a"


def pct(cpu_s: float, wall_s: float) -> str:
    return f"{100 * cpu_s / wall_s:.2f} %"


class Recorder:
    """The handler's `send`: every list it is given, time-stamped on arrival."""

    def __init__(self) -> None:
        self.lists: list[tuple[float, frozenset[str]]] = []
        self._changed = trio.Event()

    async def send(self, devices: list[Device]) -> None:
        self.lists.append((time.perf_counter(), frozenset(d.id for d in devices)))
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, pred: Callable[[frozenset[str]], bool], within: float) -> float:
        """The arrival time of the first list (from now on, or the latest) satisfying pred."""
        with trio.fail_after(within):
            while True:
                changed = self._changed
                if self.lists and pred(self.lists[-1][1]):
                    return self.lists[-1][0]
                await changed.wait()

    def first_time(self, pred: Callable[[frozenset[str]], bool]) -> float:
        return next(t for t, ids in self.lists if pred(ids))


class LineProcess:
    """A child process spoken to in lines (stdin commands, stdout answers)."""

    def __init__(self, proc: trio.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self._buf = b""

    async def readline(self, within: float = WAIT_S) -> str:
        assert self.proc.stdout is not None
        with trio.fail_after(within):
            while b"\n" not in self._buf:
                chunk = await self.proc.stdout.receive_some()
                if not chunk:
                    tail = self.log.read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"child ended ({self._buf!r}); its stderr ends:\n{tail}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    async def expect(self, word: str, within: float = WAIT_S) -> str:
        while True:
            line = await self.readline(within)
            if line.startswith(word):
                return line

    async def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(line.encode() + b"\n")


@asynccontextmanager
async def child(args: list[str], log: Path, stdin: bool = False) -> AsyncIterator[LineProcess]:
    """A child process, killed and reaped on the way out whatever happens."""
    with log.open("wb") as err:
        proc = await trio.lowlevel.open_process(
            args,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    try:
        yield LineProcess(proc, log)
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    await stream.aclose()


# ---- mDNS ---------------------------------------------------------------------------------------

# The registering side: AsyncZeroconf on 127.0.0.1. Commands on stdin:
#   reg NAME FIRST COUNT   register NAME-FIRST .. NAME-(FIRST+COUNT-1), concurrently;
#                          answers "REGISTERED n" at once (in the registry: answered from now)
#                          and "ANNOUNCED n" when their announcements are over
#   unreg NAME I           unregister NAME-I: "UNREGISTERED" (goodbyes sent)
RESPONDER_SCRIPT = r"""
import asyncio, socket, sys
from zeroconf import IPVersion, ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

TYPE = sys.argv[1]

def info(name):
    return ServiceInfo(TYPE, f"{name}.{TYPE}", addresses=[socket.inet_aton("127.0.0.1")],
                       port=20000, properties={"model": "bench", "id": name},
                       server=f"{name}-host.local.")

async def main():
    aiozc = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    infos = {}
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("READY", flush=True)
    while line := (await reader.readline()).decode().split():
        if line[0] == "reg":
            name, first, count = line[1], int(line[2]), int(line[3])
            names = [f"{name}-{i:04d}" for i in range(first, first + count)]
            for n in names:
                infos[n] = info(n)
            tasks = await asyncio.gather(*(
                aiozc.async_register_service(infos[n], cooperating_responders=True)
                for n in names))
            print("REGISTERED", len(names), flush=True)
            await asyncio.gather(*tasks)
            print("ANNOUNCED", len(names), flush=True)
        elif line[0] == "unreg":
            n = f"{line[1]}-{int(line[2]):04d}"
            await aiozc.async_unregister_service(infos.pop(n))
            print("UNREGISTERED", flush=True)
    await aiozc.async_close()

asyncio.run(main())
"""


def full_name(prefix: str, i: int) -> str:
    return f"{prefix}-{i:04d}.{SERVICE_TYPE}"


@attrs.define
class Phase:
    """One side's mDNS numbers (seconds)."""

    first: float = math.nan
    all: float = math.nan
    cpu_to_all: float = math.nan
    added: float = math.nan
    removed: float = math.nan
    idle_cpu: float = math.nan
    idle_wall: float = math.nan
    responder_idle_cpu: float = math.nan
    extra: dict[str, float] = attrs.Factory(dict)


class RawBrowser:
    """The floor: python-zeroconf's threaded browser, resolving each service in its callback."""

    def __init__(self) -> None:
        self.browsed: dict[str, float] = {}
        self.resolved: dict[str, float] = {}
        self.removed: dict[str, float] = {}
        self.unresolved: list[str] = []
        self.zc: Any = None
        self.browser: Any = None

    def start(self) -> None:
        from zeroconf import ServiceBrowser
        from zeroconf import Zeroconf as ZeroconfLib

        self.zc = ZeroconfLib(interfaces=[LOOPBACK])
        self.browser = ServiceBrowser(self.zc, [SERVICE_TYPE], handlers=[self.on_change])

    def on_change(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        now_s = time.perf_counter()
        if state_change.name == "Added":
            self.browsed[name] = now_s
            info = zeroconf.get_service_info(service_type, name, timeout=3000)
            if info is not None and info.port and info.server:
                self.resolved[name] = time.perf_counter()
            else:
                self.unresolved.append(name)
        elif state_change.name == "Removed":
            self.removed[name] = now_s

    def close(self) -> None:
        try:
            if self.browser is not None:
                self.browser.cancel()
        finally:
            if self.zc is not None:
                self.zc.close()


async def poll_until(pred: Callable[[], bool], within: float = WAIT_S) -> None:
    """For the floor's thread-side dicts: only detects completion (times are stamped there)."""
    with trio.fail_after(within):
        while not pred():  # noqa: ASYNC110 - written by zeroconf's thread, no trio.Event
            await trio.sleep(0.01)


async def idle_cpu(seconds: float, responder_pid: int) -> tuple[float, float, float]:
    """(CPU s of this process, wall s, CPU s of the responder) over `seconds` of nothing."""
    c0, r0, t0 = time.process_time(), cpu_seconds(responder_pid), time.perf_counter()
    await trio.sleep(seconds)
    return time.process_time() - c0, time.perf_counter() - t0, cpu_seconds(responder_pid) - r0


async def mdns_floor(responder: LineProcess, n: int, idle: float, full: bool = True) -> Phase:
    """The floor's numbers; `full=False`: only up to all n resolved."""
    out = Phase()
    raw = RawBrowser()
    names = {full_name("svc", i) for i in range(n)}
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        await trio.to_thread.run_sync(raw.start)
        await poll_until(lambda: names <= raw.resolved.keys())
        out.cpu_to_all = time.process_time() - c0
        out.first = min(raw.resolved.values()) - t0
        out.all = max(raw.resolved[k] for k in names) - t0
        out.extra["browse all"] = max(raw.browsed[k] for k in names) - t0
        out.extra["browse first"] = min(raw.browsed.values()) - t0
        if not full:
            return out
        await trio.sleep(1.5)

        new = full_name("floor", 0)
        t0 = time.perf_counter()
        await responder.command("reg floor 0 1")
        await poll_until(lambda: new in raw.resolved)
        out.added = raw.resolved[new] - t0
        await responder.expect("ANNOUNCED")
        await trio.sleep(1.5)
        t0 = time.perf_counter()
        await responder.command("unreg floor 0")
        await poll_until(lambda: new in raw.removed)
        out.removed = raw.removed[new] - t0
        await responder.expect("UNREGISTERED")
        await trio.sleep(1.5)

        assert responder.proc.pid is not None
        out.idle_cpu, out.idle_wall, out.responder_idle_cpu = await idle_cpu(
            idle, responder.proc.pid
        )
        out.extra["unresolved"] = float(len(raw.unresolved))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(raw.close)
    return out


async def mdns_handler(
    responder: LineProcess, n: int, idle: float, settle: float, full: bool = True
) -> Phase:
    """The handler's numbers; `full=False`: only up to the first list with all n."""
    out = Phase()
    handler = Zeroconf(interfaces=(LOOPBACK,), settle=settle)
    details = parse_details(f"kind: {SERVICE_TYPE}")
    rec = Recorder()
    names = frozenset(full_name("svc", i) for i in range(n))
    async with trio.open_nursery() as nursery:
        c0 = time.process_time()
        t0 = time.perf_counter()
        nursery.start_soon(handler.discover, details, {}, rec.send)
        out.all = await rec.wait_for(lambda ids: names <= ids, WAIT_S) - t0
        out.cpu_to_all = time.process_time() - c0
        out.first = rec.first_time(bool) - t0
        out.extra["lists to all"] = float(len(rec.lists))
        out.extra["first list size"] = float(len(rec.lists[0][1]))
        if not full:
            nursery.cancel_scope.cancel()
            return out
        await trio.sleep(1.5)

        new = full_name("hdl", 0)
        t0 = time.perf_counter()
        await responder.command("reg hdl 0 1")
        out.added = await rec.wait_for(lambda ids: new in ids, WAIT_S) - t0
        await responder.expect("ANNOUNCED")
        await trio.sleep(1.5)
        t0 = time.perf_counter()
        await responder.command("unreg hdl 0")
        out.removed = await rec.wait_for(lambda ids: new not in ids, WAIT_S) - t0
        await responder.expect("UNREGISTERED")
        await trio.sleep(1.5)

        sent_before = len(rec.lists)
        assert responder.proc.pid is not None
        out.idle_cpu, out.idle_wall, out.responder_idle_cpu = await idle_cpu(
            idle, responder.proc.pid
        )
        out.extra["lists sent while idle"] = float(len(rec.lists) - sent_before)
        nursery.cancel_scope.cancel()
    return out


def _p50(phases: Sequence[Phase], key: str) -> float:
    return float(summary([getattr(p, key) for p in phases])["p50"])


def _min(phases: Sequence[Phase], key: str) -> float:
    return float(min(getattr(p, key) for p in phases))


def _p50x(phases: Sequence[Phase], key: str) -> float:
    return float(summary([p.extra[key] for p in phases])["p50"])


def _counts(phases: Sequence[Phase]) -> str:
    return "/".join(f"{p.extra['lists to all']:.0f}" for p in phases)


def _samples(phases: Sequence[Phase], key: str) -> str:
    return "/".join(f"{getattr(p, key) * 1e3:.0f}" for p in phases)


async def bench_mdns(args: argparse.Namespace, logs: Path) -> tuple[list[str], str]:
    started = time.monotonic()
    script = [sys.executable, "-c", RESPONDER_SCRIPT, SERVICE_TYPE]
    n = args.services
    gap = 1.5
    async with child(script, logs / "responder.log", stdin=True) as responder:
        await responder.expect("READY")
        t0 = time.perf_counter()
        await responder.command(f"reg svc 0 {n}")
        await responder.expect("REGISTERED")
        registered = time.perf_counter() - t0
        await responder.expect("ANNOUNCED")
        announced = time.perf_counter() - t0
        await trio.sleep(gap)
        floor = await mdns_floor(responder, n, args.idle)
        print(f"  mdns floor: {floor}", flush=True)
        await trio.sleep(gap)
        hdl = await mdns_handler(responder, n, args.idle, args.settle)
        print(f"  mdns handler: {hdl}", flush=True)
        floors, hdls, quicks = [floor], [hdl], []
        for _ in range(args.mdns_rounds):
            await trio.sleep(gap)
            floors.append(await mdns_floor(responder, n, 0, full=False))
            await trio.sleep(gap)
            hdls.append(await mdns_handler(responder, n, 0, args.settle, full=False))
            await trio.sleep(gap)
            quicks.append(await mdns_handler(responder, n, 0, 0.0, full=False))
        print(f"  mdns rounds: {len(floors)}", flush=True)

    rows = []
    for label, key in (("first device", "first"), (f"all {n} devices", "all")):
        fl, hp = _p50(floors, key), _p50(hdls, key)
        rows.append([f"{label} (p50 of {len(floors)})", ms(fl), ms(hp), ratio(hp, fl)])
        fm, hm = _min(floors, key), _min(hdls, key)
        rows.append(["  best", ms(fm), ms(hm), ratio(hm, fm)])
        if quicks:
            qp = _p50(quicks, key)
            rows.append(
                [f"  handler with settle 0, p50 of {len(quicks)}", "", ms(qp), ratio(qp, fl)]
            )
            qm = _min(quicks, key)
            rows.append(["  handler with settle 0, best", "", ms(qm), ratio(qm, fm)])
    fc, hc = _p50(floors, "cpu_to_all"), _p50(hdls, "cpu_to_all")
    rows += [
        [f"CPU s (this process) to all {n}, p50", f"{fc:.3f}", f"{hc:.3f}", ratio(hc, fc)],
        [
            f"service {n + 1} registered -> listed",
            ms(floor.added),
            ms(hdl.added),
            ratio(hdl.added, floor.added),
        ],
        [
            "one unregistered -> gone",
            ms(floor.removed),
            ms(hdl.removed),
            ratio(hdl.removed, floor.removed),
        ],
        [
            f"idle CPU (this process, {args.idle:g} s)",
            pct(floor.idle_cpu, floor.idle_wall),
            pct(hdl.idle_cpu, hdl.idle_wall),
            ratio(hdl.idle_cpu, floor.idle_cpu),
        ],
    ]
    heads = ["mDNS, 127.0.0.1", "floor: raw python-zeroconf", "zeroconf handler", "ratio"]
    notes = (
        f"mdns: {n} services registered in {registered:.2f} s, announcements over after "
        f"{announced:.2f} s; handler settle {args.settle:g} s (shipped); samples ms (first, all):"
        f" floor {_samples(floors, 'first')}, {_samples(floors, 'all')}; handler "
        f"{_samples(hdls, 'first')}, {_samples(hdls, 'all')}; settle 0 "
        f"{_samples(quicks, 'first')}, {_samples(quicks, 'all')}; floor browse only (no "
        f"resolve) p50: first {ms(_p50x(floors, 'browse first'))} ms, all "
        f"{ms(_p50x(floors, 'browse all'))} ms; lists sent until all: handler "
        f"{_counts(hdls)}, settle 0 {_counts(quicks)}; "
        f"{hdl.extra['lists sent while idle']:.0f} list(s) sent while idle; floor unresolved "
        f"{floor.extra['unresolved']:.0f}; responder process idle CPU "
        f"{pct(floor.responder_idle_cpu, floor.idle_wall)} / "
        f"{pct(hdl.responder_idle_cpu, hdl.idle_wall)} (floor / handler windows); "
        f"mdns part {time.monotonic() - started:.0f} s"
    )
    return [table(heads, rows)], notes


# ---- OPC UA -------------------------------------------------------------------------------------


@attrs.frozen
class UaServer:
    name: str
    port: int
    proc: LineProcess

    @property
    def url(self) -> str:
        return f"opc.tcp://{LOOPBACK}:{self.port}/akri/{self.name}/"


class LoopThread:
    """A plain asyncio loop in a thread, for the floor (not the handler's bridge)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="floor-asyncio")

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Blocking: run coro on the loop (call from a worker thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)


@contextmanager
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    lt.thread.start()
    try:
        yield lt
    finally:
        lt.loop.call_soon_threadsafe(lt.loop.stop)
        lt.thread.join(10)
        lt.loop.close()


async def _tcp_ok(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 3)
    except (OSError, TimeoutError):
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def raw_round(lds_url: str, lds_port: int) -> tuple[float, float, int]:
    """(total s, FindServers s, servers found and reachable): the floor, on plain asyncio."""
    from asyncua import ua
    from asyncua.client.client import Client

    t0 = time.perf_counter()
    if not await _tcp_ok(LOOPBACK, lds_port):
        raise RuntimeError("LDS unreachable")
    t1 = time.perf_counter()
    client = Client(lds_url)
    await client.connect_sessionless()
    try:
        apps = await client.find_servers()
    finally:
        await client.disconnect_sessionless()
    t2 = time.perf_counter()
    urls = [
        next(u for u in a.DiscoveryUrls if u.startswith("opc.tcp://"))
        for a in apps
        if a.ApplicationType == ua.ApplicationType.Server and a.DiscoveryUrls
    ]
    ports = [int(u.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]) for u in urls]
    ok = await asyncio.gather(*(_tcp_ok(LOOPBACK, p) for p in ports))
    return time.perf_counter() - t0, t2 - t1, sum(ok)


async def start_servers(
    stack: AsyncExitStack,
    logs: Path,
    names: Sequence[str],
    register: str | None,
    kind: str,
    port: int | None = None,
) -> list[UaServer]:
    """Start them in parallel; each READY (registered) and accepting TCP."""
    out: dict[str, UaServer] = {}

    async def one(name: str) -> None:
        port_ = port or free_port()
        args = [sys.executable, "-c", SERVER_SCRIPT, "--name", name, "--port", str(port_)]
        args += ["--type", kind] + (["--register", register] if register else [])
        proc = await stack.enter_async_context(child(args, logs / f"{name}.log"))
        await proc.expect("READY", within=120)
        out[name] = UaServer(name, port_, proc)

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    servers = [out[n] for n in names]
    for s in servers:  # accepts TCP (READY comes after `async with server`, but check)
        with trio.fail_after(WAIT_S):
            while True:
                try:
                    stream = await trio.open_tcp_stream(LOOPBACK, s.port)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                await stream.aclose()
                break
    return servers


async def bench_opcua(args: argparse.Namespace, logs: Path) -> tuple[list[str], str]:
    started = time.monotonic()
    t_imp = time.perf_counter()
    import asyncua.client.client  # noqa: F401 - warm: neither side pays the import

    import_s = time.perf_counter() - t_imp
    lds_port = free_port()
    lds_url = f"opc.tcp://{LOOPBACK}:{lds_port}/akri/lds/"
    names = [f"s{i:02d}" for i in range(args.servers)]
    async with AsyncExitStack() as stack:
        t0 = time.perf_counter()
        await start_servers(stack, logs, ["lds"], None, "DiscoveryServer", lds_port)
        lds_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        servers = await start_servers(stack, logs, names, lds_url, "Server")
        start_s = time.perf_counter() - t0
        print(f"  opcua: LDS up in {lds_s:.1f} s, {len(servers)} servers in {start_s:.1f} s")
        expected = frozenset(s.url for s in servers)
        details = OpcuaDetails(discovery_urls=(lds_url,))

        with AioBridge(name="bench-opcua-bridge") as bridge, loop_thread() as lt:
            handler = Opcua(bridge=bridge, poll_interval=args.opcua_poll)
            floor_total: list[float] = []
            floor_find: list[float] = []
            rounds: list[float] = []
            floor_cpu = hdl_cpu = 0.0
            for i in range(args.rounds + 2):  # 2 warm-up rounds each, interleaved
                c0 = time.process_time()
                total, find, found = await trio.to_thread.run_sync(
                    lt.call, raw_round(lds_url, lds_port)
                )
                c1 = time.process_time()
                if found != len(servers):
                    raise RuntimeError(f"floor found {found} servers")
                t0 = time.perf_counter()
                urls = await handler.discover_once(details)
                dt = time.perf_counter() - t0
                c2 = time.process_time()
                if frozenset(urls) != expected:
                    raise RuntimeError(f"handler found {len(urls)} servers")
                if i >= 2:
                    floor_total.append(total)
                    floor_find.append(find)
                    rounds.append(dt)
                    floor_cpu += c1 - c0
                    hdl_cpu += c2 - c1

            rec = Recorder()
            kills: list[float] = []
            async with trio.open_nursery() as nursery:
                t0 = time.perf_counter()
                nursery.start_soon(handler.discover, details, {}, rec.send)
                first_full = await rec.wait_for(lambda ids: ids == expected, WAIT_S) - t0
                first_size = len(rec.lists[0][1])
                polls = 3
                c0, w0 = time.process_time(), time.perf_counter()
                await trio.sleep(polls * args.opcua_poll)
                poll_cpu = (time.process_time() - c0) / (
                    (time.perf_counter() - w0) / args.opcua_poll
                )
                sent_idle = len(rec.lists) - 1
                for victim in random.sample(servers, min(args.kills, len(servers) - 1)):
                    await trio.sleep(random.uniform(0, args.opcua_poll))
                    t0 = time.perf_counter()
                    victim.proc.proc.kill()
                    gone = await rec.wait_for(
                        lambda ids, url=victim.url: url not in ids,  # type: ignore[misc]
                        args.opcua_poll + WAIT_S,
                    )
                    kills.append(gone - t0)
                    await victim.proc.proc.wait()
                nursery.cancel_scope.cancel()

    fl, rd = summary(floor_total), summary(rounds)
    ff = summary(floor_find)
    poll = args.opcua_poll
    ks = summary(kills)
    rows = [
        [
            f"one round, LDS + {len(servers)} servers (p50)",
            ms(fl["p50"]),
            ms(rd["p50"]),
            ratio(rd["p50"], fl["p50"]),
        ],
        ["  p90", ms(fl["p90"]), ms(rd["p90"]), ratio(rd["p90"], fl["p90"])],
        [
            "  CPU s per round (this process)",
            f"{floor_cpu / len(rounds):.4f}",
            f"{hdl_cpu / len(rounds):.4f}",
            ratio(hdl_cpu, floor_cpu),
        ],
        [
            f"discover() start -> first full list of {len(servers)}",
            ms(fl["p50"]),
            ms(first_full),
            ratio(first_full, fl["p50"]),
        ],
        [
            f"server killed -> gone, p50 of {len(kills)} (poll {poll:g} s)",
            "",
            ms(ks["p50"]),
            f"{ks['p50'] / poll:.2f}x poll",
        ],
        [
            "  max",
            f"(bound: poll + round = {ms(poll + rd['max'])})",
            ms(ks["max"]),
            f"{ks['max'] / poll:.2f}x poll",
        ],
        [
            f"CPU per poll while idle (poll {poll:g} s)",
            f"{floor_cpu / len(rounds):.4f}",
            f"{poll_cpu:.4f}",
            ratio(poll_cpu, floor_cpu / len(rounds)),
        ],
    ]
    heads = [
        "OPC UA, 127.0.0.1",
        "floor: raw asyncua FindServers + TCP probes",
        "opcua handler",
        "ratio",
    ]
    notes = (
        f"opcua: {args.rounds} interleaved rounds each (after 2 warm-up); floor FindServers "
        f"alone p50 {ms(ff['p50'])} ms; LDS up in {lds_s:.1f} s, {len(servers)} servers "
        f"started in parallel and registered in {start_s:.1f} s; asyncua client import "
        f"{import_s:.2f} s (before timing; a fresh agent pays it on the first round); first "
        f"list had {first_size} devices; {sent_idle} list(s) sent over {polls} idle polls; "
        f"kills (ms): {', '.join(ms(k) for k in kills)}; "
        f"opcua part {time.monotonic() - started:.0f} s"
    )
    return [table(heads, rows)], notes


# ---- main ---------------------------------------------------------------------------------------


def command(args: argparse.Namespace) -> str:
    cmd = (
        f".venv/bin/python -m bench.handlers_discovery --services {args.services} "
        f"--servers {args.servers} --opcua-poll {args.opcua_poll:g} --kills {args.kills} "
        f"--idle {args.idle:g} --mdns-rounds {args.mdns_rounds} --rounds {args.rounds} "
        f"--settle {args.settle:g}"
    )
    return cmd + (f" --only {args.only}" if args.only else "")


async def bench(args: argparse.Namespace) -> str:
    started = time.monotonic()
    parts: list[str] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="akri-hd-") as tmp, trio.fail_after(RUN_LIMIT_S):
        logs = Path(tmp)
        if args.only in (None, "mdns"):
            tables, note = await bench_mdns(args, logs)
            parts += tables
            notes.append(note)
        if args.only in (None, "opcua"):
            tables, note = await bench_opcua(args, logs)
            parts += tables
            notes.append(note)
    body = "\n\n".join(parts)
    return "\n".join(
        [
            f"### handlers_discovery run {now()}",
            "",
            f"machine: {machine()}",
            f"command: {command(args)}",
            "",
            body,
            "",
            *(f"- {n}" for n in notes),
            f"wall time {time.monotonic() - started:.0f} s",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--services", type=int, default=200)
    p.add_argument("--servers", type=int, default=20)
    p.add_argument("--opcua-poll", type=float, default=2.0, help="the handler's poll interval")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--mdns-rounds", type=int, default=4, help="extra first/all rounds")
    p.add_argument("--idle", type=float, default=10.0, help="idle CPU window, s")
    p.add_argument("--rounds", type=int, default=15, help="OPC UA rounds (floor and handler)")
    p.add_argument("--settle", type=float, default=Zeroconf().settle, help="zeroconf settle, s")
    p.add_argument("--only", choices=["mdns", "opcua"])
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args()
    if not (0 < args.services <= 1000 and 0 < args.servers <= 40 and args.kills >= 0):
        p.error("bounded: --services 1..1000, --servers 1..40")
    report = trio.run(bench, args)
    print(report)
    if not args.no_write:
        write_run("handlers_discovery", report)


if __name__ == "__main__":
    main()
