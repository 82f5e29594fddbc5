"""DRA mode's node-pool mappers: an Instance change reconciles the node pool it is (or was) in
on this node; a slice change reconciles its pool when the pool is this agent's."""

from __future__ import annotations

from typing import Any

from akri_trio import dra
from akri_trio.agent.triggers import instance_to_node_pool, slice_to_node_pool
from akri_trio.kube import Change, ObjectKey
from akri_trio.model.convert import unstructure
from akri_trio.model.resources import Instance
from tests.dra.support import instance

JSON = dict[str, Any]


def _instance(**kw: Any) -> JSON:
    obj: JSON = unstructure(instance(**kw))
    return obj


def _change(old: JSON | None, new: JSON | None) -> Change:
    meta = (old or new or {})["metadata"]
    return Change(ObjectKey(meta.get("namespace", ""), meta["name"]), old, new)


def _typed(old: Instance | None, new: Instance | None) -> Change[Instance]:
    meta = (old or new or instance()).metadata
    return Change(ObjectKey(meta.namespace, meta.name), old, new)


def test_an_instance_maps_to_its_namespaces_pool_on_this_node_before_and_after() -> None:
    """The mapper reads the node view's typed store's changes."""
    mapper = instance_to_node_pool("n1")
    pool = ObjectKey("", dra.node_pool("n1", "a"))
    here = instance(namespace="a", nodes=("n1", "n2"))
    elsewhere = instance(namespace="a", nodes=("n2",))
    shared = instance(namespace="a", nodes=("n1",), shared=True)
    assert list(mapper(_typed(None, here))) == [pool]
    assert list(mapper(_typed(here, elsewhere))) == [pool]  # it left this node
    assert list(mapper(_typed(here, None))) == [pool]
    assert list(mapper(_typed(None, elsewhere))) == []
    assert list(mapper(_typed(None, shared))) == []  # the controller's to publish
    assert list(mapper(_typed(shared, here))) == [pool]


def _slice(kind: str, namespace: str) -> JSON:
    (body,) = dra.plan_pool(
        dra.node_pool("n1", namespace),
        [{"name": "d"}],
        dra.node_placement("n1"),
        [],
        labels=dra.pool_labels(kind, namespace),
    ).apply
    return body


def test_a_slice_maps_to_its_pool_only_when_the_pool_is_ours() -> None:
    ours = _slice("node", "a")
    key = ObjectKey("", dra.node_pool("n1", "a"))
    assert list(slice_to_node_pool(None)(_change(ours, None))) == [key]
    assert list(slice_to_node_pool("a")(_change(None, ours))) == [key]
    assert list(slice_to_node_pool("b")(_change(None, ours))) == []  # another namespace's
    assert list(slice_to_node_pool(None)(_change(None, _slice("shared", "a")))) == []
