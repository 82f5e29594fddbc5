"""The node view never resurrects a deleted Instance, whatever order the news arrives in."""

from __future__ import annotations

from typing import Any

from akri_trio.address import ObjectKey
from akri_trio.agent.view import NodeView


def _obj(rv: int, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "i", "namespace": "ns", "resourceVersion": str(rv), **meta},
        "spec": {"configurationName": "c", "cdiName": "akri.sh/c=1", "capacity": 1, "nodes": ["n"]},
    }


def test_answer_that_released_the_last_finalizer_after_the_watch_delete() -> None:
    view = NodeView("n")
    view.put_instance(_obj(10, finalizers=["n"], deletionTimestamp="t"))
    view.drop_instance(ObjectKey("ns", "i"))  # the watch's DELETE came first...
    view.put_instance(_obj(11, deletionTimestamp="t"))  # ...then our write's answer
    assert view.instance(ObjectKey("ns", "i")) is None


def test_answer_that_released_the_last_finalizer_before_the_watch_delete() -> None:
    view = NodeView("n")
    view.put_instance(_obj(10, finalizers=["n"], deletionTimestamp="t"))
    view.put_instance(_obj(11, deletionTimestamp="t"))
    assert view.instance(ObjectKey("ns", "i")) is None
    view.put_instance(_obj(11, deletionTimestamp="t"))  # the watch's late echo
    assert view.instance(ObjectKey("ns", "i")) is None


def test_a_recreated_instance_is_seen_again() -> None:
    view = NodeView("n")
    view.put_instance(_obj(11, deletionTimestamp="t"))
    view.put_instance(_obj(15, finalizers=["n"]))
    inst = view.instance(ObjectKey("ns", "i"))
    assert inst is not None and inst.metadata.resource_version == "15"


def test_an_older_version_never_replaces_a_newer_one() -> None:
    view = NodeView("n")
    view.put_instance(_obj(20))
    view.put_instance(_obj(19, finalizers=["x"]))
    inst = view.instance(ObjectKey("ns", "i"))
    assert inst is not None and inst.metadata.resource_version == "20"


def test_late_news_of_a_deleted_incarnation_never_resurrects_it() -> None:
    """Which incarnation a piece of news is about is its uid, not how its resourceVersion
    orders: after the answer that released the last finalizer, the watch's late echo of an
    earlier version of the same uid stays deleted; a new uid under the key is seen."""
    view = NodeView("n")
    key = ObjectKey("ns", "i")
    view.put_instance(_obj(10, uid="u1", finalizers=["n"], deletionTimestamp="t"))
    view.put_instance(_obj(11, uid="u1", deletionTimestamp="t"))  # our write's answer
    view.put_instance(_obj(10, uid="u1", finalizers=["n"], deletionTimestamp="t"))  # late echo
    assert view.instance(key) is None
    view.put_instance(_obj(12, uid="u2", finalizers=["n"]))
    inst = view.instance(key)
    assert inst is not None and inst.metadata.resource_version == "12"
