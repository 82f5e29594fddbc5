"""The agent against the real control plane, with a grpcio kubelet stand-in for the node side.

The real kubelet has its own end-to-end tests (tests/node); these cover what one machine cannot
do with one kubelet (two agents racing for one slot) and keep the agent's API behaviour fast to
check: Instances, status, write-only-on-change, Allocate claims, configuration-level mapping.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import trio

from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.kube.client import Client
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster import procs
from tests.support.akri_cluster import (
    debug_echo_config,
    ensure_namespace,
)
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api

NS = "agent-tests"


class Node:
    """One agent plus its kubelet stand-in, in a directory of its own."""

    def __init__(self, name: str, root: Path, availability: Path, metrics: bool = False) -> None:
        self.name = name
        self.kubelet = KubeletStandin(root / name / "device-plugins").start()
        self.settings = AgentSettings(
            node=name,
            discovery_handlers_directory=root / name / "akri",
            device_plugin_dir=root / name / "device-plugins",
            pod_resources_socket=root / name / "pod-resources.sock",
            enable_debug_echo=True,
            debug_echo_shared=True,
            debug_echo_availability=availability,
            metrics_port=0 if metrics else None,
            metrics_host="127.0.0.1",
        )
        self.agent: Agent | None = None
        self.scope = trio.CancelScope()

    async def run(self, api: Client, *, task_status: trio.TaskStatus[None]) -> None:
        with self.scope:
            self.agent = await _start(api, self.settings)
            task_status.started()
            await trio.sleep_forever()

    async def wait(self, predicate: Callable[[KubeletStandin], bool]) -> None:
        await trio.to_thread.run_sync(self.kubelet.wait_for, predicate, 20.0)

    async def allocate(self, resource: str, requests: list[list[str]]) -> Any:
        return await trio.to_thread.run_sync(self.kubelet.allocate, resource, requests)


_nursery_for_agents: list[trio.Nursery] = []


async def _start(api: Client, settings: AgentSettings) -> Agent:
    agent: Agent = await _nursery_for_agents[-1].start(
        lambda **kw: run_agent(settings, api=api, **kw)
    )
    return agent


@pytest.fixture
async def nodes(akri: Client, short_tmp: Path) -> AsyncIterator[Callable[..., Any]]:
    tmp_path = short_tmp
    await ensure_namespace(akri, NS)
    availability = tmp_path / "availability"
    started: list[Node] = []
    async with trio.open_nursery() as nursery:
        _nursery_for_agents.append(nursery)

        async def start(name: str, metrics: bool = False) -> Node:
            node = Node(name, tmp_path, availability, metrics)
            await nursery.start(node.run, akri)
            started.append(node)
            return node

        start.availability = availability  # type: ignore[attr-defined]
        try:
            yield start
        finally:
            nursery.cancel_scope.cancel()
            _nursery_for_agents.pop()
            for node in started:
                node.kubelet.stop()


async def _instances(api: Client) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in (await api.list(INSTANCES, namespace=NS)).items}


async def test_discovered_devices_become_instances_and_plugins(akri: Client, nodes: Any) -> None:
    node = await nodes("node-a")
    await akri.create(
        CONFIGURATIONS,
        debug_echo_config(
            "echo", NS, ["foo0", "foo1"], capacity=2, broker_properties={"GREETING": "hi"}
        ),
    )

    async def two() -> dict[str, Any] | None:
        found = await _instances(akri)
        return found if len(found) == 2 else None

    instances = await until_api(two)
    assert set(instances) == {"echo-8120fe", "echo-a19705"}  # BLAKE2b-3 of foo0 / foo1 (shared)
    spec = instances["echo-8120fe"]["spec"]
    assert spec["brokerProperties"] == {"DEBUG_ECHO_DESCRIPTION": "foo0", "GREETING": "hi"}
    assert spec["nodes"] == ["node-a"] and spec["capacity"] == 2 and spec["shared"] is True
    assert instances["echo-8120fe"]["metadata"]["finalizers"] == ["node-a"]
    await node.wait(
        lambda k: len(k.healthy("akri.sh/echo-8120fe")) == 2 and len(k.healthy("akri.sh/echo")) == 2
    )
    registered = node.kubelet.registrations["akri.sh/echo"]
    assert registered.options.get_preferred_allocation_available is True

    status = (await akri.get(CONFIGURATIONS, "echo", namespace=NS))["status"]["nodes"][0]
    assert status["node"] == "node-a" and status["instances"] == 2
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Accepted": "True",
        "HandlerAvailable": "True",
        "DiscoveryDetailsValid": "True",
        "PropertiesResolved": "True",
        "DevicesAccepted": "True",
        "DiscoveryHealthy": "True",
    }


async def test_unchanged_discovery_makes_no_writes(akri: Client, nodes: Any) -> None:
    await nodes("node-a")
    await akri.create(CONFIGURATIONS, debug_echo_config("quiet", NS, ["q0"]))
    await until_api(lambda: _instances(akri))
    await trio.sleep(1.5)  # let the first round of writes (Instance, status) settle
    before = {n: o["metadata"]["resourceVersion"] for n, o in (await _instances(akri)).items()}
    config_rv = (await akri.get(CONFIGURATIONS, "quiet", namespace=NS))["metadata"][
        "resourceVersion"
    ]
    await trio.sleep(3)  # several debugEcho polls, each reporting the same list
    after = {n: o["metadata"]["resourceVersion"] for n, o in (await _instances(akri)).items()}
    assert after == before
    assert (await akri.get(CONFIGURATIONS, "quiet", namespace=NS))["metadata"][
        "resourceVersion"
    ] == config_rv


async def test_offline_removes_instances_and_restore_brings_them_back(
    akri: Client, nodes: Any
) -> None:
    node = await nodes("node-a")
    await akri.create(CONFIGURATIONS, debug_echo_config("flaky", NS, ["f0", "f1"]))
    await until_api(lambda: _count(akri, 2))
    nodes.availability.write_text("OFFLINE")
    await until_api(lambda: _count(akri, 0))
    await node.wait(lambda k: k.healthy("akri.sh/flaky") == [])
    nodes.availability.write_text("ONLINE")
    await until_api(lambda: _count(akri, 2))
    await node.wait(lambda k: len(k.healthy("akri.sh/flaky")) == 2)


async def _count(api: Client, n: int) -> bool:
    return len(await _instances(api)) == n


async def test_allocate_claims_slot_and_returns_env(akri: Client, nodes: Any) -> None:
    node = await nodes("node-a")
    await akri.create(CONFIGURATIONS, debug_echo_config("cam", NS, ["c0"], capacity=2))
    await node.wait(lambda k: len(k.healthy("akri.sh/cam-da7ab9")) == 2)
    response = await node.allocate("akri.sh/cam-da7ab9", [["cam-da7ab9-1"]])
    envs = dict(response.container_responses[0].envs)
    assert envs == {"DEBUG_ECHO_DESCRIPTION": "c0", "DEBUG_ECHO_DESCRIPTION_DA7AB9": "c0"}
    usage = (await akri.get(INSTANCES, "cam-da7ab9", namespace=NS))["spec"]["deviceUsage"]
    assert usage == {"cam-da7ab9-1": "node-a"}
    # The configuration-level plugin now offers one free vdev for the one free slot.
    await node.wait(lambda k: len(k.healthy("akri.sh/cam")) == 1)


async def test_configuration_level_maps_to_distinct_devices(akri: Client, nodes: Any) -> None:
    node = await nodes("node-a")
    await akri.create(CONFIGURATIONS, debug_echo_config("any", NS, ["a0", "a1"], capacity=2))
    await node.wait(lambda k: k.healthy("akri.sh/any") == ["any-0", "any-1"])
    response = await node.allocate("akri.sh/any", [["any-0", "any-1"]])
    envs = dict(response.container_responses[0].envs)
    described = {v for k, v in envs.items() if k.startswith("DEBUG_ECHO_DESCRIPTION_")}
    assert described == {"a0", "a1"}  # two different devices, not two slots of one
    usages = [o["spec"].get("deviceUsage", {}) for o in (await _instances(akri)).values()]
    assert sorted(v for u in usages for v in u.values()) == ["C:any-0:node-a", "C:any-1:node-a"]
    # Held vdevs stay listed; each device still has a free slot, so two fresh vdevs appear.
    await node.wait(lambda k: k.healthy("akri.sh/any") == ["any-0", "any-1", "any-2", "any-3"])
    # Three distinct devices out of two: refused, and nothing more is claimed.
    with pytest.raises(grpc.RpcError) as info:
        await node.allocate("akri.sh/any", [["any-0", "any-1", "any-2"]])
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    usages = [o["spec"].get("deviceUsage", {}) for o in (await _instances(akri)).values()]
    assert sorted(v for u in usages for v in u.values()) == ["C:any-0:node-a", "C:any-1:node-a"]


async def test_two_agents_race_for_one_shared_slot(akri: Client, nodes: Any) -> None:
    a, b = await nodes("node-a"), await nodes("node-b")
    trials = 25
    await akri.create(CONFIGURATIONS, debug_echo_config("race", NS, ["r0"], capacity=trials))
    inst = "race-" + "8779fd"
    resource = f"akri.sh/{inst}"
    for node in (a, b):
        await node.wait(lambda k: len(k.healthy(resource)) == trials)
    winners: dict[str, list[str]] = {"node-a": [], "node-b": []}
    for i in range(trials):
        slot = f"{inst}-{i}"
        outcomes: dict[str, bool] = {}

        async def claim(node: Node, slot: str = slot, outcomes: dict[str, bool] = outcomes) -> None:
            try:
                await node.allocate(resource, [[slot]])
                outcomes[node.name] = True
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
                outcomes[node.name] = False

        async with trio.open_nursery() as race:
            race.start_soon(claim, a)
            race.start_soon(claim, b)
        assert sorted(outcomes.values()) == [False, True], outcomes
        winners[next(n for n, won in outcomes.items() if won)].append(slot)
    usage = (await akri.get(INSTANCES, inst, namespace=NS))["spec"]["deviceUsage"]
    assert usage == {s: n for n, slots in winners.items() for s in slots}


async def _node_status(api: Client, config: str) -> dict[str, Any]:
    obj = await api.get(CONFIGURATIONS, config, namespace=NS)
    entries = (obj.get("status") or {}).get("nodes") or []
    return entries[0] if entries else {}


def _conditions(entry: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["message"]) for c in (entry.get("conditions") or [])}


async def test_invalid_details_show_in_the_configuration_status(akri: Client, nodes: Any) -> None:
    await nodes("node-a")
    await akri.create(CONFIGURATIONS, debug_echo_config("bad", NS, [], details="descriptions: 7"))

    async def invalid() -> dict[str, tuple[str, str]] | None:
        conditions = _conditions(await _node_status(akri, "bad"))
        return conditions if conditions.get("DiscoveryDetailsValid", ("",))[0] == "False" else None

    _, message = (await until_api(invalid))["DiscoveryDetailsValid"]
    assert "descriptions" in message  # the handler's own words, naming the field
    assert await _instances(akri) == {}


async def test_unsolvable_property_shows_in_the_status(akri: Client, nodes: Any) -> None:
    await nodes("node-a")
    config = debug_echo_config("props", NS, ["p0"])
    config["spec"]["discoveryHandler"]["discoveryProperties"] = [
        {"name": "pw", "valueFrom": {"secretKeyRef": {"name": "nope", "namespace": NS, "key": "k"}}}
    ]
    await akri.create(CONFIGURATIONS, config)

    async def unsolvable() -> dict[str, tuple[str, str]] | None:
        conditions = _conditions(await _node_status(akri, "props"))
        return conditions if conditions.get("PropertiesResolved", ("",))[0] == "False" else None

    _, message = (await until_api(unsolvable))["PropertiesResolved"]
    assert "pw" in message and "nope" in message
    assert await _instances(akri) == {}


async def test_capacity_change_reaches_a_live_instance(akri: Client, nodes: Any) -> None:
    node = await nodes("node-a")
    await akri.create(CONFIGURATIONS, debug_echo_config("cap", NS, ["k0"], capacity=1))
    resource = "akri.sh/cap-" + "14c2c6"
    await node.wait(lambda k: k.healthy(resource) == ["cap-14c2c6-0"])
    await akri.merge_patch(CONFIGURATIONS, "cap", {"spec": {"capacity": 3}}, namespace=NS)
    await node.wait(lambda k: len(k.healthy(resource)) == 3)
    assert (await akri.get(INSTANCES, "cap-14c2c6", namespace=NS))["spec"]["capacity"] == 3


async def test_preferred_allocation_picks_distinct_devices(akri: Client, nodes: Any) -> None:
    node = await nodes("node-a")
    await akri.create(CONFIGURATIONS, debug_echo_config("pref", NS, ["p0", "p1"], capacity=2))
    await node.wait(lambda k: k.healthy("akri.sh/pref") == ["pref-0", "pref-1"])
    # Hold one slot of each device through the configuration plugin...
    await node.allocate("akri.sh/pref", [["pref-0"]])
    await node.allocate("akri.sh/pref", [["pref-1"]])
    await node.wait(lambda k: len(k.healthy("akri.sh/pref")) == 4)
    available = node.kubelet.healthy("akri.sh/pref")
    chosen = await trio.to_thread.run_sync(node.kubelet.preferred, "akri.sh/pref", available, 2)
    assert len(chosen) == 2
    # ...and the preferred pair is allocatable as one container: two different devices.
    response = await node.allocate("akri.sh/pref", [chosen])
    envs = response.container_responses[0].envs
    assert sorted(v for k, v in envs.items() if k.startswith("DEBUG_ECHO_DESCRIPTION_")) == [
        "p0",
        "p1",
    ]


async def test_metrics_are_really_exported(akri: Client, nodes: Any) -> None:
    node = await nodes("node-a", metrics=True)
    await akri.create(CONFIGURATIONS, debug_echo_config("seen", NS, ["s0"]))
    await node.wait(lambda k: len(k.healthy("akri.sh/seen")) == 1)
    assert node.agent is not None and node.agent.metrics_port
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.agent.metrics_port}") as http:
        ready = await http.get("/readyz")
        text = (await http.get("/metrics")).text
    assert ready.status_code == 200
    assert (
        f'akri_instance_count{{configuration="seen",is_shared="true",namespace="{NS}"}} 1.0' in text
    )
    assert (
        'akri_discovery_handler_endpoints{discovery_handler_name="debugEcho",state="Active"} 1.0'
        in text
    )
    assert "akri_device_plugins_registered 2.0" in text
    assert "process_resident_memory_bytes" in text


async def test_concurrent_allocates_on_one_device_share_writes(akri: Client, nodes: Any) -> None:
    node = await nodes("node-a")
    n = 20
    await akri.create(CONFIGURATIONS, debug_echo_config("busy", NS, ["b0"], capacity=n))
    inst = "busy-" + "3cdfc5"
    await node.wait(lambda k: len(k.healthy(f"akri.sh/{inst}")) == n)
    before = (await akri.get(INSTANCES, inst, namespace=NS))["metadata"]["generation"]
    async with trio.open_nursery() as burst:
        for i in range(n):
            burst.start_soon(node.allocate, f"akri.sh/{inst}", [[f"{inst}-{i}"]])
    after = await akri.get(INSTANCES, inst, namespace=NS)
    assert after["spec"]["deviceUsage"] == {f"{inst}-{i}": "node-a" for i in range(n)}
    # Every spec write bumps the generation: group commit needs far fewer than one per call.
    assert after["metadata"]["generation"] - before < n


def _kill_apiserver(cluster_dir: Path) -> None:
    rec = procs.running(cluster_dir / "pids" / "kube-apiserver.pid")
    assert rec is not None, "kube-apiserver is not running"
    os.kill(rec.pid, signal.SIGKILL)
    while procs.is_alive(rec):
        time.sleep(0.05)


def _cluster_up() -> None:
    run_cluster_command("up", check=True, timeout=300)


async def test_api_server_outage_serves_from_cache_and_recovers(
    akri: Client, nodes: Any, cluster: dict[str, str]
) -> None:
    """The kube-apiserver is killed under a running agent and started again: meanwhile the
    plugins keep serving the kubelet from the cache and Allocate fails cleanly (nothing claimed
    without a write); afterwards the same agent claims, sees new Configurations, and no plugin
    was ever restarted."""
    node = await nodes("node-a")
    inst, config_res = "out-da7ab9", "akri.sh/out"
    await akri.create(CONFIGURATIONS, debug_echo_config("out", NS, ["c0"], capacity=3))
    await node.wait(lambda k: len(k.healthy(f"akri.sh/{inst}")) == 3)
    await node.wait(lambda k: k.healthy(config_res) == ["out-0"])  # one vdev per device
    await node.allocate(f"akri.sh/{inst}", [[f"{inst}-0"]])
    streams = dict(node.kubelet.streams_opened)
    try:
        await trio.to_thread.run_sync(_kill_apiserver, Path(cluster["AKRI_TRIO_CLUSTER_DIR"]))
        # Allocate: refused at once with UNAVAILABLE, whichever plugin is asked.
        with trio.fail_after(30):
            for resource, ids in ((f"akri.sh/{inst}", [f"{inst}-1"]), (config_res, ["out-0"])):
                with pytest.raises(grpc.RpcError) as refused:
                    await node.allocate(resource, [ids])
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "nothing claimed" in refused.value.details()
        # Serving from the cache: the streams stay open, the devices stay listed and healthy,
        # and GetPreferredAllocation still answers (a few seconds of the outage, watched).
        with contextlib.suppress(TimeoutError):  # the change we watch for must not come
            await trio.to_thread.run_sync(
                node.kubelet.wait_for,
                lambda k: len(k.healthy(f"akri.sh/{inst}")) != 3 or k.streams_opened != streams,
                3.0,
            )
        assert node.kubelet.streams_opened == streams
        assert len(node.kubelet.healthy(f"akri.sh/{inst}")) == 3
        assert node.kubelet.healthy(config_res) == ["out-0"]
        chosen = await trio.to_thread.run_sync(node.kubelet.preferred, config_res, ["out-0"], 1)
        assert chosen == ["out-0"]
    finally:
        await trio.to_thread.run_sync(_cluster_up)
    # Recovery, same agent: the refused claim left nothing, a new claim holds.
    usage = (await akri.get(INSTANCES, inst, namespace=NS))["spec"]["deviceUsage"]
    assert usage == {f"{inst}-0": "node-a"}
    await node.allocate(f"akri.sh/{inst}", [[f"{inst}-1"]])
    usage = (await akri.get(INSTANCES, inst, namespace=NS))["spec"]["deviceUsage"]
    assert usage == {f"{inst}-0": "node-a", f"{inst}-1": "node-a"}
    # The watches resumed (within their capped backoff): a new Configuration gets served.
    await akri.create(CONFIGURATIONS, debug_echo_config("later", NS, ["c0"]))
    await trio.to_thread.run_sync(
        node.kubelet.wait_for, lambda k: len(k.healthy("akri.sh/later")) == 1, 60.0
    )
    assert all(node.kubelet.streams_opened[r] == n for r, n in streams.items())
