"""The node-pool publisher without a usable API server: it waits for its first list of the
node's slices as long as it takes (the watch retries; under the autojump clock, the silent
server a real TCP listener) instead of giving up, and it decodes each Instance version once."""

from __future__ import annotations

from typing import Any

import httpx
import trio
import trio.testing

from akri_trio.agent.dra.publisher import SYNC_WARN_S, NodePoolPublisher
from akri_trio.kube import Apply, Client, Init, InitApply, InitDone, Store
from akri_trio.model.convert import unstructure
from tests.dra.support import instance
from tests.support.silent_server import silent_api_server


async def test_a_slow_api_server_at_start_is_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with silent_api_server() as http, trio.open_nursery() as nursery:
        publisher = NodePoolPublisher(Client(http), Store(), "n1", namespace=None, consumable=True)
        nursery.start_soon(publisher.run)
        await trio.sleep(10 * SYNC_WARN_S)  # with a deadline it would have crashed
        assert publisher.rounds == 0
        nursery.cancel_scope.cancel()


def _obj(version: str, description: str) -> dict[str, Any]:
    obj: dict[str, Any] = unstructure(
        instance("cam-abc123", properties={"DESCRIPTION": description})
    )
    obj["metadata"]["resourceVersion"] = version
    return obj


async def test_each_instance_version_is_decoded_once() -> None:
    instances = Store()
    instances.apply(Init())
    instances.apply(InitApply(_obj("1", "a")))
    instances.apply(InitApply({"metadata": {"name": "bad", "namespace": "ns"}, "spec": 7}))
    instances.apply(InitDone())
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:  # never called
        publisher = NodePoolPublisher(
            Client(http), instances, "n1", namespace=None, consumable=True
        )
        (first,) = publisher._instances()  # the bad one is left out
        (again,) = publisher._instances()
        assert again is first
        instances.apply(Apply(_obj("2", "b")))
        (changed,) = publisher._instances()
        assert changed.spec.broker_properties == {"DESCRIPTION": "b"}
