"""The sans-IO watcher: every transition, 410 relists, bookmarks, ERROR events, and a
hypothesis model showing a store fed by it always equals the server's truth at the machine's
resourceVersion (so after every InitDone, and after every event)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akri_trio.address import ObjectKey
from akri_trio.kube.errors import ApiError, Gone, ServerError
from akri_trio.kube.store import Store
from akri_trio.kube.watch import (
    Apply,
    Delete,
    Init,
    InitApply,
    InitDone,
    ListRequest,
    Phase,
    WatchMachine,
    WatchProtocolError,
    WatchRequest,
)


def obj(name: str, rv: int, value: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
        "data": {"v": value},
    }


def ev(kind: str, o: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": o}


def error_event(code: int, reason: str) -> dict[str, Any]:
    return ev(
        "ERROR",
        {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": "m"},
    )


def watching(rv: int = 10) -> WatchMachine:
    m = WatchMachine()
    m.on_page([], str(rv), None)
    return m


def test_starts_empty_and_asks_for_a_fresh_list() -> None:
    m = WatchMachine()
    assert m.phase is Phase.EMPTY
    assert m.next_request() == ListRequest(None)


def test_single_page_list() -> None:
    m = WatchMachine()
    a, b = obj("a", 3), obj("b", 4)
    assert m.on_page([a, b], "7", None) == [Init(), InitApply(a), InitApply(b), InitDone()]
    assert m.phase is Phase.WATCHING
    assert m.next_request() == WatchRequest("7")


def test_empty_list_is_init_then_done() -> None:
    assert WatchMachine().on_page([], "1", None) == [Init(), InitDone()]


def test_paged_list_emits_init_once_and_done_at_the_end() -> None:
    m = WatchMachine()
    a, b, c = obj("a", 1), obj("b", 2), obj("c", 3)
    assert m.on_page([a], "9", "tok1") == [Init(), InitApply(a)]
    assert m.phase is Phase.LISTING
    assert m.next_request() == ListRequest("tok1")
    assert m.on_page([b], "9", "tok2") == [InitApply(b)]
    assert m.next_request() == ListRequest("tok2")
    assert m.on_page([c], "9", None) == [InitApply(c), InitDone()]
    assert m.next_request() == WatchRequest("9")


def test_last_page_without_resource_version_is_an_error() -> None:
    with pytest.raises(WatchProtocolError):
        WatchMachine().on_page([], "", None)


@pytest.mark.parametrize(
    ("kind", "cls"), [("ADDED", Apply), ("MODIFIED", Apply), ("DELETED", Delete)]
)
def test_changes_are_surfaced_and_move_the_resume_point(kind: str, cls: type) -> None:
    m = watching(10)
    o = obj("a", 11)
    assert m.on_event(ev(kind, o)) == [cls(o)]
    assert m.next_request() == WatchRequest("11")


def test_bookmark_moves_the_resume_point_silently() -> None:
    m = watching(10)
    assert (
        m.on_event(ev("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": "42"}}))
        == []
    )
    assert m.next_request() == WatchRequest("42")


@pytest.mark.parametrize("reason", ["Expired", "Gone"])
def test_error_410_in_the_stream_relists(reason: str) -> None:
    m = watching(10)
    with pytest.raises(Gone):
        m.on_event(error_event(410, reason))
    assert m.phase is Phase.EMPTY
    assert m.next_request() == ListRequest(None)
    # The relist starts with a fresh Init, so a store rebuilds instead of merging.
    assert m.on_page([obj("a", 50)], "50", None)[0] == Init()


def test_other_error_events_raise_and_keep_the_resume_point() -> None:
    m = watching(10)
    with pytest.raises(ServerError):
        m.on_event(error_event(500, "InternalError"))
    assert m.phase is Phase.WATCHING
    assert m.next_request() == WatchRequest("10")


def test_http_410_while_watching_relists() -> None:
    m = watching(10)
    m.on_gone()
    assert m.next_request() == ListRequest(None)


def test_410_mid_list_restarts_the_list_from_scratch() -> None:
    m = WatchMachine()
    m.on_page([obj("a", 1)], "9", "tok")
    m.on_gone()  # the continue token expired
    assert m.next_request() == ListRequest(None)
    assert m.on_page([obj("b", 12)], "12", None) == [Init(), InitApply(obj("b", 12)), InitDone()]


@pytest.mark.parametrize(
    "raw",
    [
        ev("WHATEVER", obj("a", 11)),
        {"type": "ADDED"},
        ev("ADDED", {"metadata": {"name": "a"}}),
    ],
)
def test_malformed_events_are_protocol_errors_and_change_nothing(raw: dict[str, Any]) -> None:
    m = watching(10)
    with pytest.raises(WatchProtocolError):
        m.on_event(raw)
    assert m.next_request() == WatchRequest("10")


def test_out_of_phase_inputs_are_protocol_errors() -> None:
    with pytest.raises(WatchProtocolError):
        WatchMachine().on_event(ev("ADDED", obj("a", 1)))
    with pytest.raises(WatchProtocolError):
        watching().on_page([], "1", None)


# --- the model: a server history, a machine, a store -----------------------------------------


class ServerModel:
    """The truth: objects by key, with the state after every resourceVersion, and a log of
    watch events that compaction can cut."""

    def __init__(self) -> None:
        self.rv = 1
        self.objects: dict[ObjectKey, dict[str, Any]] = {}
        self.history: list[tuple[int, dict[ObjectKey, dict[str, Any]]]] = [(1, {})]
        self.log: list[tuple[int, dict[str, Any]]] = []
        self.compacted = 0

    def mutate(self, name: str, value: int) -> None:
        self.rv += 1
        key = ObjectKey("ns", name)
        if key in self.objects and value < 0:
            event = ev("DELETED", obj(name, self.rv, self.objects.pop(key)["data"]["v"]))
        else:
            kind = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = obj(name, self.rv, abs(value))
            event = ev(kind, self.objects[key])
        self.log.append((self.rv, event))
        self.history.append((self.rv, dict(self.objects)))

    def state_at(self, rv: int) -> dict[ObjectKey, dict[str, Any]]:
        return [state for at, state in self.history if at <= rv][-1]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data())
def test_store_fed_by_the_machine_equals_the_servers_truth(data: st.DataObject) -> None:
    server = ServerModel()
    machine = WatchMachine()
    store = Store()
    snapshot: tuple[list[dict[str, Any]], int] = ([], 0)
    page_size = data.draw(st.integers(1, 4), label="page size")
    relists = 0

    def feed(events: list[Any]) -> None:
        nonlocal relists
        for event in events:
            relists += isinstance(event, InitDone)
            store.apply(event)

    for _ in range(data.draw(st.integers(1, 60), label="steps")):
        action = data.draw(st.sampled_from(["mutate", "mutate", "client", "client", "compact"]))
        if action == "mutate":
            server.mutate(data.draw(st.sampled_from("abcde")), data.draw(st.integers(-3, 3)))
        elif action == "compact":
            server.compacted = server.rv
        else:
            request = machine.next_request()
            if isinstance(request, ListRequest):
                if request.continue_token is None:
                    snapshot = (
                        sorted(server.objects.values(), key=lambda o: o["metadata"]["name"]),
                        server.rv,
                    )
                    offset = 0
                elif data.draw(st.booleans(), label="continue token expired"):
                    machine.on_gone()
                    continue
                else:
                    offset = int(request.continue_token)
                items, list_rv = snapshot
                end = offset + page_size
                token = str(end) if end < len(items) else None
                feed(machine.on_page(items[offset:end], str(list_rv), token))
            else:
                since = int(request.resource_version)
                if since < server.compacted:
                    if data.draw(st.booleans(), label="410 as HTTP status"):
                        machine.on_gone()
                    else:
                        with pytest.raises(Gone):
                            machine.on_event(error_event(410, "Expired"))
                    continue
                pending = [e for rv, e in server.log if rv > since]
                n = data.draw(st.integers(0, len(pending)), label="events delivered")
                for raw in pending[:n]:
                    feed(machine.on_event(raw))
                    assert store.snapshot() == server.state_at(int(machine.resource_version or 0))
                if n == len(pending) and data.draw(st.booleans(), label="bookmark"):
                    bookmark = {"metadata": {"resourceVersion": str(server.rv)}}
                    assert machine.on_event(ev("BOOKMARK", bookmark)) == []
                if data.draw(st.booleans(), label="transient ERROR event"):
                    with pytest.raises(ApiError):
                        machine.on_event(error_event(500, "InternalError"))
                # then the stream ends cleanly; the next request resumes from the machine's rv
        if machine.phase is Phase.WATCHING:
            assert store.synced
            assert store.snapshot() == server.state_at(int(machine.resource_version or 0))
        elif relists == 0:
            assert not store.synced

    # Catch up: however the history went, a bounded number of requests converges on the truth
    # (at worst: finish a stale list, find its rv compacted, relist, watch).
    for _ in range(2 * (len(server.objects) // page_size + 2)):
        request = machine.next_request()
        if isinstance(request, WatchRequest):
            since = int(request.resource_version)
            if since >= server.compacted:
                for raw in [e for rv, e in server.log if rv > since]:
                    feed(machine.on_event(raw))
                break
            machine.on_gone()
        else:
            if request.continue_token is None:
                snapshot = (
                    sorted(server.objects.values(), key=lambda o: o["metadata"]["name"]),
                    server.rv,
                )
            items, list_rv = snapshot
            offset = int(request.continue_token or 0)
            end = offset + page_size
            feed(
                machine.on_page(
                    items[offset:end], str(list_rv), str(end) if end < len(items) else None
                )
            )
    else:
        pytest.fail("the watcher did not converge")
    assert store.snapshot() == server.objects
