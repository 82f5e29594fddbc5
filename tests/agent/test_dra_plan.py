"""Which pools a node publishes (its non-shared Instances, per namespace) and which devices it
may prepare (also shared Instances listing it; only devices its discovery reports)."""

from __future__ import annotations

import attrs

from akri_trio.address import ObjectKey
from akri_trio.agent.dra.plan import node_pools, usable_devices
from akri_trio.dra import DeviceRef, node_pool, shared_pool
from tests.dra.support import instance


def test_node_pools_hold_this_nodes_non_shared_instances_per_namespace() -> None:
    insts = [
        instance("cam-aaaaaa", namespace="a", nodes=("n1",)),
        instance("cam-bbbbbb", namespace="b", nodes=("n1",)),
        instance("cam-cccccc", namespace="a", nodes=("n2",)),
        instance("cam-dddddd", namespace="a", nodes=("n1", "n2"), shared=True),
    ]
    pools = node_pools(insts, "n1", consumable=True)
    assert set(pools) == {node_pool("n1", "a"), node_pool("n1", "b")}
    namespace, devices = pools[node_pool("n1", "a")]
    assert namespace == "a"
    assert [d["name"] for d in devices.devices] == ["cam-aaaaaa"]


def test_a_deleting_instance_is_not_published() -> None:
    inst = instance("cam-aaaaaa")
    deleting = attrs.evolve(
        inst, metadata=attrs.evolve(inst.metadata, deletion_timestamp="2026-01-01T00:00:00Z")
    )
    assert node_pools([deleting], "n1", consumable=True) == {}


def test_usable_devices_need_the_node_and_a_discovered_device() -> None:
    local = instance("cam-aaaaaa", nodes=("n1",))
    shared = instance("cam-bbbbbb", nodes=("n1", "n2"), shared=True)
    undiscovered = instance("cam-cccccc", nodes=("n1",))
    elsewhere = instance("cam-dddddd", nodes=("n2",), shared=True)
    found = {ObjectKey("ns", n) for n in ("cam-aaaaaa", "cam-bbbbbb", "cam-dddddd")}
    usable = usable_devices(
        [local, shared, undiscovered, elsewhere], "n1", found.__contains__, consumable=False
    )
    assert usable == {
        node_pool("n1", "ns"): {
            "cam-aaaaaa-0": DeviceRef("ns", "cam-aaaaaa", 0),
            "cam-aaaaaa-1": DeviceRef("ns", "cam-aaaaaa", 1),
        },
        shared_pool("ns", "cam-bbbbbb"): {
            "cam-bbbbbb-0": DeviceRef("ns", "cam-bbbbbb", 0),
            "cam-bbbbbb-1": DeviceRef("ns", "cam-bbbbbb", 1),
        },
    }
