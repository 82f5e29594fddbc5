"""The agent's watch mappers. Instances: every change the watch brings is in the node view, and
only the changes that can alter a Configuration's plan (not deviceUsage, not the other nodes'
membership, not our own writes' echo) reconcile it. Configurations: every change but another
node's status entry reconciles."""

from __future__ import annotations

from typing import Any

from akri_trio.address import ObjectKey
from akri_trio.agent.triggers import configuration_changed, instance_changed
from akri_trio.agent.view import NodeView
from akri_trio.kube.store import Change
from akri_trio.kube.watch import Apply, Delete
from akri_trio.model.convert import structure
from akri_trio.model.resources import Configuration

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


def watch(view: NodeView, event: Apply | Delete) -> list[ObjectKey]:
    """The watch brings `event` into the view's store; what the Instance mapper makes of the
    change (as the runner hands it over)."""
    old = view.store.get(KEY)
    view.store.apply(event)
    return list(instance_changed(view)(Change(KEY, old, view.store.get(KEY))))


def test_a_new_instance_enters_the_view_and_reconciles_its_configuration() -> None:
    view = NodeView("n")
    assert watch(view, Apply(inst(1))) == [CONFIG]
    assert view.instance(KEY) is not None


def test_a_claim_updates_the_view_but_reconciles_nothing() -> None:
    view = NodeView("n")
    watch(view, Apply(inst(1)))
    assert watch(view, Apply(inst(2, usage={"cam-1-0": "n"}))) == []
    held = view.instance(KEY)
    assert held is not None and held.spec.device_usage == {"cam-1-0": "n"}


def test_another_node_joining_or_leaving_reconciles_nothing() -> None:
    view = NodeView("n")
    watch(view, Apply(inst(1)))
    assert watch(view, Apply(inst(2, nodes=("n", "m")))) == []
    assert watch(view, Apply(inst(3))) == []
    held = view.instance(KEY)
    assert held is not None and held.spec.nodes == ("n",)  # the view has every change


def test_this_nodes_own_membership_changing_reconciles_the_configuration() -> None:
    view = NodeView("n")
    watch(view, Apply(inst(1, nodes=("m",))))
    assert watch(view, Apply(inst(2, nodes=("m", "n")))) == [CONFIG]
    assert watch(view, Apply(inst(3, nodes=("m",)))) == [CONFIG]


def config(
    rv: int, *, capacity: int = 2, status: list[dict[str, Any]] | None = None
) -> Configuration:
    return structure(
        {
            "metadata": {"name": "cam", "namespace": "ns", "resourceVersion": str(rv)},
            "spec": {"discoveryHandler": {"name": "debugEcho"}, "capacity": capacity},
            "status": {"nodes": status or []},
        },
        Configuration,
    )


def test_another_nodes_status_entry_reconciles_nothing() -> None:
    mapper = configuration_changed("n")
    other = [{"node": "m", "instances": 1}]
    assert list(mapper(Change(CONFIG, config(1), config(2, status=other)))) == []


def test_a_spec_change_or_our_own_entry_changing_reconciles() -> None:
    mapper = configuration_changed("n")
    ours = [{"node": "n", "instances": 1}]
    assert list(mapper(Change(CONFIG, config(1), config(2, capacity=3)))) == [CONFIG]
    assert list(mapper(Change(CONFIG, config(1, status=ours), config(2)))) == [CONFIG]
    assert list(mapper(Change(CONFIG, None, config(1)))) == [CONFIG]
    assert list(mapper(Change(CONFIG, config(1), None))) == [CONFIG]


def test_the_echo_of_our_own_write_reconciles_nothing() -> None:
    view = NodeView("n")
    view.put_instance(inst(5))  # the answer to our write, folded in at once
    assert watch(view, Apply(inst(5))) == []


def test_a_deletion_leaves_the_view_and_reconciles_the_configuration() -> None:
    view = NodeView("n")
    watch(view, Apply(inst(1)))
    assert watch(view, Delete(inst(1))) == [CONFIG]
    assert view.instance(KEY) is None
    assert watch(view, Delete(inst(1))) == []  # unknown to the view: nothing to do
