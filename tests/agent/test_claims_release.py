"""A configuration-level Allocate that fails half-way gives its claims back, shielded from the
cancellation that ended it but within RELEASE_BOUND_S, so a dead API server cannot stall a
shutdown. The API client is a stand-in; time is trio's MockClock (autojump)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx
import pytest
import trio
from trio.testing import MockClock

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.claims import RELEASE_BOUND_S, Claims
from akri_trio.agent.view import NodeView
from akri_trio.kube.client import JSON, Client
from tests.support.intercept import Intercepting, Send


def instance(name: str, rv: int = 1, usage: Mapping[str, str] | None = None) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
        "spec": {
            "configurationName": "cam",
            "cdiName": f"akri.sh/cam={name}",
            "capacity": 1,
            "nodes": ["n"],
            "deviceUsage": dict(usage or {}),
        },
    }


class Dying:
    """An `Intercepting` hook in place of an API server: answers the first deviceUsage write;
    after it the API server is gone: every request hangs (a connection that never answers)."""

    def __init__(self) -> None:
        self.writes = 0

    async def __call__(self, request: httpx.Request, send: Send) -> httpx.Response:
        if request.method == "PATCH" and self.writes == 0:
            self.writes += 1
            name = request.url.path.rsplit("/", 1)[1]
            usage = json.loads(request.content)["spec"]["deviceUsage"]  # the merge patch
            claimed = {key: value for key, value in usage.items() if value is not None}
            return httpx.Response(200, json=instance(name, 2, claimed))
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_cancelled_allocate_releases_within_the_bound(autojump_clock: MockClock) -> None:
    view = NodeView("n")
    for name in ("cam-a", "cam-b"):
        view.put_instance(instance(name))
    nowhere = Client(httpx.AsyncClient(base_url="https://api.invalid"))  # never sent to
    claims = Claims(Intercepting(nowhere, Dying()).client, view)
    keys = [ObjectKey("ns", "cam-a"), ObjectKey("ns", "cam-b")]
    with trio.move_on_after(1) as caller:  # the kubelet (or a shutdown) gives up after 1 s
        await claims.claim_vdevs("cam", keys, [["cam-0", "cam-1"]])
    assert caller.cancelled_caught
    # The first write landed, the second hung; the release of the first hung too, and was cut
    # off at the bound instead of holding the cancelled caller forever.
    assert trio.current_time() == pytest.approx(1 + RELEASE_BOUND_S)
