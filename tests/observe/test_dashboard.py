"""The dashboard without a cluster: the messages (`feed`), the routing, and the server
answering the page and a websocket from one port, sending a snapshot then only changes."""

from __future__ import annotations

import functools
import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
import trio
import trio_websocket
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.observe import feed
from akri_trio.observe.dashboard import PAGE, Hub, _connection, route, served_hosts
from akri_trio.observe.picture import picture


def inst(name: str, usage: dict[str, str] | None = None, ns: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "configurationName": "cams",
            "capacity": 2,
            "nodes": ["n1"],
            "deviceUsage": usage or {f"{name}-0": "", f"{name}-1": ""},
        },
    }


CONFIG = {"metadata": {"namespace": "ns", "name": "cams"}, "spec": {"capacity": 2}}
NODE = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_diff_is_none_when_nothing_changed() -> None:
    pic = picture([CONFIG], [inst("a")], nodes=[NODE])
    assert feed.diff(pic, picture([CONFIG], [inst("a")], nodes=[NODE])) is None


def test_diff_carries_only_what_changed() -> None:
    old = picture([CONFIG], [inst("a"), inst("b")], nodes=[NODE])
    new = picture([CONFIG], [inst("a", {"a-0": "n1", "a-1": ""}), inst("c")], nodes=[NODE])
    change = feed.diff(old, new)
    assert change is not None
    assert [i["name"] for i in change["put"]["instances"]] == ["a", "c"]
    assert change["drop"] == {"instances": ["ns/b"]}
    assert "nodes" not in change["put"]
    assert [c["instances"] for c in change["put"]["configurations"]] == [["a", "c"]]
    assert feed.apply(old, change) == new
    assert json.loads(json.dumps(change)) == change


names = st.lists(st.sampled_from("abcdef"), unique=True, max_size=5)
usages = st.sampled_from(["", "n1", "n2"])


@st.composite
def pictures(draw: st.DrawFn) -> dict[str, Any]:
    instances = [
        inst(n, {f"{n}-0": draw(usages), f"{n}-1": draw(usages)}, ns=draw(st.sampled_from("xy")))
        for n in draw(names)
    ]
    nodes = [{"metadata": {"name": n}} for n in draw(st.lists(st.sampled_from("pq"), unique=True))]
    return picture([CONFIG] if draw(st.booleans()) else [], instances, nodes=nodes)


@given(pictures(), pictures())
def test_apply_of_diff_reaches_the_new_picture(old: dict[str, Any], new: dict[str, Any]) -> None:
    change = feed.diff(old, new)
    assert (change is None) == (old == new)
    assert feed.apply(old, change or {"type": "change"}) == new
    assert feed.apply(old, feed.snapshot(new)) == new


HOSTS = served_hosts("127.0.0.1", 8090)


async def serve(nursery: trio.Nursery, hub: Hub, *, scope: trio.CancelScope | None = None) -> int:
    """The dashboard's connections on 127.0.0.1 (in `scope`); the port."""
    hosts: set[str] = set()  # filled once the port is known; read per request

    async def run(task_status: trio.TaskStatus[Any]) -> None:
        with scope or trio.CancelScope():
            handler = functools.partial(_connection, hub=hub, hosts=hosts)
            await trio.serve_tcp(handler, 0, host="127.0.0.1", task_status=task_status)

    listeners = await nursery.start(run)
    port: int = listeners[0].socket.getsockname()[1]
    hosts.update(served_hosts("127.0.0.1", port))
    return port


def same_origin_websocket(
    port: int, origin: str | None = None, host: str | None = None
) -> AbstractAsyncContextManager[trio_websocket.WebSocketConnection]:
    """A websocket to the dashboard, sent with an Origin (by default the page's own)."""
    headers = [(b"Origin", (origin or f"http://127.0.0.1:{port}").encode())]
    if host is not None:
        headers.append((b"Host", host.encode()))
    return trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}/ws", extra_headers=headers)


def test_route() -> None:
    ws = b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:8090\r\nUpgrade: WebSocket\r\nConnection: Upgrade"
    assert route(ws + b"\r\nOrigin: http://127.0.0.1:8090", HOSTS).websocket
    assert route(b"GET / HTTP/1.1\r\nHost: localhost:8090", HOSTS).body == PAGE
    assert route(b"GET /?x=1 HTTP/1.1\r\nHost: [::1]:8090", HOSTS).status == 200
    assert route(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:8090", HOSTS).status == 400
    assert route(b"POST / HTTP/1.1\r\nHost: 127.0.0.1:8090", HOSTS).status == 405
    assert route(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8090", HOSTS).status == 404
    assert route(b"garbage", HOSTS).status == 400


def test_served_hosts() -> None:
    assert {"127.0.0.1:8090", "localhost:8090", "[::1]:8090"} == HOSTS
    assert served_hosts("0.0.0.0", 8090) == HOSTS
    assert "[fd00::1]:7" in served_hosts("fd00::1", 7)
    assert {"10.0.0.5:80", "10.0.0.5", "localhost"} <= served_hosts("10.0.0.5", 80)
    assert "dash.example:443" in served_hosts("127.0.0.1", 8090, ["Dash.Example:443"])


def test_a_foreign_host_or_origin_is_refused() -> None:
    page = b"GET / HTTP/1.1\r\nHost: "
    ws = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nHost: 127.0.0.1:8090"
    refused = [
        page + b"evil.example:8090",  # DNS rebinding: the attacker's name, our address
        page + b"127.0.0.1:9999",
        b"GET / HTTP/1.1",  # no Host at all
        page + b"127.0.0.1:8090\r\nOrigin: http://evil.example",
        ws,  # a websocket without an Origin
        ws + b"\r\nOrigin: http://evil.example",
        ws + b"\r\nOrigin: http://localhost:8090",  # another name than the Host: cross-origin
        ws + b"\r\nOrigin: null",
    ]
    for head in refused:
        assert route(head, HOSTS).status == 403, head


def test_page_is_self_contained() -> None:
    text = PAGE.decode()
    assert "<script" in text and "src=" not in text and "http://" not in text
    assert "https://" not in text and "innerHTML" not in text


async def test_page_and_websocket_from_one_port() -> None:
    pic = picture([CONFIG], [inst("a")], nodes=[NODE])
    hub = Hub(pic)
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, hub)
        async with httpx.AsyncClient() as client:
            page = await client.get(f"http://127.0.0.1:{port}/")
            assert page.status_code == 200 and page.content == PAGE
            assert page.headers["content-type"].startswith("text/html")
            assert (await client.get(f"http://127.0.0.1:{port}/nope")).status_code == 404
        with trio.fail_after(5):
            async with same_origin_websocket(port) as ws:
                first = json.loads(await ws.get_message())
                assert first == {"type": "snapshot", "picture": pic}
                new = picture([CONFIG], [inst("a", {"a-0": "", "a-1": "n1"})], nodes=[NODE])
                hub.publish(new)
                change = json.loads(await ws.get_message())
                assert change["type"] == "change"
                assert feed.apply(pic, change) == new
        nursery.cancel_scope.cancel()


async def test_shutdown_closes_connected_clients() -> None:
    hub = Hub(picture([], []))
    with trio.fail_after(5):
        async with trio.open_nursery() as outer:
            server = trio.CancelScope()

            port = await serve(outer, hub, scope=server)
            async with same_origin_websocket(port) as ws:
                await ws.get_message()
                server.cancel()
                try:
                    await ws.get_message()
                except trio_websocket.ConnectionClosed:
                    pass
                else:
                    raise AssertionError("the connection outlived the server")


async def test_a_foreign_origin_or_host_is_refused_by_the_real_server() -> None:
    hub = Hub(picture([CONFIG], [inst("a")], nodes=[NODE]))
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, hub)
        with trio.fail_after(10):
            for origin in ("http://evil.example", f"http://127.0.0.1:{port + 1}"):
                with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                    async with same_origin_websocket(port, origin=origin):
                        pass
                assert rejected.value.status_code == 403
            async with httpx.AsyncClient() as client:
                rebound = await client.get(
                    f"http://127.0.0.1:{port}/", headers={"Host": f"evil.example:{port}"}
                )
                assert (rebound.status_code, rebound.content) == (
                    403,
                    b"unknown Host: this dashboard answers only the names it serves\n",
                )
                page = await client.get(
                    f"http://127.0.0.1:{port}/", headers={"Host": f"localhost:{port}"}
                )
                assert page.status_code == 200 and page.content == PAGE
            async with same_origin_websocket(port) as ws:
                assert json.loads(await ws.get_message())["type"] == "snapshot"
        nursery.cancel_scope.cancel()
