"""The intercepting transport the cluster tests step in with: what it records, what its hook
can do, and that watches pass it by. The server behind it is an in-memory httpx transport."""

from __future__ import annotations

import httpx
import pytest

from akri_trio.kube.client import Client
from akri_trio.kube.errors import NotFound
from akri_trio.model.resources import CONFIGURATIONS
from tests.support.intercept import Intercepting, Send


def _server(request: httpx.Request) -> httpx.Response:
    if request.url.params.get("watch") == "true":
        return httpx.Response(200, content=b"")
    return httpx.Response(200, json={"kind": "Configuration", "metadata": {"name": "served"}})


def _real() -> Client:
    return Client(
        httpx.AsyncClient(base_url="https://api.test", transport=httpx.MockTransport(_server))
    )


async def test_passes_requests_on_and_records_each_but_not_watches() -> None:
    seen = Intercepting(_real())
    got = await seen.client.get(CONFIGURATIONS, "a", namespace="ns")
    async with seen.client.watch_stream(
        CONFIGURATIONS, namespace="ns", resource_version="1"
    ) as events:
        assert [e async for e in events] == []
    assert got["metadata"]["name"] == "served"
    assert seen.seen == ["GET /apis/akri.sh/v0/namespaces/ns/configurations/a"]


async def test_a_hook_answers_in_place_of_the_server() -> None:
    async def not_found(request: httpx.Request, send: Send) -> httpx.Response:
        return httpx.Response(404, json={"kind": "Status", "reason": "NotFound", "code": 404})

    with pytest.raises(NotFound):
        await Intercepting(_real(), not_found).client.get(CONFIGURATIONS, "a", namespace="ns")
