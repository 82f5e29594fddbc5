"""One agent at a time serves DRA on a node: a second one waits for the first one's lock (and
gets it once the first lets go), instead of taking the kubelet sockets and the checkpoint over."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from akri_trio.agent.dra.node import LOCK_POLL_S, node_lock


async def test_a_second_holder_waits_until_the_first_lets_go(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    path = tmp_path / "plugins" / "akri.sh" / "agent.lock"
    second_has_it = trio.Event()

    async def second() -> None:
        async with node_lock(path):
            second_has_it.set()

    async with trio.open_nursery() as nursery:
        async with node_lock(path):
            nursery.start_soon(second)
            await trio.sleep(60)
            assert not second_has_it.is_set()
        released = trio.current_time()
        await second_has_it.wait()
        assert trio.current_time() - released <= LOCK_POLL_S
