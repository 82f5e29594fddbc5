"""The client, watch and store against the real kube-apiserver (the local cluster's).

Each test module run gets its own namespace (deleted at the end); the CRD `widgets.test.akri.sh`
is applied idempotently (server-side apply) so reruns and parallel sessions coexist.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio

from akri_trio.kube import (
    AlreadyExists,
    Apply,
    Backoff,
    Client,
    Conflict,
    Delete,
    Forbidden,
    Gone,
    Init,
    InitApply,
    InitDone,
    Invalid,
    NotFound,
    ObjectKey,
    Resource,
    Store,
    WatchEvent,
    load_config,
    open_watch,
    reflect,
    run_watch,
)
from akri_trio.kube.client import APISERVER_REQUEST_TIMEOUT_S
from tests.support.akri_cluster import CRDS, NAMESPACES, established
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s

T = TypeVar("T")

CONFIGMAPS = Resource.core("configmaps", "ConfigMap")
WIDGETS = Resource("test.akri.sh", "v1", "widgets", "Widget")

WIDGET_CRD: dict[str, Any] = {
    "metadata": {"name": "widgets.test.akri.sh"},
    "spec": {
        "group": "test.akri.sh",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 0}},
                            },
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Module fixtures live outside any test's trio run, so they get their own."""
    return trio.run(fn)


@pytest.fixture(scope="module")
def kubeconfig(cluster: dict[str, str]) -> Path:
    return Path(cluster["KUBECONFIG"])


@pytest.fixture(scope="module")
def namespace(kubeconfig: Path) -> Iterator[str]:
    name = f"kube-test-{secrets.token_hex(4)}"

    async def create() -> None:
        async with Client.open(load_config(kubeconfig)) as client:
            await client.create(NAMESPACES, {"metadata": {"name": name}})

    async def delete() -> None:
        async with Client.open(load_config(kubeconfig)) as client:
            await client.delete(NAMESPACES, name)

    run(create)
    yield name
    run(delete)


@pytest.fixture(scope="module")
def widgets_crd(kubeconfig: Path) -> str:
    """Apply the CRD and wait until it is Established and actually served."""

    async def ensure() -> None:
        async with Client.open(load_config(kubeconfig)) as client:
            await client.apply(CRDS, WIDGET_CRD, field_manager="akri-trio-tests", force=True)

            async def served() -> bool:
                if not await established(client, "widgets.test.akri.sh"):
                    return False
                try:
                    await client.list_page(WIDGETS, limit=1)
                except NotFound:  # discovery lags Established by a moment
                    return False
                return True

            await until_api(served, 30, "the widgets CRD served", poll=0.2)

    run(ensure)
    return "widgets.test.akri.sh"


@pytest.fixture
async def client(kubeconfig: Path) -> AsyncIterator[Client]:
    async with Client.open(load_config(kubeconfig)) as c:
        yield c


def cm(
    name: str, namespace: str, data: dict[str, str] | None = None, **labels: str
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "data": data or {}}


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


# --- CRUD and errors ------------------------------------------------------------------------


async def test_configmap_crud(client: Client, namespace: str) -> None:
    name = unique("crud")
    created = await client.create(CONFIGMAPS, cm(name, namespace, {"a": "1"}, app="crud"))
    assert created["metadata"]["uid"] and created["data"] == {"a": "1"}

    got = await client.get(CONFIGMAPS, name, namespace=namespace)
    assert got["metadata"]["uid"] == created["metadata"]["uid"]

    listed = await client.list(CONFIGMAPS, namespace=namespace, label_selector="app=crud")
    assert [o["metadata"]["name"] for o in listed.items] == [name]
    assert listed.items[0]["kind"] == "ConfigMap" and listed.resource_version

    got["data"]["b"] = "2"
    replaced = await client.replace(CONFIGMAPS, got)
    assert replaced["data"] == {"a": "1", "b": "2"}

    merged = await client.merge_patch(
        CONFIGMAPS, name, {"data": {"a": None, "c": "3"}}, namespace=namespace
    )
    assert merged["data"] == {"b": "2", "c": "3"}

    patched = await client.json_patch(
        CONFIGMAPS,
        name,
        [{"op": "replace", "path": "/data/b", "value": "20"}],
        namespace=namespace,
    )
    assert patched["data"] == {"b": "20", "c": "3"}

    with pytest.raises(Invalid):  # a failing `test` op
        await client.json_patch(
            CONFIGMAPS,
            name,
            [{"op": "test", "path": "/data/b", "value": "nope"}],
            namespace=namespace,
        )

    with pytest.raises(Conflict):  # uid precondition
        await client.delete(CONFIGMAPS, name, namespace=namespace, uid="not-the-uid")
    deleted = await client.delete(
        CONFIGMAPS, name, namespace=namespace, uid=created["metadata"]["uid"]
    )
    assert deleted.get("kind") in ("ConfigMap", "Status")
    with pytest.raises(NotFound):
        await client.get(CONFIGMAPS, name, namespace=namespace)


async def test_default_namespace_comes_from_the_object(client: Client, namespace: str) -> None:
    name = unique("ns")
    await client.create(CONFIGMAPS, cm(name, namespace))
    assert (await client.get(CONFIGMAPS, name, namespace=namespace))["metadata"]["name"] == name
    with pytest.raises(NotFound):  # the config's default namespace is "default"
        await client.get(CONFIGMAPS, name)


async def test_create_twice_is_already_exists(client: Client, namespace: str) -> None:
    name = unique("twice")
    await client.create(CONFIGMAPS, cm(name, namespace))
    with pytest.raises(AlreadyExists) as info:
        await client.create(CONFIGMAPS, cm(name, namespace))
    assert info.value.code == 409 and info.value.details["name"] == name


async def test_get_missing_is_not_found(client: Client, namespace: str) -> None:
    with pytest.raises(NotFound) as info:
        await client.get(CONFIGMAPS, "no-such-thing", namespace=namespace)
    assert info.value.reason == "NotFound"


async def test_replace_with_stale_resource_version_is_conflict(
    client: Client, namespace: str
) -> None:
    name = unique("stale")
    first = await client.create(CONFIGMAPS, cm(name, namespace, {"v": "1"}))
    await client.merge_patch(CONFIGMAPS, name, {"data": {"v": "2"}}, namespace=namespace)
    first["data"]["v"] = "3"
    with pytest.raises(Conflict) as info:
        await client.replace(CONFIGMAPS, first)  # carries the old resourceVersion
    assert info.value.reason == "Conflict"
    assert (await client.get(CONFIGMAPS, name, namespace=namespace))["data"] == {"v": "2"}


async def test_invalid_object_lists_its_causes(client: Client, namespace: str) -> None:
    with pytest.raises(Invalid) as info:
        await client.create(CONFIGMAPS, cm("Not_A_Valid_Name", namespace))
    assert any(c.get("field") == "metadata.name" for c in info.value.causes)


async def test_restricted_user_is_forbidden(cluster: dict[str, str], namespace: str) -> None:
    restricted = load_config(cluster["AKRI_TRIO_RESTRICTED_KUBECONFIG"])
    async with Client.open(restricted) as client:
        with pytest.raises(Forbidden) as info:
            await client.list(CONFIGMAPS, namespace=namespace)
        assert info.value.code == 403
        with pytest.raises(Forbidden):
            await client.create(CONFIGMAPS, cm("nope", namespace))


# --- CRD, status subresource, server-side apply ----------------------------------------------


async def test_crd_round_trip_with_status_subresource(
    client: Client, namespace: str, widgets_crd: str
) -> None:
    name = unique("w")
    created = await client.create(
        WIDGETS, {"metadata": {"name": name, "namespace": namespace}, "spec": {"size": 1}}
    )
    assert created["apiVersion"] == "test.akri.sh/v1" and "status" not in created

    # With a status subresource, the main resource ignores status and vice versa.
    created["status"] = {"phase": "ignored"}
    created["spec"]["size"] = 2
    updated = await client.replace(WIDGETS, created)
    assert updated["spec"]["size"] == 2 and "status" not in updated

    updated["status"] = {"phase": "Ready"}
    updated["spec"]["size"] = 99
    with_status = await client.replace(WIDGETS, updated, subresource="status")
    assert with_status["status"] == {"phase": "Ready"} and with_status["spec"]["size"] == 2

    patched = await client.merge_patch(
        WIDGETS, name, {"status": {"phase": "Busy"}}, namespace=namespace, subresource="status"
    )
    assert patched["status"]["phase"] == "Busy"

    applied = await client.apply(
        WIDGETS,
        {"metadata": {"name": name, "namespace": namespace}, "status": {"phase": "Applied"}},
        field_manager="status-writer",
        force=True,  # the merge patch above made the default manager own status.phase
        subresource="status",
    )
    assert applied["status"]["phase"] == "Applied"
    got = await client.get(WIDGETS, name, namespace=namespace, subresource="status")
    assert got["status"]["phase"] == "Applied"

    with pytest.raises(Invalid):  # the schema says minimum 0
        await client.merge_patch(WIDGETS, name, {"spec": {"size": -1}}, namespace=namespace)

    await client.delete(WIDGETS, name, namespace=namespace)
    with pytest.raises(NotFound):
        await client.get(WIDGETS, name, namespace=namespace)


def managers_of(obj: dict[str, Any], field: str) -> set[str]:
    """The field managers whose managedFields mention `f:<field>` under data."""
    owners = set()
    for entry in obj["metadata"].get("managedFields", []):
        if f"f:{field}" in entry.get("fieldsV1", {}).get("f:data", {}):
            owners.add(entry["manager"])
    return owners


async def test_server_side_apply_with_two_managers(client: Client, namespace: str) -> None:
    name = unique("ssa")
    alice = await client.apply(CONFIGMAPS, cm(name, namespace, {"a": "1"}), field_manager="alice")
    assert managers_of(alice, "a") == {"alice"}

    bob = await client.apply(CONFIGMAPS, cm(name, namespace, {"b": "2"}), field_manager="bob")
    assert bob["data"] == {"a": "1", "b": "2"}
    assert managers_of(bob, "a") == {"alice"} and managers_of(bob, "b") == {"bob"}

    with pytest.raises(Conflict) as info:
        await client.apply(
            CONFIGMAPS, cm(name, namespace, {"a": "bob's", "b": "2"}), field_manager="bob"
        )
    assert "alice" in info.value.message

    taken = await client.apply(
        CONFIGMAPS, cm(name, namespace, {"a": "bob's", "b": "2"}), field_manager="bob", force=True
    )
    assert taken["data"] == {"a": "bob's", "b": "2"}
    assert managers_of(taken, "a") == {"bob"}

    # Alice re-applying her old intent now conflicts with bob, and changes nothing.
    with pytest.raises(Conflict):
        await client.apply(CONFIGMAPS, cm(name, namespace, {"a": "1"}), field_manager="alice")


async def test_an_apply_naming_a_uid_never_creates(client: Client, namespace: str) -> None:
    """What a node's leave of a shared Instance relies on: an apply naming a uid is refused
    when the object is gone (a resourceVersion would not stop it creating one)."""
    name = unique("uid")
    made = await client.apply(CONFIGMAPS, cm(name, namespace, {"a": "1"}), field_manager="alice")
    uid = made["metadata"]["uid"]
    body = cm(name, namespace, {"a": "1"})
    body["metadata"]["uid"] = uid
    same = await client.apply(CONFIGMAPS, body, field_manager="bob")
    assert same["metadata"]["uid"] == uid
    await client.delete(CONFIGMAPS, name, namespace=namespace)
    with pytest.raises(Conflict, match="uid mismatch"):
        await client.apply(CONFIGMAPS, body, field_manager="bob")
    with pytest.raises(NotFound):
        await client.get(CONFIGMAPS, name, namespace=namespace)


async def test_writes_outwait_the_servers_request_timeout(client: Client, namespace: str) -> None:
    """A write is never abandoned before the API server's own deadline answers it (a 504):
    an abandoned write may still be applied, and is then done twice by the retry."""
    read_timeouts: dict[str, float] = {}

    async def record(request: httpx.Request) -> None:
        read_timeouts[request.method] = request.extensions["timeout"]["read"]

    client.http.event_hooks["request"].append(record)
    name = unique("timeouts")
    await client.create(CONFIGMAPS, cm(name, namespace))
    await client.get(CONFIGMAPS, name, namespace=namespace)
    await client.merge_patch(CONFIGMAPS, name, {"data": {"a": "1"}}, namespace=namespace)
    await client.delete(CONFIGMAPS, name, namespace=namespace)
    assert set(read_timeouts) == {"POST", "GET", "PATCH", "DELETE"}
    for method in ("POST", "PATCH", "DELETE"):
        assert read_timeouts[method] > APISERVER_REQUEST_TIMEOUT_S
    assert read_timeouts["GET"] == client.http.timeout.read  # reads keep the default


# --- lists --------------------------------------------------------------------------------------


async def test_list_pagination_over_500_objects(client: Client, namespace: str) -> None:
    count = 520
    label = unique("page")
    limiter = trio.CapacityLimiter(16)

    async def create(i: int) -> None:
        async with limiter:
            await client.create(CONFIGMAPS, cm(f"{label}-{i:04d}", namespace, batch=label))

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(create, i)

    first = await client.list_page(
        CONFIGMAPS, namespace=namespace, label_selector=f"batch={label}", limit=500
    )
    assert len(first.items) == 500 and first.continue_token
    rest = await client.list_page(
        CONFIGMAPS,
        namespace=namespace,
        label_selector=f"batch={label}",
        limit=500,
        continue_token=first.continue_token,
    )
    assert len(rest.items) == 20 and rest.continue_token is None

    everything = await client.list(
        CONFIGMAPS, namespace=namespace, label_selector=f"batch={label}", page_size=200
    )
    names = [o["metadata"]["name"] for o in everything.items]
    assert names == sorted(f"{label}-{i:04d}" for i in range(count))
    assert everything.resource_version


# --- watches ------------------------------------------------------------------------------------


async def raw_events(
    client: Client, namespace: str, since: str, label: str, seconds: int = 2
) -> list[tuple[str, str, str]]:
    """(type, name, resourceVersion) of every non-bookmark event until the server ends the
    watch after `seconds`."""
    out = []
    async with client.watch_stream(
        CONFIGMAPS,
        namespace=namespace,
        resource_version=since,
        label_selector=f"w={label}",
        timeout_seconds=seconds,
    ) as events:
        async for event in events:
            if event["type"] != "BOOKMARK":
                meta = event["object"]["metadata"]
                out.append((event["type"], meta["name"], meta["resourceVersion"]))
    return out


async def test_watch_resumes_from_a_resource_version(client: Client, namespace: str) -> None:
    label = unique("resume")
    start = await client.list(CONFIGMAPS, namespace=namespace, label_selector=f"w={label}")
    a = await client.create(CONFIGMAPS, cm("a-" + label, namespace, w=label))
    b = await client.create(CONFIGMAPS, cm("b-" + label, namespace, w=label))
    a2 = await client.merge_patch(
        CONFIGMAPS, a["metadata"]["name"], {"data": {"x": "1"}}, namespace=namespace
    )
    await client.delete(CONFIGMAPS, b["metadata"]["name"], namespace=namespace)

    history = await raw_events(client, namespace, start.resource_version, label)
    assert [(t, n) for t, n, _ in history] == [
        ("ADDED", "a-" + label),
        ("ADDED", "b-" + label),
        ("MODIFIED", "a-" + label),
        ("DELETED", "b-" + label),
    ]
    assert history[2][2] == a2["metadata"]["resourceVersion"]
    # Resuming from the second event's resourceVersion gives exactly what came after it.
    assert await raw_events(client, namespace, history[1][2], label) == history[2:]


async def next_events(events: trio.MemoryReceiveChannel[WatchEvent], n: int) -> list[WatchEvent]:
    with trio.fail_after(15):
        return [await events.receive() for _ in range(n)]


async def test_open_watch_lists_then_follows_changes(client: Client, namespace: str) -> None:
    label = unique("follow")
    pre = await client.create(CONFIGMAPS, cm("pre-" + label, namespace, w=label))
    async with open_watch(
        client, CONFIGMAPS, namespace=namespace, label_selector=f"w={label}"
    ) as events:
        init = await next_events(events, 3)
        assert init[0] == Init() and init[2] == InitDone()
        assert (
            isinstance(init[1], InitApply)
            and init[1].obj["metadata"]["uid"] == pre["metadata"]["uid"]
        )

        new = await client.create(CONFIGMAPS, cm("new-" + label, namespace, w=label))
        await client.delete(CONFIGMAPS, "pre-" + label, namespace=namespace)
        changes = await next_events(events, 2)
        assert changes[0] == Apply(new)
        assert isinstance(changes[1], Delete)
        assert changes[1].obj["metadata"]["name"] == "pre-" + label


async def test_reflector_store_syncs_and_follows(client: Client, namespace: str) -> None:
    label = unique("store")
    await client.create(CONFIGMAPS, cm("one-" + label, namespace, w=label))
    store = Store()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: reflect(
                client, CONFIGMAPS, store, namespace=namespace, label_selector=f"w={label}"
            )
        )
        with trio.fail_after(15):
            await store.wait_synced()
            key = ObjectKey(namespace, "one-" + label)
            assert set(store.snapshot()) == {key}
            with store.subscribe() as changes:
                await client.merge_patch(
                    CONFIGMAPS, "one-" + label, {"data": {"k": "v"}}, namespace=namespace
                )
                assert await changes.__anext__() == key
                obj = store.get(key)
                assert obj is not None and obj["data"] == {"k": "v"}
        nursery.cancel_scope.cancel()


async def etcd_compact(etcd: str) -> int:
    """Compact etcd up to its current revision; returns that revision."""
    async with httpx.AsyncClient(base_url=etcd, timeout=10) as http:
        key = base64.b64encode(b"\0").decode()
        head = (await http.post("/v3/kv/range", json={"key": key})).json()["header"]
        revision = int(head["revision"])
        answer = await http.post("/v3/kv/compaction", json={"revision": revision, "physical": True})
        answer.raise_for_status()
        return revision


async def test_list_from_a_compacted_resource_version_is_gone(
    client: Client, namespace: str, cluster: dict[str, str]
) -> None:
    label = unique("old")
    await client.create(CONFIGMAPS, cm("x-" + label, namespace, w=label))
    await etcd_compact(cluster["ETCD_ENDPOINT"])
    # An exact-revision list (a limit makes it exact) older than anything the apiserver's
    # watch cache keeps is served by etcd, where compaction has removed it: 410 Gone.
    with pytest.raises(Gone):
        await client.list_page(
            CONFIGMAPS,
            namespace=namespace,
            label_selector=f"w={label}",
            limit=10,
            resource_version="1",
        )


async def test_paginated_relist_is_one_snapshot_then_the_watch_brings_the_changes(
    client: Client, namespace: str, cluster: dict[str, str]
) -> None:
    """The watcher is mid-list (page 1 of 3 delivered, holding a continue token) when the world
    changes and etcd is compacted. The apiserver serves the later pages from its watch cache's
    snapshot of the list's revision, so the list completes as one consistent picture (a, b, c),
    and the watch from that revision then delivers exactly what changed (b gone, d new). With an
    unbuffered channel the watcher cannot fetch page 2 before we let it, so this is
    deterministic. (A 410 on a page would relist; the state machine's tests cover that.)"""
    label = unique("relist")
    for name in ("a", "b", "c"):
        await client.create(CONFIGMAPS, cm(f"{name}-{label}", namespace, w=label))
    async with open_watch(
        client,
        CONFIGMAPS,
        namespace=namespace,
        label_selector=f"w={label}",
        page_size=1,
        buffer=0,
    ) as events:
        assert await next_events(events, 1) == [Init()]
        # The watcher now blocks handing over page 1's InitApply; change the world meanwhile.
        await client.delete(CONFIGMAPS, f"b-{label}", namespace=namespace)
        d = await client.create(CONFIGMAPS, cm(f"d-{label}", namespace, w=label))
        await etcd_compact(cluster["ETCD_ENDPOINT"])

        listed = await next_events(events, 4)
        assert listed[-1] == InitDone()
        names = [e.obj["metadata"]["name"] for e in listed[:-1] if isinstance(e, InitApply)]
        assert names == [f"a-{label}", f"b-{label}", f"c-{label}"]

        changed = await next_events(events, 2)
        assert isinstance(changed[0], Delete) and changed[0].obj["metadata"]["name"] == f"b-{label}"
        assert isinstance(changed[1], Apply) and changed[1].obj["metadata"]["name"] == f"d-{label}"

        # And it watches on from there.
        await client.delete(CONFIGMAPS, d["metadata"]["name"], namespace=namespace)
        (gone,) = await next_events(events, 1)
        assert isinstance(gone, Delete) and gone.obj["metadata"]["name"] == f"d-{label}"


def watch_gauge(metrics: str, resource: str) -> float:
    """The apiserver's count of open WATCH requests for `resource` (all scopes)."""
    total = 0.0
    for line in metrics.splitlines():
        if (
            line.startswith("apiserver_longrunning_requests{")
            and f'resource="{resource}"' in line
            and 'verb="WATCH"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_cancelling_a_watch_closes_its_connection_at_once(
    kubeconfig: Path, namespace: str, widgets_crd: str
) -> None:
    """Client side: the pool holds the watch's connection while it runs and none after the
    cancel scope exits. Server side: the apiserver's open-WATCH gauge for widgets (a type only
    this module watches) goes up by one and back down."""
    async with (
        Client.open(load_config(kubeconfig)) as client,
        Client.open(load_config(kubeconfig)) as observer,
    ):

        async def open_watches() -> float:
            text = (await observer.http.get("/metrics")).text
            return watch_gauge(text, "widgets")

        async def watches_at(n: float) -> bool:
            return await open_watches() == n

        baseline = await open_watches()
        pool = client.http._transport._pool  # type: ignore[attr-defined]
        rv = (await client.list_page(WIDGETS, namespace=namespace)).resource_version
        opened = trio.Event()
        with trio.move_on_after(30) as deadline:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    async with client.watch_stream(
                        WIDGETS, namespace=namespace, resource_version=rv, timeout_seconds=250
                    ) as events:
                        opened.set()
                        async for _ in events:
                            pass

                nursery.start_soon(watch)
                await opened.wait()
                assert len(pool.connections) == 1
                await until_api(
                    lambda: watches_at(baseline + 1), 10, "the watch open on the server"
                )
                started = trio.current_time()
                nursery.cancel_scope.cancel()
        assert not deadline.cancelled_caught
        assert trio.current_time() - started < 0.5
        assert len(pool.connections) == 0
        await until_api(lambda: watches_at(baseline), 10, "the watch closed on the server")


async def test_watch_error_is_typed(client: Client, namespace: str) -> None:
    with pytest.raises(NotFound):
        async with client.watch_stream(
            Resource("test.akri.sh", "v1", "nonexistents", "Nonexistent"),
            namespace=namespace,
            resource_version="0",
            timeout_seconds=5,
        ) as events:
            async for _ in events:
                pass


async def test_watcher_reconnects_after_the_server_ends_the_watch(
    client: Client, namespace: str
) -> None:
    """With timeoutSeconds=1 the server closes every watch after a second; a change made
    after several such ends still arrives, exactly once."""
    label = unique("reconnect")
    watch_requests: list[httpx.Request] = []

    async def count(request: httpx.Request) -> None:
        if request.url.params.get("watch") == "true":
            watch_requests.append(request)

    client.http.event_hooks["request"].append(count)
    async with open_watch(
        client, CONFIGMAPS, namespace=namespace, label_selector=f"w={label}", timeout_seconds=1
    ) as events:
        assert await next_events(events, 2) == [Init(), InitDone()]
        await trio.sleep(2.5)  # real time: let the server end the watch twice
        assert len(watch_requests) >= 3
        made = await client.create(CONFIGMAPS, cm("late-" + label, namespace, w=label))
        assert await next_events(events, 1) == [Apply(made)]
        with trio.move_on_after(1.5):
            extra = await events.receive()
            pytest.fail(f"duplicate or unexpected event {extra}")


async def test_watcher_retries_errors_with_backoff(
    cluster: dict[str, str], namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A watcher without RBAC keeps retrying (Forbidden), emits nothing, and stops when
    cancelled. Backoff is tiny here; its timing is tested in tests/runtime/test_backoff."""
    restricted = load_config(cluster["AKRI_TRIO_RESTRICTED_KUBECONFIG"])
    send, receive = trio.open_memory_channel[WatchEvent](10)
    async with Client.open(restricted) as client:
        with trio.move_on_after(1):
            await run_watch(
                client,
                CONFIGMAPS,
                send,
                namespace=namespace,
                backoff=Backoff(base=0.05, cap=0.1),
            )
    retries = [r for r in caplog.records if "Forbidden" in r.getMessage()]
    assert len(retries) >= 3
    assert receive.statistics().current_buffer_used == 0
    with pytest.raises(trio.EndOfChannel):  # run_watch closed its end on the way out
        receive.receive_nowait()
