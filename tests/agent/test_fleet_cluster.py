"""Many nodes on one shared Instance, against the real API server, counted by the API server.

Isolated from other tests and sessions on a shared cluster: the agents watch only this
module's namespace and run the debugEcho handler under their own name (`fleetEcho`), so other
agents have no handler for these Configurations, and the fixtures purge this namespace only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.kube.client import PATCH_APPLY, Client
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.akri_cluster import ensure_namespace, install_crds, purge_namespace
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api

NS = "fleet-tests"
HANDLER = "fleetEcho"
FLEET = 8


def _config(name: str, descriptions: list[str], capacity: int) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "discoveryHandler": {
                "name": HANDLER,
                "discoveryDetails": yaml.safe_dump({"descriptions": descriptions}),
            },
            "capacity": capacity,
            "brokerProperties": {},
        },
    }


class Node:
    """One agent (scoped to NS) plus its kubelet stand-in, in a directory of its own."""

    def __init__(self, name: str, root: Path, availability: Path) -> None:
        self.name = name
        self.kubelet = KubeletStandin(root / name / "device-plugins").start()
        echo = DebugEcho(
            name=HANDLER, shared=True, availability_path=availability, poll_interval=0.1
        )
        self.settings = AgentSettings(
            node=name,
            namespace=NS,
            handlers=(echo,),
            discovery_handlers_directory=root / name / "akri",
            device_plugin_dir=root / name / "device-plugins",
            pod_resources_socket=root / name / "pod-resources.sock",
            metrics_port=None,
        )

    async def run(self, api: Client, *, task_status: trio.TaskStatus[Agent]) -> None:
        await run_agent(self.settings, api=api, task_status=task_status)

    async def wait(self, predicate: Callable[[KubeletStandin], bool]) -> None:
        await trio.to_thread.run_sync(self.kubelet.wait_for, predicate, 20.0)

    async def allocate(self, resource: str, requests: list[list[str]]) -> Any:
        return await trio.to_thread.run_sync(self.kubelet.allocate, resource, requests)


@pytest.fixture
async def fleet_namespace(api: Client) -> AsyncIterator[str]:
    """CRDs installed and NS empty, before and after the test."""
    await install_crds(api)
    await ensure_namespace(api, NS)
    await purge_namespace(api, NS)
    yield NS
    await purge_namespace(api, NS)


@pytest.fixture
async def fleet(api: Client, fleet_namespace: str, short_tmp: Path) -> AsyncIterator[Any]:
    """`await fleet(n)` starts n agents sharing one availability file (`fleet.availability`)."""
    availability = short_tmp / "availability"
    availability.write_text("")
    started: list[Node] = []
    async with trio.open_nursery() as nursery:

        async def start(n: int) -> list[Node]:
            for i in range(n):
                node = Node(f"fleet-{i}", short_tmp, availability)
                await nursery.start(node.run, api)
                started.append(node)
            return started

        start.availability = availability  # type: ignore[attr-defined]
        try:
            yield start
        finally:
            nursery.cancel_scope.cancel()
            for node in started:
                node.kubelet.stop()


async def _instances(api: Client) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in (await api.list(INSTANCES, namespace=NS)).items}


class Requests:
    """Every request our agents (and this test) make on Instances, as (verb, code), counted on
    the shared client: exact even while other sessions write Instances of their own. Also the
    most writes each field manager (a node) had in flight at once."""

    def __init__(self, api: Client) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.most_in_flight: Counter[str] = Counter()
        api.http.event_hooks["request"].append(self._sent)
        api.http.event_hooks["response"].append(self._record)

    @staticmethod
    def _write(request: httpx.Request) -> bool:
        return f"/namespaces/{NS}/instances" in request.url.path and request.method != "GET"

    async def _sent(self, request: httpx.Request) -> None:
        if self._write(request) and (manager := request.url.params.get("fieldManager")):
            self.in_flight[manager] += 1
            self.most_in_flight[manager] = max(
                self.most_in_flight[manager], self.in_flight[manager]
            )

    async def _record(self, response: httpx.Response) -> None:
        request = response.request
        if not self._write(request):
            return
        if manager := request.url.params.get("fieldManager"):
            self.in_flight[manager] -= 1
        if response.status_code == 429:
            # refused unread while its storage re-initialises (another session re-applied
            # the CRD): retried, and not what these tests count
            return
        verb = request.method
        if request.headers.get("content-type") == PATCH_APPLY:
            verb = "APPLY"
        self.counts[(verb, str(response.status_code))] += 1

    def since(self, before: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
        return self.counts - before


async def test_many_nodes_join_and_leave_shared_instances_at_once_one_write_each(
    api: Client, fleet: Any
) -> None:
    """Every node joins each shared Instance with one apply and no conflict; when the device
    goes away from all of them at once each leaves with one apply, the node whose leave
    empties an Instance deletes it once, and nothing re-creates it: N + 1 writes each."""
    requests = Requests(api)
    await fleet(FLEET)
    before = requests.counts.copy()
    await api.create(CONFIGURATIONS, _config("fleet", ["f0", "f1"], FLEET))

    async def all_joined() -> bool:
        found = await _instances(api)
        return len(found) == 2 and all(len(o["spec"]["nodes"]) == FLEET for o in found.values())

    await until_api(all_joined, 60)
    joined = requests.since(before)
    # each node wrote the two shared Instances one at a time
    assert {requests.most_in_flight[f"fleet-{i}"] for i in range(FLEET)} == {1}
    assert joined == {("APPLY", "201"): 2, ("APPLY", "200"): 2 * FLEET - 2}, joined

    before = requests.counts.copy()
    fleet.availability.write_text("OFFLINE")

    async def all_gone() -> bool:
        return not await _instances(api)

    await until_api(all_gone, 60)
    await trio.sleep(1)  # a late write would still be counted
    left = requests.since(before)
    assert not any(code.startswith(("4", "5")) for _, code in left), left  # nothing refused
    assert left[("DELETE", "200")] == 2  # each Instance deleted once
    writes = sum(v for (verb, _), v in left.items() if verb in ("APPLY", "PATCH", "DELETE"))
    assert writes == 2 * (FLEET + 1), left  # a leave per node and Instance, a delete each
    await trio.sleep(2)
    assert not await _instances(api)  # nobody re-created them


async def test_claim_storm_on_one_shared_instance_grants_every_node(
    api: Client, fleet: Any
) -> None:
    """As many nodes as the capacity each ask their kubelet for one slot of the same Instance
    at the same moment: preferred allocation steers them to different slots, the races they
    lose on the one object are retried (not refused), and every claim is granted with one
    write that holds per node."""
    requests = Requests(api)
    nodes = await fleet(FLEET)
    await api.create(CONFIGURATIONS, _config("storm", ["s0"], FLEET))

    async def joined() -> list[Any]:
        found = list((await _instances(api)).values())
        return found if found and len(found[0]["spec"]["nodes"]) == FLEET else []

    (inst,) = await until_api(joined, 60)
    resource = f"akri.sh/{inst['metadata']['name']}"
    for node in nodes:
        await node.wait(lambda k: len(k.healthy(resource)) == FLEET)
        await node.wait(lambda k: resource in k.registrations)
    before = requests.counts.copy()
    granted: dict[str, str] = {}

    async def claim(node: Node) -> None:
        free = node.kubelet.healthy(resource)
        (slot,) = await trio.to_thread.run_sync(node.kubelet.preferred, resource, free, 1)
        await node.allocate(resource, [[slot]])
        granted[node.name] = slot

    async with trio.open_nursery() as storm:
        for node in nodes:
            storm.start_soon(claim, node)
    assert len(set(granted.values())) == FLEET  # every node, each its own slot
    usage = (await api.get(INSTANCES, inst["metadata"]["name"], namespace=NS))["spec"][
        "deviceUsage"
    ]
    assert usage == {slot: node for node, slot in granted.items()}
    storm_requests = requests.since(before)
    assert storm_requests[("PATCH", "200")] == FLEET, storm_requests
    assert set(storm_requests) <= {("PATCH", "200"), ("PATCH", "409")}, storm_requests
    assert not any(code.startswith("5") for _, code in storm_requests), storm_requests
