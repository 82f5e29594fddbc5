"""The cancellation harness (agent issue §5): cancel the agent, a plugin or a peer in the middle
of what it is doing, then check that nothing is left behind and nothing is half done.

Every scenario runs the real agent (`run_agent`) against the real API server, with real Unix
sockets and real gRPC on both sides (purerpc in the agent, grpcio in the kubelet stand-in and in
a kubelet subprocess), and checks afterwards:

- no leaked tasks: the agent's nursery exits promptly once cancelled (`fail_after`) and the
  run's task tree has as many tasks as before the scenario;
- no leaked socket files: the plugin sockets, the registration socket;
- no leaked fds: /proc/self/fd holds no more than before (the test's own API client and grpcio's
  two process-wide fds predate the baseline);
- deviceUsage in the API server agrees with what the plugins believe (the agent's NodeView and
  the device lists a ListAndWatch stream gives the kubelet stand-in).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import grpc
import httpx
import pytest
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.instance_plan import instance_name_for
from akri_trio.agent.plugins.manager import InstancePlugin, Plugin
from akri_trio.agent.plugins.service import DevicePluginService
from akri_trio.agent.run import REGISTRATION_SOCKET, Agent, AgentSettings, run_agent
from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.discovery.registry import ACTIVE, WAITING
from akri_trio.discovery.standalone import DiscoveryHandlerService, run_standalone
from akri_trio.kube.client import Client
from akri_trio.kube.config import load_config
from akri_trio.kube.errors import NotFound
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.runtime import Backoff
from tests.support.akri_cluster import (
    debug_echo_config,
    ensure_namespace,
)
from tests.support.cancellation import (
    ControlledKubelet,
    Gate,
    Hold,
    Refusing,
    all_tasks,
    closed_port,
    fds_return_to,
    is_usage_write,
    live_asyncgens,
    open_fds,
    socket_files,
    tasks_awaiting,
    tasks_return_to,
)
from tests.support.intercept import Intercepting
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api, until_state

NS = "cancel-tests"
NODE = "node-a"
STOP_S = 5.0  # a cancelled agent must be gone within this
KUBELET_SOCK = "kubelet.sock"
REPO = str(Path(__file__).resolve().parents[2])


def instance(config: str, device: str, shared: bool = True) -> str:
    return instance_name_for(config, device, shared, NODE)


def plugin_name(plugin: Plugin) -> str:
    """namespace/instance for an instance plugin, namespace/configuration for the other."""
    if isinstance(plugin, InstancePlugin):
        return str(plugin.key)
    return f"{plugin.namespace}/{plugin.config}"


def list_and_watch_streams() -> int:
    return len(live_asyncgens(DevicePluginService.ListAndWatch))


def discover_streams() -> int:
    return len(live_asyncgens(DiscoveryHandlerService.Discover))


# ---- fixtures and the harness -----------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _grpcio_initialized() -> Iterator[None]:
    """grpcio holds two process-wide fds (an epoll and its eventfd) while any grpcio object is
    alive: keep one alive for the whole module so they predate every test's fd baseline."""
    with tempfile.TemporaryDirectory(prefix="akw", dir="/tmp") as d:
        keeper = KubeletStandin(Path(d)).start()
        keeper.stop()
        yield
        del keeper


@attrs.frozen
class Baseline:
    """What the process holds before a scenario; `check` after it has been torn down."""

    tasks: int
    fds: dict[int, str]

    @classmethod
    def take(cls) -> Baseline:
        return cls(len(all_tasks()), open_fds())

    async def check(self) -> None:
        await tasks_return_to(self.tasks)
        await fds_return_to(self.fds)


@attrs.define
class RunningAgent:
    agent: Agent
    scope: trio.CancelScope
    done: trio.Event

    async def stop(self) -> None:
        """Cancel the whole agent; it must be gone (every task, every socket) promptly."""
        self.scope.cancel()
        with trio.fail_after(STOP_S):
            await self.done.wait()


@attrs.define
class Node:
    root: Path
    nursery: trio.Nursery
    client: Client  # the agents' own real client (opened after the baseline)
    kubelet: ControlledKubelet
    settings: AgentSettings

    @property
    def plugin_dir(self) -> Path:
        return self.settings.device_plugin_dir

    @property
    def handlers_dir(self) -> Path:
        return self.settings.discovery_handlers_directory

    async def start_agent(self, api: Client | None = None) -> RunningAgent:
        scope, done = trio.CancelScope(), trio.Event()
        settings, client = self.settings, api or self.client

        async def run(task_status: trio.TaskStatus[Agent]) -> None:
            try:
                with scope:
                    await run_agent(settings, api=client, task_status=task_status)
            finally:
                done.set()

        agent: Agent = await self.nursery.start(run)
        return RunningAgent(agent, scope, done)

    async def wait(self, predicate: Callable[[ControlledKubelet], bool]) -> None:
        kubelet = self.kubelet
        await trio.to_thread.run_sync(kubelet.wait_for, lambda _: predicate(kubelet), 20.0)

    async def allocate(self, resource: str, requests: list[list[str]]) -> Any:
        return await trio.to_thread.run_sync(self.kubelet.allocate, resource, requests)

    async def allocate_code(self, resource: str, requests: list[list[str]]) -> grpc.StatusCode:
        try:
            await self.allocate(resource, requests)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
        return grpc.StatusCode.OK

    def plugin_sockets(self) -> list[str]:
        return [n for n in socket_files(self.plugin_dir) if n != KUBELET_SOCK]


@asynccontextmanager
async def node_harness(
    cluster: dict[str, str], root: Path, *, enable_debug_echo: bool = True
) -> AsyncIterator[Node]:
    """A node (its directories, a kubelet stand-in, a real API client for its agents); on exit
    every agent is cancelled, the stand-in stopped and the client closed, in that order."""
    plugin_dir = root / NODE / "device-plugins"
    plugin_dir.mkdir(parents=True)
    settings = AgentSettings(
        node=NODE,
        discovery_handlers_directory=root / NODE / "akri",
        device_plugin_dir=plugin_dir,
        pod_resources_socket=root / NODE / "pod-resources.sock",
        enable_debug_echo=enable_debug_echo,
        debug_echo_shared=True,
        debug_echo_availability=root / "availability",
        metrics_port=None,
        reclaim_period=3600.0,  # nothing here exercises the reclaimer
    )
    kubelets = [ControlledKubelet(plugin_dir)]
    try:
        async with (
            Client.open(load_config(Path(cluster["KUBECONFIG"]))) as client,
            trio.open_nursery() as nursery,
        ):
            node = Node(root, nursery, client, kubelets[0], settings)
            try:
                yield node
            finally:
                kubelets.append(node.kubelet)  # a test may have replaced it (a restart)
            nursery.cancel_scope.cancel()
    finally:
        for kubelet in kubelets:
            kubelet.stop()


async def usage_of(api: Client, name: str) -> dict[str, str]:
    obj = await api.get(INSTANCES, name, namespace=NS)
    usage: dict[str, str] = obj["spec"].get("deviceUsage") or {}
    return usage


def view_usage(agent: Agent, name: str) -> dict[str, str] | None:
    inst = agent.view.instance(ObjectKey(NS, name))
    return None if inst is None else dict(inst.spec.device_usage)


async def no_instances(api: Client) -> bool:
    return not (await api.list(INSTANCES, namespace=NS)).items


@pytest.fixture
async def ns(akri: Client) -> Client:
    await ensure_namespace(akri, NS)
    return akri


# ---- 2. cancelled in the middle of an Allocate's API write -----------------------------------


@pytest.mark.parametrize("hold", list(Hold), ids=[h.value for h in Hold])
async def test_agent_cancelled_during_allocate_write_leaves_claim_whole_or_absent(
    ns: Client, cluster: dict[str, str], short_tmp: Path, hold: Hold
) -> None:
    """The agent is cancelled while an Allocate's deviceUsage PATCH is held (before it is sent,
    as it is sent, after the server applied it). Afterwards the claim is either in deviceUsage
    and a restarted agent's plugins show the slot held, or absent and the slot is offered free;
    the agent never remembered a claim it had not written, and the slot is never offered twice.
    """
    baseline = Baseline.take()
    name = instance("gate", "g0")
    slot, instance_res, config_res = f"{name}-0", f"akri.sh/{name}", "akri.sh/gate"
    async with node_harness(cluster, short_tmp) as node:
        node.kubelet.start()
        gate = Gate(is_usage_write)
        first = await node.start_agent(Intercepting(node.client, gate).client)
        await ns.create(CONFIGURATIONS, debug_echo_config("gate", NS, ["g0"], capacity=1))
        await node.wait(lambda k: k.healthy(instance_res) == [slot])
        await node.wait(lambda k: k.healthy(config_res) == ["gate-0"])

        gate.hold = hold
        allocated = trio.Event()
        codes: list[grpc.StatusCode] = []

        async def allocate() -> None:
            codes.append(await node.allocate_code(instance_res, [[slot]]))
            allocated.set()

        node.nursery.start_soon(allocate)
        with trio.fail_after(20):
            await gate.reached.wait()
        if hold is Hold.BEFORE_SEND:
            # Read, decide, write, remember: nothing is remembered while the write is pending.
            assert view_usage(first.agent, name) == {}
        await first.stop()

        # The Allocate never got an answer from the agent: the kubelet sees an error.
        with trio.fail_after(20):
            await allocated.wait()
        assert codes[0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), codes
        assert node.plugin_sockets() == []
        assert socket_files(node.handlers_dir) == []
        assert gate.started == 1

        usage = await usage_of(ns, name)
        if hold is Hold.BEFORE_SEND:
            assert usage == {}
        if hold is Hold.AFTER_ANSWER:
            assert gate.answered == 1
            assert usage == {slot: NODE}
        assert usage in ({}, {slot: NODE})  # ON_THE_WIRE: either, never anything else
        claimed = bool(usage)

        # A restarted agent: its view and its plugins' lists agree with the API server.
        await node.wait(lambda k: k.healthy(config_res) == [])  # the old stream's end noted
        answered = node.kubelet.answered(config_res)
        second = await node.start_agent()
        await until_state(
            lambda: view_usage(second.agent, name) == usage, what="restarted view == deviceUsage"
        )
        expected_vdevs = [] if claimed else ["gate-0"]
        await node.wait(
            lambda k: k.answered(config_res) > answered and k.healthy(config_res) == expected_vdevs
        )
        await node.wait(lambda k: k.healthy(instance_res) == [slot])
        if claimed:
            # Held: the configuration plugin has nothing to give, whatever the kubelet asks.
            code = await node.allocate_code(config_res, [["gate-0"]])
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        else:
            # Free: it can be claimed now, exactly once.
            await node.allocate(instance_res, [[slot]])
            await node.wait(lambda k: k.healthy(config_res) == [])
        assert await usage_of(ns, name) == {slot: NODE}
        assert view_usage(second.agent, name) == {slot: NODE}
        await second.stop()
        assert node.plugin_sockets() == []
    await baseline.check()


# ---- 4. shutdown during registration -----------------------------------------------------------


async def test_agent_cancelled_while_plugins_retry_register_removes_everything(
    ns: Client, cluster: dict[str, str], short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No kubelet.sock yet: the plugins serve their sockets and retry Register with backoff.
    Cancelling the agent then removes every socket it made and ends every task."""
    caplog.set_level("DEBUG", logger="akri_trio.agent.plugins.kubelet")
    baseline = Baseline.take()
    name = instance("early", "e0")
    async with node_harness(cluster, short_tmp) as node:  # the stand-in is never started
        running = await node.start_agent()
        await ns.create(CONFIGURATIONS, debug_echo_config("early", NS, ["e0"], capacity=1))

        def retrying() -> bool:
            # Both plugins have failed to register at least twice (attempt 2 is logged).
            return {
                resource
                for resource in (f"akri.sh/{name}", "akri.sh/early")
                for r in caplog.records
                if r.getMessage().startswith(f"registering {resource} with the kubelet (attempt 2)")
            } == {f"akri.sh/{name}", "akri.sh/early"}

        await until_state(retrying, what="both plugins retrying Register")
        plugins = running.agent.plugins
        assert {plugin_name(p) for p in plugins.running} == {f"{NS}/{name}", f"{NS}/early"}
        assert plugins.registered == set()
        assert len(node.plugin_sockets()) == 2
        assert socket_files(node.handlers_dir) == [REGISTRATION_SOCKET]
        await running.stop()
        assert socket_files(node.plugin_dir) == []
        assert socket_files(node.handlers_dir) == []
    await baseline.check()


async def test_agent_cancelled_during_an_inflight_register_removes_everything(
    ns: Client, cluster: dict[str, str], short_tmp: Path
) -> None:
    """The kubelet accepted a Register call and has not answered: cancelling the agent ends
    the call (it has no other way out) and removes the plugin sockets."""
    baseline = Baseline.take()
    async with node_harness(cluster, short_tmp) as node:
        node.kubelet.hold_register.set()
        node.kubelet.start()
        running = await node.start_agent()
        await ns.create(CONFIGURATIONS, debug_echo_config("held", NS, ["h0"], capacity=1))
        parked = await trio.to_thread.run_sync(node.kubelet.register_parked.wait, 20.0)
        assert parked, "no Register call reached the kubelet"
        await until_state(
            lambda: len(tasks_awaiting("register")) >= 1, what="a Register call awaiting its answer"
        )
        assert running.agent.plugins.registered == set()
        assert len(node.plugin_sockets()) == 2
        await running.stop()
        assert tasks_awaiting("register") == []
        assert socket_files(node.plugin_dir) == [KUBELET_SOCK]  # the stand-in's own
        assert socket_files(node.handlers_dir) == []
        node.kubelet.release_register.set()
    await baseline.check()


# ---- 3. a kubelet disconnect during ListAndWatch ---------------------------------------------

KUBELET_PROCESS = """
import sys, grpc
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc
channel = grpc.insecure_channel("unix://" + sys.argv[1])
for answer in dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty()):
    print(",".join(d.ID for d in answer.devices), flush=True)
"""


async def test_kubelet_channel_closed_mid_listandwatch_ends_the_stream_only(
    ns: Client, cluster: dict[str, str], short_tmp: Path
) -> None:
    """The kubelet closes a plugin's connection mid-stream: that ListAndWatch generator ends
    (nothing stays parked), the plugin keeps serving and registered, and a new stream to the
    same socket gets the current list."""
    baseline = Baseline.take()
    name = instance("law", "l0")
    resource = f"akri.sh/{name}"
    async with node_harness(cluster, short_tmp) as node:
        node.kubelet.start()
        running = await node.start_agent()
        await ns.create(CONFIGURATIONS, debug_echo_config("law", NS, ["l0"], capacity=2))
        await node.wait(lambda k: k.healthy(resource) == [f"{name}-0", f"{name}-1"])
        await node.wait(lambda k: k.healthy("akri.sh/law") == ["law-0"])
        assert list_and_watch_streams() == 2
        sockets = node.plugin_sockets()

        node.kubelet.disconnect(resource)
        await until_state(lambda: list_and_watch_streams() == 1, what="the dropped stream's end")
        assert f"{NS}/{name}" in {plugin_name(p) for p in running.agent.plugins.running}
        assert f"{NS}/{name}" in {plugin_name(p) for p in running.agent.plugins.registered}
        assert node.plugin_sockets() == sockets

        answered = node.kubelet.answered(resource)
        node.kubelet.reconnect(resource)
        await node.wait(
            lambda k: (
                k.answered(resource) > answered
                and k.healthy(resource) == [f"{name}-0", f"{name}-1"]
            )
        )
        assert list_and_watch_streams() == 2
        # The new stream is live: a claim through it shows up in the other plugin's stream.
        await node.allocate(resource, [[f"{name}-0"]])
        assert await usage_of(ns, name) == {f"{name}-0": NODE}
        assert view_usage(running.agent, name) == {f"{name}-0": NODE}
        await running.stop()
        assert node.plugin_sockets() == []
    assert list_and_watch_streams() == 0
    await baseline.check()


async def test_kubelet_process_killed_mid_listandwatch_ends_the_stream_only(
    ns: Client, cluster: dict[str, str], short_tmp: Path
) -> None:
    """A kubelet process dies with a stream open (SIGKILL: the kernel closes the socket, no
    RST_STREAM, no GOAWAY): the plugin's generator ends on the EOF alone and the plugin keeps
    serving."""
    baseline = Baseline.take()
    name = instance("dead", "d0")
    resource = f"akri.sh/{name}"
    async with node_harness(cluster, short_tmp) as node:
        node.kubelet.start()
        running = await node.start_agent()
        await ns.create(CONFIGURATIONS, debug_echo_config("dead", NS, ["d0"], capacity=1))
        await node.wait(lambda k: k.healthy(resource) == [f"{name}-0"])
        await node.wait(lambda k: k.healthy("akri.sh/dead") == ["dead-0"])
        endpoint = node.kubelet.registrations[resource].endpoint
        assert list_and_watch_streams() == 2

        env = {**os.environ, "PYTHONPATH": REPO}
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", KUBELET_PROCESS, str(node.plugin_dir / endpoint)],
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            assert process.stdout is not None
            with trio.fail_after(20):
                first = await process.stdout.receive_some()
            assert first.decode().strip() == f"{name}-0"
            assert list_and_watch_streams() == 3
            process.send_signal(signal.SIGKILL)
            with trio.fail_after(10):
                await process.wait()
        finally:
            process.kill()
            await process.wait()
            if process.stdout is not None:
                await process.stdout.aclose()
        await until_state(
            lambda: list_and_watch_streams() == 2, what="the dead kubelet's stream end"
        )
        # The plugin still serves the stand-in's stream: a claim reaches it.
        await node.allocate(resource, [[f"{name}-0"]])
        await node.wait(lambda k: k.healthy("akri.sh/dead") == [])
        assert f"{NS}/{name}" in {plugin_name(p) for p in running.agent.plugins.registered}
        await running.stop()
    assert list_and_watch_streams() == 0
    await baseline.check()


async def test_kubelet_restart_reregisters_and_old_streams_end(
    ns: Client, cluster: dict[str, str], short_tmp: Path
) -> None:
    """A kubelet restart (its socket and ours wiped, a new kubelet): every old ListAndWatch
    generator ends, the plugins re-serve on new sockets and register again, and the new
    streams carry the same deviceUsage."""
    baseline = Baseline.take()
    name = instance("rst", "r0")
    resource = f"akri.sh/{name}"
    async with node_harness(cluster, short_tmp) as node:
        node.kubelet.start()
        running = await node.start_agent()
        await ns.create(CONFIGURATIONS, debug_echo_config("rst", NS, ["r0"], capacity=1))
        await node.wait(lambda k: k.healthy("akri.sh/rst") == ["rst-0"])
        await node.allocate(resource, [[f"{name}-0"]])
        await node.wait(lambda k: k.healthy("akri.sh/rst") == [])
        old_sockets = node.plugin_sockets()
        assert len(old_sockets) == 2

        node.kubelet.stop()
        for sock in old_sockets:  # what a starting kubelet does to the directory
            (node.plugin_dir / sock).unlink()
        node.kubelet = ControlledKubelet(node.plugin_dir)
        node.kubelet.start()
        await node.wait(lambda k: {resource, "akri.sh/rst"} <= set(k.registrations))
        await node.wait(
            lambda k: (
                k.answered("akri.sh/rst") >= 1
                and k.healthy("akri.sh/rst") == []
                and k.healthy(resource) == [f"{name}-0"]
            )
        )
        assert list_and_watch_streams() == 2
        new_sockets = node.plugin_sockets()
        assert len(new_sockets) == 2  # the old files were deleted: these are new sockets
        assert await usage_of(ns, name) == {f"{name}-0": NODE}
        await running.stop()
        assert node.plugin_sockets() == []
    await baseline.check()


# ---- 1. cancelled in the middle of a Discover stream -------------------------------------------

FAST = Backoff(base=0.05, cap=0.2)


@attrs.define
class Handler:
    """An external debugEcho handler (run_standalone) in a cancel scope of its own."""

    endpoint: str
    scope: trio.CancelScope
    done: trio.Event
    socket: Path

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(STOP_S):
            await self.done.wait()


async def start_handler(node: Node, *, backoff: Backoff = FAST) -> Handler:
    scope, done = trio.CancelScope(), trio.Event()
    sock = node.root / "debugEcho.sock"
    echo = DebugEcho(shared=True, availability_path=node.root / "availability", poll_interval=0.05)

    async def run(task_status: trio.TaskStatus[str]) -> None:
        try:
            with scope:
                await run_standalone(
                    echo,
                    registration_socket=node.handlers_dir / REGISTRATION_SOCKET,
                    socket_path=sock,
                    backoff=backoff,
                    watch_interval=0.05,
                    task_status=task_status,
                )
        finally:
            done.set()

    endpoint: str = await node.nursery.start(run)
    return Handler(endpoint, scope, done, sock)


async def agreement(
    node: Node, api: Client, running: RunningAgent, name: str, config_res: str, answered: int
) -> dict[str, str]:
    """Wait (bounded) until deviceUsage in the API server, the agent's view and the
    configuration plugin's latest list (capacity 1: a vdev exactly when the slot is free)
    agree; returns that deviceUsage."""

    async def agreed() -> tuple[dict[str, str]] | None:  # a tuple: an empty usage is an answer
        try:
            usage = await usage_of(api, name)
        except NotFound:  # deleted and not yet re-created
            return None
        vdevs = node.kubelet.healthy(config_res)
        if (
            view_usage(running.agent, name) == usage
            and node.kubelet.answered(config_res) > answered
            and len(vdevs) == 1 - len(usage)
        ):
            return (usage,)
        return None

    (usage,) = await until_api(agreed, 20, "API, view and plugin agree", poll=0.05)
    return usage


def streams_open_in_agent() -> int:
    """Agent-side Discover streams: tasks inside `_Discovery._remote`'s `async for`."""
    return len(tasks_awaiting("_remote"))


async def stream_open(node: Node, running: RunningAgent, handler: Handler, name: str) -> None:
    """Wait until the Configuration's Discover stream is open on both ends and its Instance's
    plugins serve the kubelet."""
    registry = running.agent.registry
    await until_state(
        lambda: registry.get("debugEcho") == {handler.endpoint: ACTIVE}, what="the stream is active"
    )
    await node.wait(lambda k: len(k.healthy(f"akri.sh/{name}")) >= 1)
    assert streams_open_in_agent() == 1
    assert discover_streams() == 1


async def test_configuration_deleted_mid_discover_stream(
    ns: Client, cluster: dict[str, str], short_tmp: Path
) -> None:
    """The Configuration goes while its stream to an external handler is open: the agent ends
    that stream (both ends' generators finish), marks the handler Waiting (closed on purpose,
    not lost), stops the plugins and removes their sockets; the handler lives on and serves the
    next Configuration."""
    baseline = Baseline.take()
    name = instance("disc", "x0")
    async with node_harness(cluster, short_tmp, enable_debug_echo=False) as node:
        node.kubelet.start()
        running = await node.start_agent()
        handler = await start_handler(node)
        await ns.create(CONFIGURATIONS, debug_echo_config("disc", NS, ["x0"], capacity=1))
        await stream_open(node, running, handler, name)
        await node.allocate(f"akri.sh/{name}", [[f"{name}-0"]])
        assert await usage_of(ns, name) == {f"{name}-0": NODE}

        await ns.delete(CONFIGURATIONS, "disc", namespace=NS)
        registry = running.agent.registry
        await until_state(
            lambda: registry.get("debugEcho") == {handler.endpoint: WAITING}, what="handler Waiting"
        )
        await until_state(
            lambda: discover_streams() == 0, what="the handler's Discover generator ends"
        )
        assert streams_open_in_agent() == 0
        assert tasks_awaiting("run_configuration_discovery") == []
        await until_state(lambda: not running.agent.plugins.running, what="plugins stopped")
        assert node.plugin_sockets() == []
        assert list_and_watch_streams() == 0
        await until_state(
            lambda: view_usage(running.agent, name) is None, what="the Instance left the view"
        )
        await until_api(lambda: no_instances(ns))

        # Discovery is not wedged: the same handler serves a new Configuration at once.
        again = instance("disc2", "y0")
        await ns.create(CONFIGURATIONS, debug_echo_config("disc2", NS, ["y0"], capacity=1))
        await stream_open(node, running, handler, again)
        assert await usage_of(ns, again) == {}
        assert view_usage(running.agent, again) == {}

        await running.stop()
        assert socket_files(node.handlers_dir) == []
        assert node.plugin_sockets() == []
        await until_state(lambda: discover_streams() == 0, what="the handler's generator ends")
        await handler.stop()
        assert not handler.socket.exists()
    await baseline.check()


async def test_agent_cancelled_mid_discover_stream(
    ns: Client, cluster: dict[str, str], short_tmp: Path
) -> None:
    """The whole agent is cancelled while a Discover stream is open: it exits promptly and
    leaves no socket; the handler's side of the stream ends, the handler keeps serving and
    registers with the next agent, whose plugins agree with deviceUsage."""
    baseline = Baseline.take()
    name = instance("cut", "z0")
    slot, config_res = f"{name}-0", "akri.sh/cut"
    async with node_harness(cluster, short_tmp, enable_debug_echo=False) as node:
        node.kubelet.start()
        running = await node.start_agent()
        handler = await start_handler(node)
        await ns.create(CONFIGURATIONS, debug_echo_config("cut", NS, ["z0"], capacity=1))
        await stream_open(node, running, handler, name)
        await node.allocate(f"akri.sh/{name}", [[slot]])

        await running.stop()
        assert streams_open_in_agent() == 0
        assert socket_files(node.handlers_dir) == []
        assert node.plugin_sockets() == []
        assert list_and_watch_streams() == 0
        await until_state(
            lambda: discover_streams() == 0, what="the handler's Discover generator ends"
        )
        assert handler.socket.exists() and not handler.done.is_set()

        answered = node.kubelet.answered(config_res)
        again = await node.start_agent()
        await stream_open(node, again, handler, name)
        # No vdev while the one slot is held; one if the claim was lost meanwhile (see
        # test_agent_restart_keeps_claims_until_handlers_reregister).
        await agreement(node, ns, again, name, config_res, answered)
        await again.stop()
        await until_state(lambda: discover_streams() == 0, what="the handler's generator ends")
        await handler.stop()
    await baseline.check()


async def test_agent_restart_keeps_claims_until_handlers_reregister(
    ns: Client, cluster: dict[str, str], short_tmp: Path
) -> None:
    """run.py: 'a restarted agent rebuilds its state from the Instances (claims included) and
    the discovery handlers re-register'. Here the agent restarts before the external handler
    has re-registered (upstream #558's order): the Instance and its claim must survive."""
    name = instance("keep", "k0")
    slot = f"{name}-0"
    async with node_harness(cluster, short_tmp, enable_debug_echo=False) as node:
        node.kubelet.start()
        running = await node.start_agent()
        handler = await start_handler(node)
        await ns.create(CONFIGURATIONS, debug_echo_config("keep", NS, ["k0"], capacity=1))
        await stream_open(node, running, handler, name)
        await node.allocate(f"akri.sh/{name}", [[slot]])
        uid = (await ns.get(INSTANCES, name, namespace=NS))["metadata"]["uid"]
        await running.stop()
        await handler.stop()

        again = await node.start_agent()

        async def status_written() -> bool:
            config = await ns.get(CONFIGURATIONS, "keep", namespace=NS)
            entries = (config.get("status") or {}).get("nodes") or []
            conditions = [c for e in entries for c in (e.get("conditions") or [])]
            return any(
                c["type"] == "HandlerAvailable" and c["status"] == "False" for c in conditions
            )

        # The restarted agent has reconciled the Configuration without a handler.
        await until_api(status_written)
        handler = await start_handler(node)
        await stream_open(node, again, handler, name)
        obj = await ns.get(INSTANCES, name, namespace=NS)
        assert obj["metadata"]["uid"] == uid, "the Instance was deleted and re-created"
        assert (obj["spec"].get("deviceUsage") or {}) == {slot: NODE}
        await node.wait(lambda k: k.healthy("akri.sh/keep") == [])
        await again.stop()
        await handler.stop()


# ---- 5. the API server unreachable during Allocate -------------------------------------------


@pytest.mark.parametrize("level", ["instance", "configuration"])
async def test_allocate_while_api_unreachable_claims_nothing(
    ns: Client, cluster: dict[str, str], short_tmp: Path, level: str
) -> None:
    """Requests to the API server are refused (a real connection to a closed port): Allocate
    fails with UNAVAILABLE and claims nothing, in the API or in the agent's view, and the
    plugins still offer the slot. Once the server is reachable again the next Allocate works."""
    baseline = Baseline.take()
    name = instance("down", "n0")
    slot, instance_res, config_res = f"{name}-0", f"akri.sh/{name}", "akri.sh/down"
    resource, device = (instance_res, slot) if level == "instance" else (config_res, "down-0")
    async with node_harness(cluster, short_tmp) as node:
        node.kubelet.start()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{closed_port()}") as dead:
            flaky = Refusing(dead)
            running = await node.start_agent(Intercepting(node.client, flaky).client)
            await ns.create(CONFIGURATIONS, debug_echo_config("down", NS, ["n0"], capacity=1))
            await node.wait(lambda k: k.healthy(config_res) == ["down-0"])
            await node.wait(lambda k: k.healthy(instance_res) == [slot])

            flaky.down = True
            code = await node.allocate_code(resource, [[device]])
            assert code == grpc.StatusCode.UNAVAILABLE
            assert any(r.startswith("PATCH ") for r in flaky.refused), flaky.refused
            assert view_usage(running.agent, name) == {}
            assert node.kubelet.healthy(config_res) == ["down-0"]  # still offered
            flaky.down = False
            assert await usage_of(ns, name) == {}

            response = await node.allocate(resource, [[device]])
            envs = dict(response.container_responses[0].envs)
            assert envs["DEBUG_ECHO_DESCRIPTION"] == "n0"
            assert await usage_of(ns, name) == {
                slot: NODE if level == "instance" else f"C:down-0:{NODE}"
            }
            assert view_usage(running.agent, name) == await usage_of(ns, name)
            await node.wait(
                lambda k: k.healthy(config_res) == (["down-0"] if level != "instance" else [])
            )
            await running.stop()
            assert node.plugin_sockets() == []
    await baseline.check()
