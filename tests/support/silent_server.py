"""An API server that accepts connections and never answers (a real TCP listener), for tests
of what a component does while the API server is too slow, under the autojump clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import trio


async def _hold_connections(listener: trio.SocketListener) -> None:
    async with trio.open_nursery() as nursery:
        while True:
            stream = await listener.accept()
            nursery.start_soon(_never_answer, stream)


async def _never_answer(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep_forever()


@asynccontextmanager
async def silent_api_server() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client (no timeout of its own) of a server that never answers."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold_connections, listener)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=3600) as http:
            yield http
        nursery.cancel_scope.cancel()
