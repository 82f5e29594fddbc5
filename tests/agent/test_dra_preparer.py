"""A prepare call is bounded in time: against an API server that never answers, every claim of
the call is answered "timed out" after PREPARE_TIMEOUT_S (the kubelet then asks again), and
nothing is written. Under the autojump clock; the silent server is a real TCP listener."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio
import trio.testing

from akri_trio.agent.dra.preparer import PREPARE_TIMEOUT_S, ClaimRef, Preparer
from akri_trio.agent.view import NodeView
from akri_trio.kube import Client


async def _hold_connections(listener: trio.SocketListener) -> None:
    async with trio.open_nursery() as nursery:
        while True:
            stream = await listener.accept()
            nursery.start_soon(_never_answer, stream)


async def _never_answer(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep_forever()


async def test_a_silent_api_server_times_the_call_out(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold_connections, listener)
        http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=3600)
        async with http:
            preparer = Preparer(
                Client(http),
                NodeView("n1"),
                cdi_dir=tmp_path / "cdi",
                state_dir=tmp_path / "state",
                consumable=True,
            )
            preparer.load()
            refs = [ClaimRef("ns", "uid-1", "c1"), ClaimRef("ns", "uid-2", "c2")]
            started = trio.current_time()
            answers = await preparer.prepare(refs)
            assert trio.current_time() - started == PREPARE_TIMEOUT_S
        nursery.cancel_scope.cancel()
    assert answers == {
        "uid-1": "prepare ns/c1: timed out",
        "uid-2": "prepare ns/c2: timed out",
    }
    assert not list((tmp_path / "cdi").iterdir())
    assert preparer.prepared == {}
