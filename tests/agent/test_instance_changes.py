"""The agent's Instance watch mapper: every change lands in the node view, and only the changes
that can alter a Configuration's plan (not deviceUsage, not our own writes' echo) reconcile it."""

from __future__ import annotations

from typing import Any

from akri_trio.address import ObjectKey
from akri_trio.agent.run import _instance_changed
from akri_trio.agent.view import NodeView
from akri_trio.kube.store import Change

KEY = ObjectKey("ns", "cam-1")
CONFIG = ObjectKey("ns", "cam")


def inst(rv: int, *, nodes: tuple[str, ...] = ("n",), usage: dict[str, str] | None = None) -> Any:
    return {
        "metadata": {"name": "cam-1", "namespace": "ns", "resourceVersion": str(rv)},
        "spec": {
            "configurationName": "cam",
            "cdiName": "akri.sh/cam=1",
            "capacity": 2,
            "nodes": list(nodes),
            "deviceUsage": usage or {},
        },
    }


def test_a_new_instance_enters_the_view_and_reconciles_its_configuration() -> None:
    view = NodeView("n")
    assert list(_instance_changed(view)(Change(KEY, None, inst(1)))) == [CONFIG]
    assert view.instance(KEY) is not None


def test_a_claim_updates_the_view_but_reconciles_nothing() -> None:
    view = NodeView("n")
    mapper = _instance_changed(view)
    mapper(Change(KEY, None, inst(1)))
    assert list(mapper(Change(KEY, inst(1), inst(2, usage={"cam-1-0": "n"})))) == []
    held = view.instance(KEY)
    assert held is not None and held.spec.device_usage == {"cam-1-0": "n"}


def test_a_nodes_change_reconciles_the_configuration() -> None:
    view = NodeView("n")
    mapper = _instance_changed(view)
    mapper(Change(KEY, None, inst(1)))
    assert list(mapper(Change(KEY, inst(1), inst(2, nodes=("n", "m"))))) == [CONFIG]


def test_the_echo_of_our_own_write_reconciles_nothing() -> None:
    view = NodeView("n")
    view.put_instance(inst(5))  # the answer to our write, folded in at once
    assert list(_instance_changed(view)(Change(KEY, None, inst(5)))) == []


def test_a_deletion_leaves_the_view_and_reconciles_the_configuration() -> None:
    view = NodeView("n")
    mapper = _instance_changed(view)
    mapper(Change(KEY, None, inst(1)))
    assert list(mapper(Change(KEY, inst(1), None))) == [CONFIG]
    assert view.instance(KEY) is None
    assert list(mapper(Change(KEY, None, None))) == []  # unknown to the view: nothing to do
