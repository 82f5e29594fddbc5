"""A shared device across three real kubelets: its slots are one budget for the whole fleet.

One agent per real node runs as a process (debugEcho shared: every node sees the one device),
with the node's own device-plugin dir, pod-resources socket and API link (its kubeconfig) from
`cluster env --node`; the controller runs too, with a short `--node-lost-grace`. The story runs
in file order: of five Pods spread over the nodes exactly two run; deleting one lets exactly one
more run; after a partition (`cluster node partition`, then `heal`) every node's view of the
slots converges; a node that is lost (`cluster node stop`, its agent gone with it) goes
NotReady, the controller removes it from the Instance and frees its slot, and a Pod then runs on
a surviving node; `node start` brings the node back into the Instance.

Device plugins admit on each kubelet's own view: a Pod bound to a node in the moment a slot
looks free everywhere can lose the race for it at its kubelet, which fails it with
UnexpectedAdmissionError (never runs it). So the tests assert what must hold on a fleet: never
more Pods running than the capacity, never a slot held twice, and the loser never Running.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest

from tests.support.fleet import (
    NODE_LOSS_S,
    Fleet,
    debug_echo_args,
    five_pods_two_run,
    node_command,
    one_more_runs_after_a_delete,
)
from tests.support.node_agent import debug_echo_configuration
from tests.support.polling import until

NS = "akri-multinode"
CONFIG = "mn-shared"
DESCRIPTION = "mn-shared-0"
CAPACITY = 2


@pytest.fixture(scope="module")
def fleet(
    multi_node_cluster: list[dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("multinode")
    f = Fleet(
        multi_node_cluster,
        tmp,
        namespace=NS,
        configuration=CONFIG,
        device_id=DESCRIPTION,
        capacity=CAPACITY,
        handler_args=debug_echo_args(tmp / "availability"),
    )
    with f.running_with(debug_echo_configuration(CONFIG, NS, [DESCRIPTION], CAPACITY)):
        yield f


def test_every_node_sees_the_shared_device(fleet: Fleet) -> None:
    spec = fleet.instance_spec()
    assert spec["shared"] is True
    assert fleet.instance_nodes() == sorted(fleet.names)
    assert not fleet.held()  # every node offers both slots (the fixture waited for that)


def test_of_five_pods_spread_over_the_nodes_exactly_two_run(fleet: Fleet) -> None:
    five_pods_two_run(fleet)


def test_deleting_a_running_pod_lets_exactly_one_more_run(fleet: Fleet) -> None:
    one_more_runs_after_a_delete(fleet)


def test_after_a_partition_heals_every_nodes_view_converges(fleet: Fleet) -> None:
    """Node 2 (its kubelet and its agent) is cut off from the API server while node 1's Pod is
    deleted: nodes 1 and 3 see the slot come free, node 2 cannot; no more Pods run than the
    capacity meanwhile; once healed, node 2's kubelet offers the freed slot too and its own Pod
    still runs on the slot it holds."""
    fleet.delete_pods()
    until(lambda: not fleet.held(), 30, "every slot free")
    first, cut, third = fleet.names
    fleet.pod("first", first)
    fleet.pod("cut", cut)
    until(lambda: {"first", "cut"} <= set(fleet.running()), 60, "both Pods running")
    fleet.wait_converged()
    node_command("partition", cut)
    try:
        fleet.delete_pods("first")
        until(lambda: first not in fleet.held().values(), 30, "node 1's slot freed")
        for node in (first, third):
            until(partial(fleet.converged, node), 60, f"{node} sees the free slot")
        fleet.check_budget()
    finally:
        node_command("heal", cut)
    fleet.wait_converged()  # node 2 too, now that its agent hears again
    assert "cut" in fleet.running()
    assert list(fleet.held().values()) == [cut]


def test_a_lost_node_frees_its_slot_and_a_pod_then_runs_elsewhere(fleet: Fleet) -> None:
    """Pods on node 1 and on node 2 hold both slots; node 2 is lost (its agent SIGKILLed, its
    kubelet and runtime stopped): it goes NotReady, the controller removes it from the Instance
    after --node-lost-grace and frees its slot, node 1 keeps its own, and a Pod waiting on node
    3 then runs. `node start` and a new agent bring node 2 back into the Instance."""
    fleet.delete_pods()
    until(lambda: not fleet.held(), 30, "every slot free")
    kept, lost, spare = fleet.names
    fleet.pod("keeps", kept)
    fleet.pod("lost", lost)
    until(lambda: {"keeps", "lost"} <= set(fleet.running()), 60, "both Pods running")
    fleet.wait_converged()
    fleet.pod("waits", spare)
    fleet.agents[1].kill()
    node_command("stop", lost)
    try:
        until(lambda: not fleet.ready(lost), NODE_LOSS_S, f"{lost} NotReady")
        until(
            lambda: lost not in fleet.instance_nodes(),
            60,
            f"the controller removed {lost} from the Instance",
        )
        assert lost not in fleet.held().values()
        assert kept in fleet.held().values()  # the survivor keeps its slot
        until(lambda: "waits" in fleet.running(), 90, f"the waiting Pod runs on {spare}")
        assert sorted(fleet.held().values()) == sorted([kept, spare])
        fleet.check_budget()
    finally:
        node_command("start", lost)
        fleet.agents[1].start()
    until(lambda: lost in fleet.instance_nodes(), 60, f"{lost} back in the Instance")
