"""A claim that loses its race on the real API server: the resourceVersion its merge patch
names refuses it (409), and the node decides again on the version that won — at once when that
write changed other fields, after a pause and a fresh read when another node's claim won, and
with SlotTaken when that claim took the very slot."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.plugins.slots import SlotTaken
from akri_trio.agent.view import NodeView
from akri_trio.kube.client import Client
from akri_trio.kube.config import load_config
from akri_trio.model.naming import slot_id
from akri_trio.model.resources import INSTANCES
from tests.support.akri_cluster import ensure_namespace, install_crds, purge_namespace

NS = "claim-races"
NAME = "race-cam"
KEY = ObjectKey(NS, NAME)
S0, S1 = slot_id(NAME, 0), slot_id(NAME, 1)

Write = Callable[[Client], Awaitable[Any]]


class Racer:
    """Sends `write` on its own connection just before the node's first deviceUsage PATCH goes
    out, so that PATCH tests a version that is no longer current. Counts the node's requests on
    the Instance as (verb, status)."""

    def __init__(self, node_api: Client, other: Client) -> None:
        self.other = other
        self.write: Write | None = None
        self.seen: Counter[tuple[str, int]] = Counter()
        node_api.http.event_hooks["request"].append(self._before)
        node_api.http.event_hooks["response"].append(self._after)

    async def _before(self, request: httpx.Request) -> None:
        if request.method == "PATCH" and self.write is not None:
            write, self.write = self.write, None
            await write(self.other)

    async def _after(self, response: httpx.Response) -> None:
        if response.request.url.path.endswith(f"/instances/{NAME}"):
            self.seen[(response.request.method, response.status_code)] += 1


@pytest.fixture
async def racer(cluster: dict[str, str]) -> AsyncIterator[tuple[Claims, Racer]]:
    config = load_config(cluster["KUBECONFIG"])
    async with Client.open(config) as node_api, Client.open(config) as other:
        await install_crds(other)
        await ensure_namespace(other, NS)
        await purge_namespace(other, NS)
        body = {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {
                "configurationName": "race",
                "cdiName": f"akri.sh/race={NAME}",
                "capacity": 2,
                "nodes": ["node-a", "node-b"],
                "shared": True,
            },
        }
        view = NodeView("node-a")
        view.put_instance(await other.apply(INSTANCES, body, field_manager="test", force=True))
        yield Claims(node_api, view), Racer(node_api, other)
        await purge_namespace(other, NS)


def _json_patch(*ops: dict[str, Any]) -> Write:
    async def write(api: Client) -> Any:
        return await api.json_patch(INSTANCES, NAME, list(ops), namespace=NS)

    return write


async def _usage(api: Client) -> dict[str, str]:
    obj = await api.get(INSTANCES, NAME, namespace=NS)
    return dict(obj["spec"].get("deviceUsage") or {})


async def test_a_race_lost_to_other_fields_is_retried_at_once(
    racer: tuple[Claims, Racer],
) -> None:
    claims, race = racer
    race.write = _json_patch({"op": "add", "path": "/metadata/labels", "value": {"x": "y"}})
    await claims.claim_slots(KEY, [S0])
    assert await _usage(race.other) == {S0: "node-a"}
    assert race.seen == {("PATCH", 409): 1, ("GET", 200): 1, ("PATCH", 200): 1}


async def test_a_race_lost_to_another_nodes_claim_is_retried_after_a_fresh_read(
    racer: tuple[Claims, Racer],
) -> None:
    claims, race = racer
    race.write = _json_patch(
        {"op": "add", "path": "/spec/deviceUsage", "value": {S1: "node-b"}},
    )
    await claims.claim_slots(KEY, [S0])
    assert await _usage(race.other) == {S0: "node-a", S1: "node-b"}
    # the read that showed the other claim, the pause, the read it decides on
    assert race.seen == {("PATCH", 409): 1, ("GET", 200): 2, ("PATCH", 200): 1}


async def test_a_race_lost_to_a_claim_of_the_same_slot_ends_in_slot_taken(
    racer: tuple[Claims, Racer],
) -> None:
    claims, race = racer
    race.write = _json_patch(
        {"op": "add", "path": "/spec/deviceUsage", "value": {S0: "node-b"}},
    )
    with pytest.raises(SlotTaken):
        await claims.claim_slots(KEY, [S0])
    assert await _usage(race.other) == {S0: "node-b"}
    assert race.seen[("PATCH", 200)] == 0
