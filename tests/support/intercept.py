"""Stepping between a real kube `Client` and its API server: one wrapping httpx transport.

A test that must see, hold, fail or answer some of the requests a component sends gives the
component `Intercepting(real, hook).client`: the real client's server, credentials, TLS and
connection pool, with `hook` in front of every request. Watches pass straight through (they are
streams, not requests a test steps into), as they did when tests overrode `Client.request`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from akri_trio.kube.client import Client

Send = Callable[[httpx.Request], Awaitable[httpx.Response]]
# (the request, the way on to the real transport) -> the answer; may also hold or raise
Hook = Callable[[httpx.Request, Send], Awaitable[httpx.Response]]


async def passthrough(request: httpx.Request, send: Send) -> httpx.Response:
    return await send(request)


def is_watch(request: httpx.Request) -> bool:
    return bool(request.url.params.get("watch") == "true")


class Intercepting(httpx.AsyncBaseTransport):
    """`real`'s transport behind `hook`; `seen` lists every request but a watch as
    "METHOD path", in the order they were sent."""

    def __init__(self, real: Client, hook: Hook = passthrough) -> None:
        # httpx has no public accessor for a client's transport; sharing it shares the pool,
        # which `real` owns and closes (this wrapper closes nothing).
        self.real: httpx.AsyncBaseTransport = real.http._transport
        self.hook = hook
        self.seen: list[str] = []
        http = real.http
        self.client = Client(
            httpx.AsyncClient(
                base_url=http.base_url,
                auth=http.auth,
                headers=http.headers,
                timeout=http.timeout,
                trust_env=False,
                transport=self,
            ),
            default_namespace=real.default_namespace,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if is_watch(request):
            return await self.real.handle_async_request(request)
        self.seen.append(f"{request.method} {request.url.path}")
        return await self.hook(request, self.real.handle_async_request)
