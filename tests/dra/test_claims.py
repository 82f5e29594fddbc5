"""Which devices of a claim are ours (with the slots each consumed of a consumable device), and
refusing the ones this node cannot stand behind."""

from __future__ import annotations

from typing import Any

import pytest

from akri_trio.dra import (
    Allocated,
    DeviceRef,
    NotAllocated,
    UnusableDevice,
    WrongClaim,
    consumed_slots,
    counted_on_node,
    our_results,
    resolve,
)

UID = "uid-1"


def _claim(*results: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": UID},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def _result(device: str, pool: str = "node/n1/ns", driver: str = "akri.sh") -> dict[str, str]:
    return {"request": "cam", "driver": driver, "pool": pool, "device": device}


USABLE = {"node/n1/ns": {"cam-abc123": DeviceRef("ns", "cam-abc123")}}


def test_only_our_driver_results_keep_their_index() -> None:
    claim = _claim(_result("gpu0", "p", "gpu.example.com"), _result("cam-abc123"))
    assert our_results(claim) == [Allocated(1, "cam", "node/n1/ns", "cam-abc123")]


def test_resolve_maps_devices_to_instances() -> None:
    ((allocated, ref),) = resolve(_claim(_result("cam-abc123")), UID, USABLE)
    assert allocated.index == 0 and ref == DeviceRef("ns", "cam-abc123")


def test_unallocated_claims_other_nodes_and_gone_devices_are_refused() -> None:
    with pytest.raises(NotAllocated):
        resolve({"metadata": {"uid": UID}, "status": {}}, UID, USABLE)
    with pytest.raises(WrongClaim):
        resolve(_claim(_result("cam-abc123")), "other-uid", USABLE)
    with pytest.raises(UnusableDevice, match="pool not usable on this node"):
        resolve(_claim(_result("cam-abc123", pool="node/n2/ns")), UID, USABLE)
    with pytest.raises(UnusableDevice, match="no such device"):
        resolve(_claim(_result("cam-ffffff")), UID, USABLE)


def test_a_claim_of_another_namespace_is_refused_the_device() -> None:
    """DeviceClasses are cluster-scoped: a claim in namespace "other" allocated a device of
    namespace "ns"'s pool would get that namespace's environment, mounts and device nodes."""
    claim = _claim(_result("cam-abc123"))
    claim["metadata"]["namespace"] = "other"
    with pytest.raises(UnusableDevice, match="namespace 'ns', the claim is in 'other'") as err:
        resolve(claim, UID, USABLE)
    assert (err.value.pool, err.value.device) == ("node/n1/ns", "cam-abc123")
    shared = {"shared/ns/cam-abc123": {"cam-abc123": DeviceRef("ns", "cam-abc123")}}
    of_shared = _claim(_result("cam-abc123", pool="shared/ns/cam-abc123"))
    of_shared["metadata"]["namespace"] = "other"
    with pytest.raises(UnusableDevice, match="belongs to namespace 'ns'"):
        resolve(of_shared, UID, shared)


@pytest.mark.parametrize(
    ("consumed", "slots"),
    [(None, 1), ({"akri.sh/slots": "2"}, 2), ({"akri.sh/slots": "500m"}, 1), ({"x": "3"}, 1)],
)
def test_consumed_slots_read_the_allocation_or_one(
    consumed: dict[str, str] | None, slots: int
) -> None:
    result: dict[str, Any] = {**_result("cam-abc123"), "shareID": "s"}
    if consumed is not None:
        result["consumedCapacity"] = consumed
    assert consumed_slots(result) == slots
    assert our_results(_claim(result))[0].slots == slots


def _extended(*classes: str, annotated: bool = True) -> dict[str, Any]:
    annotations = {"resource.kubernetes.io/extended-resource-claim": "true"} if annotated else {}
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)]
    return {"metadata": {"annotations": annotations}, "spec": {"devices": {"requests": requests}}}


def test_a_claim_for_an_instances_extended_resource_is_counted_on_the_node() -> None:
    assert counted_on_node(_extended("cam-abc123.ns.instance.akri.sh"))
    assert not counted_on_node(_extended("cam.ns.akri.sh"))  # akri.sh/<configuration>
    assert not counted_on_node(_extended("cam-abc123.ns.instance.akri.sh", "cam.ns.akri.sh"))
    assert not counted_on_node(_extended("cam-abc123.ns.instance.akri.sh", annotated=False))
    assert not counted_on_node(_extended())
