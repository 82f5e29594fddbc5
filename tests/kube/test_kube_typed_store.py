"""A typed store (`Store[Instance]`): each version decoded once on the way in (the answer to
our own write included: the watch files it when it brings that version), a malformed
object logged once per uid and resourceVersion and left out (or, with `keep_last_good`, an update
that does not decode leaving the last version that did), the JSON still there for readers not on
the model (`store.raw`); and the Overlay of our own writes, which compares
resourceVersions only for equality. Also a check of the product's source: no resourceVersion
is turned into a number anywhere."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.address import ObjectKey
from akri_trio.kube.store import Overlay, Store, Written, by_field, drop_managed_fields
from akri_trio.kube.watch import Apply, Delete, Init, InitApply, InitDone, WatchEvent

KEY = ObjectKey("ns", "a")


@attrs.frozen
class Thing:
    name: str
    size: int
    version: str


def decode_thing(obj: dict[str, Any]) -> Thing:
    meta = obj["metadata"]
    size = obj["spec"]["size"]
    if not isinstance(size, int):
        raise ValueError(f"size must be a number, not {size!r}")
    return Thing(meta["name"], size, meta.get("resourceVersion", ""))


def thing(rv: int | str, size: object = 1, *, name: str = "a", uid: str = "u1") -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": str(rv)}
    return {"metadata": {**meta, "managedFields": [{}]}, "spec": {"size": size}}


def typed() -> Store[Thing]:
    return Store(
        decode=decode_thing,
        transform=drop_managed_fields,
        indexes={"size": by_field(lambda o: o["spec"]["size"])},
    )


def test_readers_get_the_decoded_object_and_the_raw_view_its_json() -> None:
    store = typed()
    store.apply(Apply(thing(1, 5)))
    assert store.get(KEY) == Thing("a", 5, "1")
    assert store.snapshot() == {KEY: Thing("a", 5, "1")}
    assert store.select("size", 5) == {KEY: Thing("a", 5, "1")}
    raw = store.raw.get(KEY)
    assert raw is not None and raw["spec"] == {"size": 5}
    assert "managedFields" not in raw["metadata"]  # the transform comes first
    assert store.raw.select("size", 5) == {KEY: raw}
    assert store.decode(thing(7, 2)) == Thing("a", 2, "7")


def test_each_version_is_decoded_once() -> None:
    calls: list[str] = []

    def counting(obj: dict[str, Any]) -> Thing:
        calls.append(obj["metadata"]["resourceVersion"])
        return decode_thing(obj)

    store: Store[Thing] = Store(decode=counting)
    store.apply(Apply(thing(1)))
    for _ in range(3):
        store.get(KEY)
        store.snapshot()
    assert calls == ["1"]


def counting_store() -> tuple[Store[Thing], list[str]]:
    """A typed store and the resourceVersions its decoder was called on, in order."""
    calls: list[str] = []

    def counting(obj: dict[str, Any]) -> Thing:
        calls.append(obj["metadata"]["resourceVersion"])
        return decode_thing(obj)

    return Store(decode=counting, transform=drop_managed_fields), calls


def test_the_answer_to_our_write_is_the_entry_the_watch_files_for_its_version() -> None:
    store, calls = counting_store()
    answer = store.decode(thing(2, 7))
    store.apply(Apply(thing(2, 7)))
    assert calls == ["2"]
    assert store.get(KEY) is answer
    assert store.raw.get(KEY) == {
        "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "2"},
        "spec": {"size": 7},
    }


def test_an_answer_waits_through_older_versions_and_stands_for_its_own_only() -> None:
    store, calls = counting_store()
    store.decode(thing(3, 3))
    store.apply(Apply(thing(2, 2)))  # the watch is behind the answer
    assert store.get(KEY) == Thing("a", 2, "2")
    store.apply(Apply(thing(3, 3)))
    assert calls == ["3", "2"]
    store.apply(Apply(thing(3, 3, uid="u2")))  # another incarnation, the same version string
    assert calls == ["3", "2", "3"]


def test_a_version_the_store_holds_is_not_decoded_again() -> None:
    store, calls = counting_store()
    store.apply(Apply(thing(1)))
    assert store.decode(thing(1)) is store.get(KEY)
    assert calls == ["1"]


def test_answers_end_with_a_deletion_or_a_relist() -> None:
    store, calls = counting_store()
    store.decode(thing(5))
    store.apply(Delete(thing(4)))
    store.apply(Apply(thing(5)))
    assert calls == ["5", "5"]
    store.decode(thing(6))
    for event in (Init(), InitApply(thing(7)), InitDone()):
        store.apply(event)
    store.apply(Apply(thing(6)))
    assert calls == ["5", "5", "6", "7", "6"]


def test_a_malformed_object_is_left_out_and_logged_once_per_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = typed()
    store.apply(Apply(thing(1, 5)))
    with caplog.at_level(logging.ERROR, logger="akri_trio.kube.store"):
        store.apply(Apply(thing(2, "five")))
        assert store.get(KEY) is None and store.raw.get(KEY) is None
        assert store.holds(KEY) and list(store.refused()) == [KEY]  # refused, not gone
        assert store.keys_for("size", 5) == frozenset()
        for event in (Init(), InitApply(thing(2, "five")), InitDone()):  # relisted: same version
            store.apply(event)
        assert len(caplog.records) == 1
        assert "ns/a" in caplog.text and "size must be a number" in caplog.text
        store.apply(Apply(thing(3, "six")))  # a new version is news
        assert len(caplog.records) == 2
    store.apply(Apply(thing(4, 6)))
    assert store.get(KEY) == Thing("a", 6, "4")


# --- keep_last_good: an update that does not decode is not a deletion ----------------------------


def keeping() -> Store[Thing]:
    return Store(decode=decode_thing, transform=drop_managed_fields, keep_last_good=True)


def relist(store: Store[Thing], *objects: dict[str, Any]) -> None:
    events: list[WatchEvent] = [Init(), *(InitApply(o) for o in objects), InitDone()]
    for event in events:
        store.apply(event)


async def test_keep_last_good_keeps_the_last_version_that_decoded_logged_once_no_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = keeping()
    store.apply(Apply(thing(1, 5)))
    with store.subscribe() as changes, caplog.at_level(logging.ERROR, "akri_trio.kube.store"):
        store.apply(Apply(thing(2, "five")))
        assert store.get(KEY) == Thing("a", 5, "1")
        assert store.holds(KEY)
        assert store.refused()[KEY]["metadata"]["resourceVersion"] == "2"
        relist(store, thing(2, "five"))  # the same version again: kept, not logged again
        assert store.get(KEY) == Thing("a", 5, "1")
        assert len(caplog.records) == 1
        assert "ns/a (resourceVersion 2) is malformed" in caplog.text
        assert "keeping the last version that decoded (resourceVersion 1)" in caplog.text
        store.apply(Apply(thing(1, 7, name="b")))
        assert (await changes.next_change()).key == ObjectKey("ns", "b")  # nothing for KEY
        store.apply(Apply(thing(3, "six")))  # a new version is news
        assert len(caplog.records) == 2
    store.apply(Apply(thing(4, 6)))
    assert store.get(KEY) == Thing("a", 6, "4")
    assert store.refused() == {}


def test_keep_last_good_leaves_out_what_it_first_sees_undecodable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = keeping()
    with caplog.at_level(logging.ERROR, logger="akri_trio.kube.store"):
        store.apply(Apply(thing(1, "five")))
        relist(store, thing(1, "five"))
    assert store.get(KEY) is None and store.holds(KEY)  # refused, not gone
    assert len(caplog.records) == 1 and "left out of the cache" in caplog.text
    store.apply(Apply(thing(2, 5)))
    assert store.get(KEY) == Thing("a", 5, "2") and store.refused() == {}


def test_keep_last_good_keeps_nothing_of_another_incarnation() -> None:
    store = keeping()
    store.apply(Apply(thing(1, 5)))
    store.apply(Apply(thing(2, "five", uid="u2")))  # a new object under the same name
    assert store.get(KEY) is None and store.holds(KEY)
    store.apply(Apply(thing(3, 5)))
    relist(store, thing(4, "five", uid="u2"))  # deleted and created again while away
    assert store.get(KEY) is None and store.holds(KEY)


def test_keep_last_good_still_removes_what_is_deleted() -> None:
    store = keeping()
    store.apply(Apply(thing(1, 5)))
    store.apply(Apply(thing(2, "five")))
    store.apply(Delete(thing(3, "five")))
    assert store.get(KEY) is None and not store.holds(KEY) and store.refused() == {}
    store.apply(Apply(thing(4, 5)))
    store.apply(Apply(thing(5, "five")))
    relist(store)  # deleted while the watch was away
    assert store.get(KEY) is None and not store.holds(KEY) and store.refused() == {}


@given(
    st.lists(
        st.sampled_from(["good", "bad", "delete", "recreate-bad", "relist", "relist-empty"]),
        max_size=12,
    )
)
def test_keep_last_good_holds_the_last_good_version_of_the_live_incarnation(
    history: list[str],
) -> None:
    """Whatever the watch brings, the store holds the newest version of the object that exists
    now which decoded (None: none did, or it is gone), and `holds` is whether it exists."""
    store = keeping()
    live: dict[str, Any] | None = None  # what the API server has now
    good: Thing | None = None  # its newest version that decoded
    for rv, step in enumerate(history):
        uid = (live or {}).get("metadata", {}).get("uid", f"u{rv}")
        match step:
            case "good" | "bad":
                live = thing(rv, 5 if step == "good" else "five", uid=uid)
                good = Thing("a", 5, str(rv)) if step == "good" else good
                store.apply(Apply(live))
            case "recreate-bad":
                if live is not None:
                    store.apply(Delete(live))
                live, good = thing(rv, "five", uid=f"u{rv}"), None
                store.apply(Apply(live))
            case "delete":
                if live is not None:
                    store.apply(Delete(live))
                live, good = None, None
            case "relist":
                relist(store, *([live] if live else []))
            case "relist-empty":
                relist(store)
                live, good = None, None
        assert store.get(KEY) == good
        assert store.holds(KEY) == (live is not None)
    raw = store.raw.get(KEY)
    assert (raw is None) == (good is None)


async def test_subscribers_of_the_typed_and_the_raw_view_hear_the_same_keys() -> None:
    store = typed()
    with store.subscribe() as changes, store.raw.subscribe() as raw_changes:
        store.apply(Apply(thing(1, 5)))
        change = await changes.next_change()
        raw_change = await raw_changes.next_change()
    assert change.key == raw_change.key == KEY
    assert change.old is None and change.new == Thing("a", 5, "1")
    assert raw_change.new is not None and raw_change.new["spec"] == {"size": 5}


# --- the overlay of our own writes ---------------------------------------------------------------


def written(rv: str, size: int = 1, uid: str | None = "u1") -> Written[Thing]:
    return Written(uid, rv, Thing("a", size, rv))


def test_an_entry_stays_through_older_versions_and_ends_at_the_written_one() -> None:
    store = typed()
    overlay: Overlay[Thing] = Overlay(store)
    store.apply(Apply(thing(1)))
    assert overlay.put(KEY, written("x7"), since=overlay.position)
    store.apply(Apply(thing("x5")))  # the watch behind our write: not ordered, just not equal
    assert overlay.get(KEY) == written("x7")
    store.apply(Apply(thing("x7")))
    assert overlay.get(KEY) is None
    assert overlay.watched(KEY) == written("x7")  # what readers saw before this change
    assert overlay.watched(KEY) is None


def test_an_entry_ends_when_its_incarnation_is_deleted_or_the_watch_relists() -> None:
    store = typed()
    overlay: Overlay[Thing] = Overlay(store)
    store.apply(Apply(thing(1)))
    overlay.put(KEY, written("9"))
    store.apply(Delete(thing(3, uid="u0")))  # another incarnation's deletion
    assert overlay.get(KEY) is not None
    store.apply(Delete(thing(4)))
    assert overlay.get(KEY) is None
    overlay.put(KEY, written("9"))
    for event in (Init(), InitApply(thing(12)), InitDone()):
        store.apply(event)
    assert overlay.get(KEY) is None


def test_a_version_the_watch_delivered_before_the_answer_is_not_kept() -> None:
    store = typed()
    overlay: Overlay[Thing] = Overlay(store)
    since = overlay.position
    store.apply(Apply(thing(7)))
    store.apply(Apply(thing(8)))
    assert not overlay.put(KEY, written("7"), since=since)
    assert overlay.get(KEY) is None
    assert overlay.put(KEY, written("9"), since=since)  # not delivered yet: kept


def test_an_answer_further_back_than_the_memory_is_not_kept() -> None:
    store = typed()
    overlay: Overlay[Thing] = Overlay(store, memory=4)
    since = overlay.position
    for rv in range(5):
        store.apply(Apply(thing(rv, name="b")))
    assert not overlay.put(KEY, written("9"), since=since)


@given(
    st.lists(st.sampled_from(["apply-other", "apply-written", "delete", "relist"]), max_size=8),
    st.booleans(),
)
def test_an_entry_ends_exactly_when_the_watch_has_shown_the_write(
    history: list[str], delivered_first: bool
) -> None:
    """Whatever the watch delivers around a write, the entry is in effect exactly until the
    watch delivers the written version, deletes that incarnation or relists, and is never
    kept when the watch brought any of those before the answer."""
    store = typed()
    overlay: Overlay[Thing] = Overlay(store)
    events: dict[str, list[WatchEvent]] = {
        "apply-other": [Apply(thing("other"))],
        "apply-written": [Apply(thing("w"))],
        "delete": [Delete(thing("gone"))],
        "relist": [Init(), InitApply(thing("listed")), InitDone()],
    }
    since = overlay.position
    cut = len(history) // 2 if delivered_first else 0
    for step in history[:cut]:
        for event in events[step]:
            store.apply(event)
    kept = overlay.put(KEY, written("w"), since=since)
    assert kept == all(step == "apply-other" for step in history[:cut])
    for i, step in enumerate(history[cut:]):
        for event in events[step]:
            store.apply(event)
        ended = not kept or any(s != "apply-other" for s in history[cut : cut + i + 1])
        assert (overlay.get(KEY) is None) == ended


# --- the product never orders resourceVersions ---------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
NUMBERED = re.compile(
    r"int\([^)\n]*(resource_?version|resourceVersion)|version_number|"
    r"(resource_?version|resourceVersion)[^\n]*[<>]=?\s*[\w(]",
    re.IGNORECASE,
)


def test_no_resource_version_is_compared_as_a_number() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for top in ("akri_trio", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
        if "/gen/" not in str(path)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NUMBERED.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []
