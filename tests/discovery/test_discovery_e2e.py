"""Handlers and the agent's discovery, end to end over real Unix sockets and real gRPC (purerpc
both ways): registration, Discover streams, handler loss, bad details, agent restarts."""

from __future__ import annotations

import functools
import math
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from akri_trio.agent.discovery_streams import (
    DiscoveryRequest,
    DiscoveryResult,
    run_configuration_discovery,
)
from akri_trio.discovery.device_rules import DeviceRules
from akri_trio.discovery.handlers.debug_echo import PROPERTY, DebugEcho, DebugEchoDetails
from akri_trio.discovery.interface import Properties, Send
from akri_trio.discovery.registration import serve_registration
from akri_trio.discovery.registry import (
    ACTIVE,
    WAITING,
    Offline,
    Registry,
    RegistryEvent,
    embedded,
)
from akri_trio.discovery.standalone import run_standalone
from akri_trio.model.device import Device
from akri_trio.runtime import Backoff

FAST = Backoff(base=0.02, cap=0.1)
DETAILS = "descriptions: [foo0, foo1]"
REPO = Path(__file__).resolve().parents[2]


class Results:
    """Collects DiscoveryResults; `until` waits for one that satisfies a predicate."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[DiscoveryResult](math.inf)
        self.seen: list[DiscoveryResult] = []

    async def until(self, predicate: Callable[[DiscoveryResult], bool]) -> DiscoveryResult:
        if self.seen and predicate(self.seen[-1]):
            return self.seen[-1]
        while True:
            result = await self.receive.receive()
            self.seen.append(result)
            if predicate(result):
                return result


async def registered(registry: Registry, endpoint: str) -> None:
    """Wait until `endpoint` is registered under debugEcho."""
    while True:
        event = trio.Event()

        def wake(_: RegistryEvent, event: trio.Event = event) -> None:
            event.set()

        unsubscribe = registry.subscribe(wake)
        try:
            if endpoint in registry.get("debugEcho"):
                return
            await event.wait()
        finally:
            unsubscribe()


def ids(result: DiscoveryResult) -> list[str]:
    return [d.device.id for d in result.devices]


def echo(tmp: Path, **kwargs: Any) -> DebugEcho:
    return DebugEcho(availability_path=tmp / "availability.txt", poll_interval=0.05, **kwargs)


async def start_agent(
    nursery: trio.Nursery, registry: Registry, sock_dir: Path
) -> trio.CancelScope:
    """The agent's registration server, in a scope of its own (cancel it = the agent stops)."""
    scope = trio.CancelScope()

    async def agent(task_status: trio.TaskStatus[Path]) -> None:
        with scope:
            await serve_registration(
                registry, sock_dir / "agent-registration.sock", task_status=task_status
            )

    await nursery.start(agent)
    return scope


async def start_handler(
    nursery: trio.Nursery, handler: Any, sock_dir: Path, sock_name: str = "debugEcho.sock"
) -> tuple[trio.CancelScope, str]:
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[str]) -> None:
        with scope:
            await run_standalone(
                handler,
                registration_socket=sock_dir / "agent-registration.sock",
                socket_path=sock_dir / sock_name,
                backoff=FAST,
                watch_interval=0.05,
                task_status=task_status,
            )

    endpoint: str = await nursery.start(run)
    return scope, endpoint


async def discover(
    nursery: trio.Nursery,
    registry: Registry,
    details: str = DETAILS,
    key: str = "default/cfg",
    rules: DeviceRules | None = None,
) -> tuple[trio.CancelScope, Results]:
    results = Results()
    scope = trio.CancelScope()
    request = DiscoveryRequest(key=key, handler="debugEcho", details=details)

    async def run(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await run_configuration_discovery(
                registry,
                request,
                results.send.send,
                backoff=FAST,
                rules=rules,
                task_status=task_status,
            )

    await nursery.start(run)
    return scope, results


async def test_standalone_handler_discovered_then_lost(sock_dir: Path, tmp_path: Path) -> None:
    registry = Registry(trio.current_time)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            # The Configuration comes first: the handler registering later must be picked up.
            config, results = await discover(nursery, registry)
            first = await results.until(lambda r: True)
            assert first.devices == ()
            assert first.problems == (
                "no discovery handler named 'debugEcho' is registered on this node",
            )

            handler_scope, endpoint = await start_handler(nursery, echo(tmp_path), sock_dir)
            assert endpoint == str(sock_dir / "debugEcho.sock")
            found = await results.until(lambda r: len(r.devices) == 2)
            assert ids(found) == ["foo0", "foo1"]
            assert found.devices[0].device == Device("foo0", {PROPERTY: "foo0"})
            assert all(d.shared is False and d.endpoint == endpoint for d in found.devices)
            assert found.problems == ()
            await results.until(lambda r: r.handlers == {endpoint: ACTIVE})

            # The availability file takes devices away and back, through the real stream.
            (tmp_path / "availability.txt").write_text("OFFLINE")
            await results.until(lambda r: r.devices == ())
            (tmp_path / "availability.txt").write_text("ONLINE")
            await results.until(lambda r: len(r.devices) == 2)

            handler_scope.cancel()  # the handler stops
            lost = await results.until(lambda r: r.devices == ())
            offline = await results.until(lambda r: isinstance(r.handlers.get(endpoint), Offline))
            assert lost.devices == offline.devices == ()
            assert not (sock_dir / "debugEcho.sock").exists()

            config.cancel()  # the Configuration goes: an Offline handler stays Offline
            await trio.sleep(0.1)
            assert isinstance(registry.status("debugEcho", endpoint), Offline)
            nursery.cancel_scope.cancel()
    assert sorted(os.listdir(sock_dir)) == []


async def test_last_configuration_leaving_makes_handler_waiting(
    sock_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(trio.current_time)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, endpoint = await start_handler(nursery, echo(tmp_path), sock_dir)
            cfg1, results1 = await discover(nursery, registry, key="default/one")
            cfg2, results2 = await discover(nursery, registry, key="default/two")
            await results1.until(lambda r: len(r.devices) == 2)
            await results2.until(lambda r: len(r.devices) == 2)
            assert registry.status("debugEcho", endpoint) == ACTIVE
            cfg1.cancel()
            await trio.sleep(0.2)
            assert registry.status("debugEcho", endpoint) == ACTIVE  # two still streams
            cfg2.cancel()
            await trio.sleep(0.2)
            assert registry.status("debugEcho", endpoint) == WAITING
            nursery.cancel_scope.cancel()


@attrs.define
class CountingEcho(DebugEcho):
    parses: int = 0

    def parse_details(self, text: str) -> DebugEchoDetails:
        self.parses += 1
        return super().parse_details(text)


async def test_invalid_details_surface_as_a_problem_without_hammering(
    sock_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(trio.current_time)
    handler = CountingEcho(availability_path=tmp_path / "a.txt", poll_interval=0.05)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, endpoint = await start_handler(nursery, handler, sock_dir)
            await registered(registry, endpoint)
            _, results = await discover(nursery, registry, details="descriptions: 3")
            bad = await results.until(lambda r: bool(r.problems))
            assert bad.problems == (
                f"discovery handler 'debugEcho' at {endpoint} rejected discoveryDetails: "
                "discoveryDetails.descriptions: must be a list of strings, got int",
            )
            assert bad.devices == ()
            await trio.sleep(0.5)  # 25 backoff periods of FAST
            assert handler.parses == 1
            assert registry.status("debugEcho", endpoint) == WAITING  # the handler is fine
            nursery.cancel_scope.cancel()


async def test_a_hostile_document_does_not_mark_the_handler_offline(
    sock_dir: Path, tmp_path: Path
) -> None:
    # `!!int x` made parse_details raise ValueError: the stream failed, the handler went
    # Offline. Now it is InvalidDetails like any other bad document.
    registry = Registry(trio.current_time)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, endpoint = await start_handler(nursery, echo(tmp_path), sock_dir)
            await registered(registry, endpoint)
            _, results = await discover(nursery, registry, details="descriptions: !!int x")
            bad = await results.until(lambda r: bool(r.problems))
            assert (
                "discoveryDetails: not valid YAML: a value does not fit its type"
                in (bad.problems[0])
            )
            await trio.sleep(0.5)
            assert registry.status("debugEcho", endpoint) == WAITING
            nursery.cancel_scope.cancel()


async def test_handler_reregisters_when_the_agent_restarts(sock_dir: Path, tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            first = Registry(trio.current_time)
            agent = await start_agent(nursery, first, sock_dir)
            _, endpoint = await start_handler(nursery, echo(tmp_path), sock_dir)
            await registered(first, endpoint)

            agent.cancel()  # the agent stops; its socket file goes
            await trio.sleep(0.2)
            assert not (sock_dir / "agent-registration.sock").exists()
            second = Registry(trio.current_time)  # a new agent knows nothing (upstream #558)
            await start_agent(nursery, second, sock_dir)
            await registered(second, endpoint)

            _, results = await discover(nursery, second)
            await results.until(lambda r: len(r.devices) == 2)

            # A replaced socket file (new inode) without a gap is noticed too.
            third = Registry(trio.current_time)
            await start_agent(nursery, third, sock_dir)  # replaces the file under `second`
            await registered(third, endpoint)
            nursery.cancel_scope.cancel()


async def test_embedded_handler_uses_the_same_path(tmp_path: Path) -> None:
    registry = Registry(trio.current_time)
    registration = embedded(echo(tmp_path, shared=True))
    registry.register(registration)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            _, results = await discover(nursery, registry)
            found = await results.until(lambda r: len(r.devices) == 2)
            assert all(d.shared and d.endpoint == "embedded-debugEcho" for d in found.devices)
            assert found.handlers == {"embedded-debugEcho": ACTIVE}
            _, bad = await discover(nursery, registry, details="nope: 1", key="default/bad")
            result = await bad.until(lambda r: bool(r.problems))
            assert "discoveryDetails.descriptions: is required" in result.problems[0]
            nursery.cancel_scope.cancel()


async def test_bad_devices_are_dropped_and_lists_are_capped_with_reasons(tmp_path: Path) -> None:
    registry = Registry(trio.current_time)
    registry.register(embedded(echo(tmp_path, shared=True)))
    rules = DeviceRules(max_devices=3, max_configuration_devices=2)
    details = 'descriptions: [d3, "bad\\0", d1, d2, d1]'
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            _, results = await discover(nursery, registry, details=details, rules=rules)
            found = await results.until(lambda r: bool(r.devices))
            assert [d.device.id for d in found.devices] == ["d1", "d2"]
            assert found.refused == (
                "embedded-debugEcho: device 'bad\\x00' dropped: property "
                "'DEBUG_ECHO_DESCRIPTION' holds a NUL character",
                "embedded-debugEcho: device id 'd1' sent 2 times; only the first is considered",
                "3 devices discovered; only the first 2 by id are used "
                "(the agent's --max-devices-per-configuration)",
            )
            assert not found.problems  # the handler is fine: its devices are what is refused
            nursery.cancel_scope.cancel()


async def test_lists_merge_across_endpoints(sock_dir: Path, tmp_path: Path) -> None:
    registry = Registry(trio.current_time)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, results = await discover(nursery, registry)
            _, a = await start_handler(nursery, echo(tmp_path), sock_dir, "a.sock")
            await results.until(lambda r: len(r.devices) == 2)
            b_scope, b = await start_handler(
                nursery, echo(tmp_path, shared=True), sock_dir, "b.sock"
            )
            both = await results.until(lambda r: r.handlers == {a: ACTIVE, b: ACTIVE})
            # Each id once; the first endpoint (sorted) wins, with its shared flag.
            assert ids(both) == ["foo0", "foo1"]
            assert all(d.endpoint == a and d.shared is False for d in both.devices)
            b_scope.cancel()
            after = await results.until(lambda r: isinstance(r.handlers.get(b), Offline))
            assert ids(after) == ["foo0", "foo1"]  # a's devices stay
            nursery.cancel_scope.cancel()


async def test_network_endpoint(sock_dir: Path, tmp_path: Path) -> None:
    registry = Registry(trio.current_time)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)

            async def run(task_status: trio.TaskStatus[str]) -> None:
                await run_standalone(
                    echo(tmp_path),
                    registration_socket=sock_dir / "agent-registration.sock",
                    network=("127.0.0.1", 0),
                    backoff=FAST,
                    task_status=task_status,
                )

            endpoint: str = await nursery.start(run)
            assert endpoint.startswith("http://127.0.0.1:")
            _, results = await discover(nursery, registry)
            found = await results.until(lambda r: len(r.devices) == 2)
            assert {d.endpoint for d in found.devices} == {endpoint}
            nursery.cancel_scope.cancel()


class Churn:
    """A handler that sends big, ever-changing lists as fast as it can."""

    name = "debugEcho"
    shared = False

    def parse_details(self, text: str) -> str:
        return text

    async def discover(self, details: str, properties: Properties, send: Send) -> None:
        n = 0
        while True:
            n += 1
            await send([Device(f"dev-{n}-{i}", {"P": "x" * 50}) for i in range(500)])


def _all_tasks() -> Counter[str]:
    """The running tasks, by name (a re-registration may replace a task by its twin)."""
    names: Counter[str] = Counter()
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        assert task is not None
        names[task.name] += 1
        stack.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return names


async def _settle_to(expected: Counter[str]) -> None:
    # The far side notices a closed connection by I/O, which wait_all_tasks_blocked does
    # not wait for: poll (under the caller's fail_after).
    while True:
        if _all_tasks() == expected:
            return
        await trio.sleep(0.01)


async def test_cancellation_mid_message_leaves_nothing_behind(sock_dir: Path) -> None:
    outside = _all_tasks()
    registry = Registry(trio.current_time)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, endpoint = await start_handler(nursery, Churn(), sock_dir)
            await registered(registry, endpoint)
            await trio.testing.wait_all_tasks_blocked()
            idle = _all_tasks()  # agent and handler serving, no stream
            for messages in (1, 2, 5, 9):
                config, results = await discover(nursery, registry)
                count = 0

                def enough(r: DiscoveryResult, want: int = messages) -> bool:
                    nonlocal count
                    count += bool(r.devices)
                    return count >= want

                await results.until(enough)
                config.cancel()  # while big lists are still streaming
                # Both ends drop their stream tasks: the agent's reader, the handler's
                # response generator and its producer.
                await _settle_to(idle)
                assert registry.status("debugEcho", endpoint) == WAITING
            nursery.cancel_scope.cancel()
    assert os.listdir(sock_dir) == []
    await _settle_to(outside)


async def test_standalone_process_over_the_cli(sock_dir: Path, tmp_path: Path) -> None:
    registry = Registry(trio.current_time)
    env = {
        **os.environ,
        "DISCOVERY_HANDLERS_DIRECTORY": str(sock_dir),
        "DEBUG_ECHO_AVAILABILITY_PATH": str(tmp_path / "availability.txt"),
        "DEBUG_ECHO_INSTANCES_SHARED": "true",
    }
    code = "import sys; from akri_trio.discovery.cli import main; sys.exit(main(sys.argv[1:]))"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, results = await discover(nursery, registry)
            proc = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [sys.executable, "-c", code, "debugEcho"],
                    env=env,
                    cwd=REPO,
                    stderr=subprocess.PIPE,
                    check=False,
                )
            )
            found = await results.until(lambda r: len(r.devices) == 2)
            endpoint = str(sock_dir / "debugEcho.sock")
            assert all(d.shared and d.endpoint == endpoint for d in found.devices)

            proc.send_signal(signal.SIGTERM)
            await results.until(lambda r: r.devices == ())
            await results.until(lambda r: isinstance(r.handlers.get(endpoint), Offline))
            assert await proc.wait() == 0
            assert os.listdir(sock_dir) == ["agent-registration.sock"]  # its socket is gone
            nursery.cancel_scope.cancel()


@attrs.define
class Flaky:
    """Sends one list, then fails: every Discover stream breaks after its first message."""

    name: str = "debugEcho"
    shared: bool = False
    calls: int = 0

    def parse_details(self, text: str) -> str:
        return text

    async def discover(self, details: str, properties: Properties, send: Send) -> None:
        self.calls += 1
        await send([Device(f"call-{self.calls}")])
        await trio.sleep(0.05)
        raise RuntimeError("device bus exploded")


async def test_failing_handler_drops_devices_goes_offline_and_is_retried(sock_dir: Path) -> None:
    registry = Registry(trio.current_time)
    handler = Flaky()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, endpoint = await start_handler(nursery, handler, sock_dir)
            await registered(registry, endpoint)
            _, results = await discover(nursery, registry)
            await results.until(lambda r: ids(r) == ["call-1"])
            dropped = await results.until(lambda r: r.devices == ())
            assert isinstance(dropped.handlers[endpoint], Offline)
            # Reconnected (with backoff) while it stays registered; each stream replaces the
            # list, and a reconnect makes it Active again.
            again = await results.until(lambda r: ids(r) == ["call-3"])
            assert again.handlers[endpoint] == ACTIVE
            nursery.cancel_scope.cancel()


@attrs.define
class Bloated:
    """Sends one device with 200,000 properties (about 20 MB) beside a normal one."""

    name: str = "debugEcho"
    shared: bool = False

    def parse_details(self, text: str) -> str:
        return text

    async def discover(self, details: str, properties: Properties, send: Send) -> None:
        huge = Device("huge", {f"P{i}": "x" * 100 for i in range(200_000)})
        await send([huge, Device("ok", {"A": "1"})])
        await trio.sleep_forever()


async def test_a_20_mb_device_over_the_real_stream_is_dropped_with_its_reason(
    sock_dir: Path,
) -> None:
    registry = Registry(trio.current_time)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_agent(nursery, registry, sock_dir)
            _, results = await discover(nursery, registry)  # picks the handler up once it is
            _, endpoint = await start_handler(nursery, Bloated(), sock_dir)
            found = await results.until(lambda r: bool(r.devices))
            assert ids(found) == ["ok"]
            (line,) = found.refused
            assert line.startswith(
                f"{endpoint}: device 'huge' dropped: 200000 properties; at most 256 per device"
            )
            nursery.cancel_scope.cancel()
