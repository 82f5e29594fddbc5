"""An HTTPS proxy in front of the API server that shows a process one namespace and gives its
debugEcho Configurations a name nobody else's agent answers to.

Why. `bench.upstream` runs upstream's Rust agent and controller on the local cluster's node 1,
which other sessions' tests share. Upstream's processes watch every namespace and take no flag
to narrow that: left alone, its agent would put its finalizer on every Configuration of the
cluster and serve device plugins for other tests' Instances on node 1, and its controller would
act on their broker Pods. And every test agent with an embedded debugEcho watches every
namespace too, so a bench Configuration naming `debugEcho` would get their Instances as well.
So both implementations' processes talk to the API server through this proxy, alike:
- a cluster-wide LIST or WATCH of Configurations, Instances, Pods, Services or Jobs is sent as
  the same request on one namespace (what `Api::all` would see if the cluster held only it);
- a Configuration is stored naming the handler `benchEcho` and shown to the proxied process as
  `debugEcho` (the two names have one length, so bodies and their lengths are rewritten in
  place, in both directions), so the agents' embedded debugEcho handlers serve it and no other
  agent on the cluster does;
- `Accept-Encoding` is dropped, so no response is compressed past that rewrite.
Both sides speak HTTP/1.1 over TLS: the proxy serves the API server's own certificate (so the
kubeconfig's CA still verifies it) and connects to the API server with the same token the
client sent. The hop costs each request about the same for both implementations; the bench
says so next to its numbers.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import trio

STORED, SHOWN = b'"benchEcho"', b'"debugEcho"'
assert len(STORED) == len(SHOWN)
# Cluster-wide collections (list and watch paths) that are pinned to the namespace.
PINNED = (
    b"/apis/akri.sh/v0/configurations",
    b"/apis/akri.sh/v0/instances",
    b"/api/v1/pods",
    b"/api/v1/services",
    b"/apis/batch/v1/jobs",
)
MAX_HEAD = 64 * 1024
# How a proxied connection ends: either side closed, or a request this proxy does not take.
ENDED = (trio.BrokenResourceError, trio.ClosedResourceError, ValueError)


def pin(target: bytes, namespace: bytes) -> bytes:
    """`target` with a cluster-wide collection path moved into `namespace`."""
    path, sep, query = target.partition(b"?")
    for collection in PINNED:
        if path == collection:
            group, _, plural = collection.rpartition(b"/")
            return group + b"/namespaces/" + namespace + b"/" + plural + sep + query
    return target


def rewrite_head(head: bytes, namespace: bytes) -> tuple[bytes, int]:
    """(the request head to send on, its body's length). Chunked bodies are not expected
    from the clients proxied (both send a Content-Length) and are refused."""
    first, *lines = head.split(b"\r\n")
    method, target, version = first.split(b" ", 2)
    kept, length = [], 0
    for line in lines:
        name = line.split(b":", 1)[0].strip().lower()
        if name == b"accept-encoding":
            continue
        if name == b"transfer-encoding":
            raise ValueError("chunked request bodies are not proxied")
        if name == b"content-length":
            length = int(line.split(b":", 1)[1])
        kept.append(line)
    return b"\r\n".join([b" ".join([method, pin(target, namespace), version]), *kept]), length


class Renamer:
    """Replaces `old` by `new` (same length) in a byte stream cut anywhere: a tail that may be
    the start of `old` waits for the next piece (an event's end, `}\\n\\r\\n`, never does)."""

    def __init__(self, old: bytes, new: bytes) -> None:
        self.old, self.new, self.carry = old, new, b""

    def feed(self, data: bytes) -> bytes:
        data = (self.carry + data).replace(self.old, self.new)
        keep = 0
        for k in range(min(len(self.old) - 1, len(data)), 0, -1):
            if data.endswith(self.old[:k]):
                keep = k
                break
        self.carry = data[len(data) - keep :]
        return data[: len(data) - keep]


async def _requests(client: trio.abc.Stream, server: trio.abc.Stream, namespace: bytes) -> None:
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            data = await client.receive_some(65536)
            if not data:
                return
            buf += data
            if len(buf) > MAX_HEAD and b"\r\n\r\n" not in buf:
                raise ValueError("request head too long")
        head, buf = buf.split(b"\r\n\r\n", 1)
        head, length = rewrite_head(head, namespace)
        while len(buf) < length:
            data = await client.receive_some(65536)
            if not data:
                return
            buf += data
        body, buf = buf[:length], buf[length:]
        await server.send_all(head + b"\r\n\r\n" + body.replace(SHOWN, STORED))


async def _responses(server: trio.abc.Stream, client: trio.abc.Stream) -> None:
    renamer = Renamer(STORED, SHOWN)
    while data := await server.receive_some(65536):
        await client.send_all(renamer.feed(bytes(data)))


async def _one_connection(
    client: trio.abc.Stream, host: str, port: int, upstream_tls: ssl.SSLContext, namespace: bytes
) -> None:
    try:
        server = await trio.open_ssl_over_tcp_stream(
            host, port, ssl_context=upstream_tls, https_compatible=True
        )
    except OSError:
        await trio.aclose_forcefully(client)
        return
    async with client, server, trio.open_nursery() as nursery:

        async def requests() -> None:
            with suppress(*ENDED):
                await _requests(client, server, namespace)
            nursery.cancel_scope.cancel()

        async def responses() -> None:
            with suppress(*ENDED):
                await _responses(server, client)
            nursery.cancel_scope.cancel()

        nursery.start_soon(requests)
        nursery.start_soon(responses)


@asynccontextmanager
async def namespace_proxy(apiserver: str, pki: Path, namespace: str) -> AsyncIterator[str]:
    """Serve the proxy on a free loopback port for the block; yields its `https://` URL.
    `apiserver` is `https://host:port`; `pki` holds the cluster's ca.crt, apiserver.crt/key."""
    host, port = apiserver.removeprefix("https://").rsplit(":", 1)
    upstream_tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    upstream_tls.set_alpn_protocols(["http/1.1"])
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(pki / "apiserver.crt", pki / "apiserver.key")
    serving.set_alpn_protocols(["http/1.1"])
    listeners = await trio.open_ssl_over_tcp_listeners(
        0, serving, host="127.0.0.1", https_compatible=True
    )
    own_port = listeners[0].transport_listener.socket.getsockname()[1]  # type: ignore[attr-defined]

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        await _one_connection(stream, host, int(port), upstream_tls, namespace.encode())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        try:
            yield f"https://127.0.0.1:{own_port}"
        finally:
            nursery.cancel_scope.cancel()
