"""The node view shows the watch's Instances with this agent's own latest writes in front, until
the watch brings them; it never resurrects a deleted Instance, whatever order the news arrives
in, and never orders resourceVersions (they are opaque: only equality tells)."""

from __future__ import annotations

from typing import Any

from akri_trio.address import ObjectKey
from akri_trio.agent.view import NodeView
from akri_trio.kube.store import Change
from akri_trio.kube.watch import Apply, Delete, Init, InitApply, InitDone

KEY = ObjectKey("ns", "i")


def _obj(rv: int, uid: str = "u1", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "i",
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": str(rv),
            **meta,
        },
        "spec": {"configurationName": "c", "cdiName": "akri.sh/c=1", "capacity": 1, "nodes": ["n"]},
    }


def _shown(view: NodeView) -> str | None:
    inst = view.instance(KEY)
    return None if inst is None else inst.metadata.resource_version


def test_our_answer_is_shown_until_the_watch_brings_that_version() -> None:
    view = NodeView("n")
    view.store.apply(Apply(_obj(18)))
    since = view.position
    view.put_instance(_obj(20, finalizers=["n"]), since=since)  # our write's answer
    view.store.apply(Apply(_obj(19)))  # the watch, behind: an older version
    assert _shown(view) == "20"
    assert [i.metadata.resource_version for i in view.instances()] == ["20"]
    view.store.apply(Apply(_obj(20, finalizers=["n"])))  # the watch brings our write
    assert KEY not in view.written
    view.store.apply(Apply(_obj(21)))  # from here on the watch is the word
    assert _shown(view) == "21"


def test_an_answer_the_watch_already_brought_is_not_kept() -> None:
    """The watch delivered our write, and a later one, before our answer came back: the
    answer is older than what the store holds, and equality alone tells."""
    view = NodeView("n")
    view.store.apply(Apply(_obj(18)))
    since = view.position
    view.store.apply(Apply(_obj(20)))  # ours
    view.store.apply(Apply(_obj(21)))  # someone else's, after ours
    view.put_instance(_obj(20), since=since)
    assert KEY not in view.written
    assert _shown(view) == "21"


def test_a_relist_ends_the_overlay_as_it_may_skip_the_written_version() -> None:
    view = NodeView("n")
    view.store.apply(Apply(_obj(18)))
    view.put_instance(_obj(20), since=view.position)
    for event in (Init(), InitApply(_obj(22)), InitDone()):
        view.store.apply(event)
    assert _shown(view) == "22"


def test_an_answer_older_than_the_memory_of_deliveries_is_not_kept() -> None:
    view = NodeView("n")
    since = view.position
    for rv in range(1, 5000):  # more than an Overlay remembers
        view.store.apply(Apply({**_obj(rv), "metadata": {**_obj(rv)["metadata"], "name": "j"}}))
    view.put_instance(_obj(9999), since=since)
    assert KEY not in view.written


def test_answer_that_released_the_last_finalizer_after_the_watch_delete() -> None:
    view = NodeView("n")
    view.store.apply(Apply(_obj(10, finalizers=["n"], deletionTimestamp="t")))
    since = view.position
    view.store.apply(Delete(_obj(11, deletionTimestamp="t")))  # the watch's DELETE came first...
    view.put_instance(_obj(11, deletionTimestamp="t"), since=since)  # ...then our write's answer
    assert view.instance(KEY) is None
    assert KEY not in view.written


def test_answer_that_released_the_last_finalizer_before_the_watch_delete() -> None:
    view = NodeView("n")
    view.store.apply(Apply(_obj(10, finalizers=["n"], deletionTimestamp="t")))
    view.put_instance(_obj(11, deletionTimestamp="t"), since=view.position)
    assert view.instance(KEY) is None
    view.store.apply(Apply(_obj(10, finalizers=["n"], deletionTimestamp="t")))  # a late echo
    assert view.instance(KEY) is None
    view.store.apply(Delete(_obj(11, deletionTimestamp="t")))
    assert view.instance(KEY) is None
    assert KEY not in view.written


def test_a_recreated_instance_is_seen_again() -> None:
    view = NodeView("n")
    view.store.apply(Apply(_obj(10, finalizers=["n"], deletionTimestamp="t")))
    view.put_instance(_obj(11, deletionTimestamp="t"), since=view.position)
    view.store.apply(Delete(_obj(11, deletionTimestamp="t")))
    view.store.apply(Apply(_obj(15, uid="u2", finalizers=["n"])))
    assert _shown(view) == "15"


def test_not_found_hides_the_watchs_copy_until_its_delete() -> None:
    view = NodeView("n")
    view.store.apply(Apply(_obj(10)))
    view.drop_instance(KEY, since=view.position)  # a read or write answered 404
    assert view.instance(KEY) is None and view.instances() == []
    view.store.apply(Apply(_obj(11)))  # the watch, behind
    assert view.instance(KEY) is None
    view.store.apply(Delete(_obj(12)))
    view.store.apply(Apply(_obj(15, uid="u2")))
    assert _shown(view) == "15"


def test_waiters_hear_of_our_write_once_not_again_at_its_echo() -> None:
    view = NodeView("n")
    view.store.apply(Apply(_obj(1)))
    changes = view.changes_of(KEY)
    before = changes.version
    old = view.store.get(KEY)
    view.put_instance(_obj(2, finalizers=["n"]), since=view.position)
    assert changes.version == before + 1
    view.store.apply(Apply(_obj(2, finalizers=["n"])))
    assert view.watched(Change(KEY, old, view.store.get(KEY))) == (
        view.instance(KEY),
        view.instance(KEY),
    )
    assert changes.version == before + 1
