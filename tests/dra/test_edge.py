"""The pool writer against the real API server, on one that keeps device taints and on one that
drops them as 1.34/1.35 without DRADeviceTaints do (the same server, behind a transport that
strips `taints` from every slice written): the probe tells the two apart, and on the second
the writer neither taints a device in its grace nor keeps writing the pool because what the
server stored is not what it wrote. Writes are counted, not timed."""

from __future__ import annotations

import functools
import json
import secrets

import httpx
import pytest
import trio

from akri_trio import dra
from akri_trio.dra.edge import PoolWriter, probe_device_taints, slice_store
from akri_trio.kube import Client, reflect
from tests.dra.support import instance
from tests.support.intercept import Intercepting, Send
from tests.support.releases import lacks

ROUNDS = 20  # reconciles of the pool in its grace, each after the cache showed the last write


async def without_taints(request: httpx.Request, send: Send) -> httpx.Response:
    """Send a ResourceSlice written (or dry-run) with its devices' taints left out."""
    if request.method in ("POST", "PATCH") and "/resourceslices" in request.url.path:
        body = json.loads(request.content)
        for device in (body.get("spec") or {}).get("devices") or []:
            device.pop("taints", None)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        request = httpx.Request(
            request.method,
            request.url,
            headers=headers,
            content=json.dumps(body).encode(),
            extensions=request.extensions,
        )
    return await send(request)


async def test_the_probe_finds_device_taints_where_the_release_keeps_them(
    api: Client, cluster: dict[str, str]
) -> None:
    assert await probe_device_taints(api) is (lacks(cluster, "DRADeviceTaints") is None)
    assert await probe_device_taints(Intercepting(api, without_taints).client) is False


def _applies(seen: list[str]) -> int:
    return sum(1 for s in seen if s.startswith("PATCH ") and "/resourceslices/" in s)


@pytest.mark.parametrize("planned", [None, True], ids=["probed", "taint-planned"])
async def test_a_server_that_drops_taints_gets_no_write_loop_in_the_grace(
    api: Client, planned: bool | None
) -> None:
    """`probed`: the writer asks, learns the server drops taints, and writes nothing when the
    device vanishes (it stays, untainted). `taint-planned`: told the server keeps taints, the
    writer writes the tainted pool once; the server drops the taint, and the rounds after see
    the pool as the server stored it: no write."""
    node = f"dra-edge-node-{secrets.token_hex(3)}"
    pool = dra.node_pool(node, "ns")
    strip = Intercepting(api, without_taints)
    slices = slice_store()
    writer = PoolWriter(strip.client, slices, field_manager="akri-test", device_taints=planned)
    inst = instance(nodes=(node,))
    wanted = dra.Wanted(
        dra.pool_devices([inst], consumable=False),
        dra.node_placement(node),
        dra.pool_labels("node", "ns"),
    )
    watch = functools.partial(
        reflect, api, dra.RESOURCE_SLICES, slices, field_selector=f"spec.nodeName={node}"
    )
    async with trio.open_nursery() as nursery:
        try:
            nursery.start_soon(watch)
            await slices.wait_synced()
            await writer.publish(pool, wanted)
            assert _applies(strip.seen) == 1
            for _ in range(ROUNDS):
                assert await writer.publish(pool, None) is not None  # the grace's deadline
            stored = [d for s in slices.snapshot().values() for d in s["spec"]["devices"]]
            assert stored and all("taints" not in d for d in stored)
            assert writer.device_taints is (planned is True)
            # one write each (publish waits for the cache to show it); one more if it lagged
            assert _applies(strip.seen) <= (2 if planned is None else 3)
        finally:
            nursery.cancel_scope.cancel()
            with trio.move_on_after(10, shield=True):
                answer = await api.list(dra.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
                for s in answer.items:
                    await api.delete(dra.RESOURCE_SLICES, s["metadata"]["name"])
