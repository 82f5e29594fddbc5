"""The dashboard without a cluster: the messages (`feed`), the routing, and the server
answering the page and a websocket from one port, sending a snapshot then only changes."""

from __future__ import annotations

import functools
import json
from typing import Any

import httpx
import trio
import trio_websocket
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.observe import feed
from akri_trio.observe.dashboard import PAGE, Hub, _connection, route
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


def test_route() -> None:
    ws = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: WebSocket\r\nConnection: Upgrade"
    assert route(ws).websocket
    assert route(b"GET / HTTP/1.1\r\nHost: x").body == PAGE
    assert route(b"GET /?x=1 HTTP/1.1\r\nHost: x").status == 200
    assert route(b"GET /ws HTTP/1.1\r\nHost: x").status == 400
    assert route(b"POST / HTTP/1.1\r\nHost: x").status == 405
    assert route(b"GET /metrics HTTP/1.1").status == 404
    assert route(b"garbage").status == 400


def test_page_is_self_contained() -> None:
    text = PAGE.decode()
    assert "<script" in text and "src=" not in text and "http://" not in text
    assert "https://" not in text and "innerHTML" not in text


async def test_page_and_websocket_from_one_port() -> None:
    pic = picture([CONFIG], [inst("a")], nodes=[NODE])
    hub = Hub(pic)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, functools.partial(_connection, hub=hub), 0),
        )
        port = listeners[0].socket.getsockname()[1]
        async with httpx.AsyncClient() as client:
            page = await client.get(f"http://127.0.0.1:{port}/")
            assert page.status_code == 200 and page.content == PAGE
            assert page.headers["content-type"].startswith("text/html")
            assert (await client.get(f"http://127.0.0.1:{port}/nope")).status_code == 404
        with trio.fail_after(5):
            async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
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

            async def serve(task_status: trio.TaskStatus[Any]) -> None:
                with server:
                    handler = functools.partial(_connection, hub=hub)
                    await trio.serve_tcp(handler, 0, task_status=task_status)

            listeners = await outer.start(serve)
            port = listeners[0].socket.getsockname()[1]
            async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
                await ws.get_message()
                server.cancel()
                try:
                    await ws.get_message()
                except trio_websocket.ConnectionClosed:
                    pass
                else:
                    raise AssertionError("the connection outlived the server")
