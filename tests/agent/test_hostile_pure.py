"""Hostile input to the agent's pure cores: poisoned deviceUsage keys, hash collisions, oversized
device lists, tenants sharing a name, secrets in reprs, and the status that reports them."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.address import ObjectKey
from akri_trio.agent import tenants
from akri_trio.agent.discovery_streams import DiscoveredDevice, DiscoveryRequest
from akri_trio.agent.instance_plan import Apply, assign, desired_body, plan
from akri_trio.agent.plugins import slots, vdevs
from akri_trio.agent.plugins.manager import (
    ConfigPlugin,
    InstancePlugin,
    Plugin,
    one_per_resource,
)
from akri_trio.agent.plugins.service import (
    HEALTHY,
    UNHEALTHY,
    DevicePluginService,
    device_list_size,
    within_message_limit,
)
from akri_trio.agent.plugins.slots import DeviceView, InstanceSlots
from akri_trio.agent.status import MAX_LINE_CHARS, MAX_LISTED, node_entry
from akri_trio.agent.view import NodeView
from akri_trio.model.convert import structure
from akri_trio.model.device import Device
from akri_trio.model.limits import KUBELET_MESSAGE_LIMIT, MAX_CAPACITY
from akri_trio.model.resources import Configuration, Instance
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp

NODE = "node-a"
INST = "cam-8120fe"
POISON = [f"{INST}-{'7' * 5000}", f"{INST}-{MAX_CAPACITY}", f"{INST}-0x1", f"{INST}-", f"{INST}-01"]


# --- 9: a poisoned deviceUsage key is "not a slot" -------------------------------------------


@pytest.mark.parametrize("key", POISON)
def test_poisoned_key_is_not_a_slot_and_everything_still_answers(key: str) -> None:
    usage = {key: NODE, f"{INST}-1": "node-b"}
    assert slots.slot_index(INST, key) is None
    assert slots.poisoned_keys(INST, usage) == [key]
    assert slots.instance_devices(INST, 2, usage, NODE) == [
        DeviceView(f"{INST}-0", True),
        DeviceView(f"{INST}-1", False),
    ]
    new = slots.claim(usage, [f"{INST}-0"], NODE, instance=INST, capacity=2)
    assert new == {**usage, f"{INST}-0": NODE}  # the junk key is left as it is
    assert slots.preferred_slots(INST, 2, [NODE], NODE, [f"{INST}-0"], [], 1) == [f"{INST}-0"]
    assert slots.node_slots(INST, new, NODE) == [f"{INST}-0"]


@pytest.mark.parametrize("key", POISON)
def test_poisoned_key_leaves_the_configuration_plugin_working(key: str) -> None:
    instances = {INST: InstanceSlots(1, {key: f"C:cam-{'9' * 5000}:{NODE}"})}
    assert vdevs.config_devices("cam", instances, NODE) == [DeviceView("cam-0", True)]
    plan_ = vdevs.allocate(instances, [["cam-0"]], NODE, "cam")
    assert plan_.containers[0][0].slot == f"{INST}-0"
    assert vdevs.preferred_allocation("cam", instances, NODE, ["cam-0"], [], 1) == ["cam-0"]
    with pytest.raises(vdevs.BadVdev):
        vdevs.allocate(instances, [[f"cam-{'9' * 5000}"]], NODE, "cam")


@given(st.text(max_size=30), st.text(max_size=5))
def test_any_key_or_value_never_breaks_the_answers(suffix: str, value: str) -> None:
    usage = {f"{INST}-{suffix}": value, suffix: value}
    slots.instance_devices(INST, 3, usage, NODE)
    slots.claimable_slots(INST, 3, usage)
    vdevs.config_devices("cam", {INST: InstanceSlots(3, usage)}, NODE)


def _instance(usage: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": INST, "namespace": "ns", "resourceVersion": str(len(usage) + 1)},
        "spec": {
            "configurationName": "cam",
            "cdiName": "akri.sh/cam=8120fe",
            "capacity": 2,
            "nodes": [NODE],
            "deviceUsage": usage,
        },
    }


def test_the_view_logs_a_poisoned_key_once(caplog: pytest.LogCaptureFixture) -> None:
    view = NodeView(NODE)
    caplog.set_level(logging.WARNING, "akri_trio.agent.view")
    view.put_instance(_instance({POISON[0]: NODE}))
    view.put_instance(_instance({POISON[0]: NODE, f"{INST}-0": NODE}))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "is not a slot" in lines[0] and "(5011 chars)" in lines[0] and len(lines[0]) < 300


# --- 12: hash collisions: one device per Instance, the same in the plan and the plugin --------


def _config() -> Configuration:
    return structure(
        {
            "metadata": {"name": "cam", "namespace": "ns", "uid": "u"},
            "spec": {"discoveryHandler": {"name": "debugEcho"}, "capacity": 2},
        },
        Configuration,
    )


def _colliding() -> tuple[str, str]:
    seen: dict[str, str] = {}
    i = 0
    while True:
        device_id = f"dev{i}"
        digest = hashlib.blake2b(device_id.encode(), digest_size=3).hexdigest()
        if digest in seen:
            return seen[digest], device_id
        seen[digest] = device_id
        i += 1


def _found(device_id: str) -> DiscoveredDevice:
    return DiscoveredDevice(Device(device_id, {"ID": device_id}), True, "embedded")


def test_colliding_ids_give_the_plan_and_the_plugin_the_same_device() -> None:
    low, high = sorted(_colliding())
    config = _config()
    found = [_found(high), _found(low)]
    assignment = assign(NODE, config, found, {})
    ((name, winner),) = assignment.devices.items()
    assert winner.device.id == low
    (line,) = assignment.collisions
    assert repr(high) in line and repr(low) in line and name in line
    (op,) = plan(NODE, config, found, {})
    assert isinstance(op, Apply)
    assert op.body["spec"]["brokerProperties"] == {"ID": low}


def test_the_device_the_instance_already_describes_keeps_it() -> None:
    low, high = sorted(_colliding())
    config = _config()
    held = structure(desired_body(config, _found(high), NODE), Instance)
    existing = {held.metadata.name: held}
    assignment = assign(NODE, config, [_found(low), _found(high)], existing)
    assert [f.device.id for f in assignment.devices.values()] == [high]
    assert plan(NODE, config, [_found(low), _found(high)], existing) == []


# --- 8: a ListAndWatch answer fits in the kubelet's message limit -----------------------------


@given(st.lists(st.builds(DeviceView, st.text(max_size=300), st.booleans()), max_size=50))
def test_the_size_estimate_is_the_encoded_size(devices: list[DeviceView]) -> None:
    message = dp.ListAndWatchResponse(
        devices=[dp.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY) for d in devices]
    )
    assert device_list_size(devices) == message.ByteSize()


def test_within_message_limit_keeps_the_longest_head_that_fits() -> None:
    devices = [DeviceView(f"cam-{i}-{'x' * 200}", True) for i in range(5)]
    one = device_list_size(devices[:1])
    assert within_message_limit(devices, 3 * one) == devices[:3]
    assert within_message_limit(devices, 3 * one - 1) == devices[:2]


class _Huge:
    kind = "configuration"
    resource = "akri.sh/cam"
    preferred_allocation = True
    key = ObjectKey("ns", "cam")

    def devices(self) -> list[DeviceView]:
        return [DeviceView(f"cam-{i}-{'x' * 230}", True) for i in range(20_000)]


async def test_list_and_watch_never_sends_more_than_the_kubelet_accepts() -> None:
    service = DevicePluginService(_Huge(), NodeView(NODE))  # type: ignore[arg-type]
    stream = service.ListAndWatch(dp.Empty())
    with trio.fail_after(10):
        first = await stream.__anext__()
    await stream.aclose()  # type: ignore[attr-defined]
    assert 0 < first.ByteSize() <= KUBELET_MESSAGE_LIMIT
    assert len(first.devices) < 20_000


# --- 5: tenants sharing a name -----------------------------------------------------------------


def test_the_oldest_configuration_owns_its_name_then_the_first_namespace() -> None:
    a, b, c = ObjectKey("a", "cam"), ObjectKey("b", "cam"), ObjectKey("c", "cam")
    same: dict[ObjectKey, str | None] = {
        b: "2026-01-01T00:00:00Z",
        c: "2025-12-31T23:59:59Z",
        a: "2026-01-01T00:00:00Z",
    }
    assert tenants.name_owner(same) == c
    del same[c]
    assert tenants.name_owner(same) == a  # same second: namespace order
    assert tenants.name_owner({b: None, a: "2030-01-01T00:00:00Z"}) == a
    assert tenants.name_owner({}) is None
    assert tenants.siblings([a, b, ObjectKey("a", "other")], a) == [b]


# --- 4: a resolved secret never shows in a repr ------------------------------------------------


def test_a_discovery_request_repr_names_properties_but_never_their_values() -> None:
    request = DiscoveryRequest("ns/cam", "onvif", "", {"password": b"hunter2", "user": None})
    text = repr(request)
    assert "hunter2" not in text
    assert "password" in text and "user" in text
    assert "hunter2" not in repr([request]) and "hunter2" not in str(request)


# --- the status that reports all of it ---------------------------------------------------------


def _entry(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "node": NODE,
        "handler": "h",
        "handlers": {},
        "invalid_details": [],
        "unsolvable": None,
        "other_problems": [],
        "instances": 0,
        "previous": None,
        "now": "2026-01-01T00:00:00Z",
        "to_wall": str,
        **changes,
    }
    return node_entry(**args)


def _conditions(entry: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in entry["conditions"]}


def test_status_conditions_for_refused_devices_and_a_refused_configuration() -> None:
    fine = _conditions(_entry())
    assert fine["Accepted"] == ("True", "Accepted", "")
    assert fine["DevicesAccepted"] == ("True", "Accepted", "")
    bad = _conditions(
        _entry(
            refused_devices=[f"device {i} dropped" for i in range(25)],
            refused=("NameTaken", "belongs to b/cam"),
            unsolvable="x in other namespace",
            unsolvable_reason="OtherNamespace",
        )
    )
    assert bad["Accepted"] == ("False", "NameTaken", "belongs to b/cam")
    status, reason, message = bad["DevicesAccepted"]
    assert (status, reason) == ("False", "DevicesRefused")
    assert message.endswith("device 9 dropped; and 15 more")
    assert bad["PropertiesResolved"] == ("False", "OtherNamespace", "x in other namespace")


@given(
    st.lists(st.text(min_size=0, max_size=3000), max_size=40),
    st.integers(min_value=0, max_value=100_000),
)
def test_the_status_entry_stays_small_whatever_the_lines(lines: list[str], long: int) -> None:
    """However many lines, however long (one device's 5,000 problems, or many devices'), a
    node's status entry stays within a small fixed size: each list and message shows at most
    10 lines, each cut."""
    huge = "p" * long
    entry = _entry(
        refused_devices=[*lines, huge],
        invalid_details=[huge, *lines],
        other_problems=[*lines, huge],
        broker_info_problems=[*lines, huge],
        unsolvable=huge,
        refused=("NameTaken", huge),
    )
    assert len(json.dumps(entry)) < 80_000
    assert len(entry["problems"]) <= MAX_LISTED + 1
    for condition in entry["conditions"]:
        assert len(condition["message"]) <= MAX_LISTED * (MAX_LINE_CHARS + 5) + 20


def test_a_long_line_is_cut_and_the_rest_counted() -> None:
    entry = _entry(refused_devices=["x" * 5000] * 12, other_problems=["y" * 5000] * 12)
    message = _conditions(entry)["DevicesAccepted"][2]
    assert message.startswith("x" * MAX_LINE_CHARS + "...; ")
    assert message.endswith("...; and 2 more")
    assert entry["problems"][-1] == "and 2 more"
    assert entry["problems"][0] == "y" * MAX_LINE_CHARS + "..."


# --- kubelet resources are one namespace: never two plugins on one ---------------------------


def test_two_plugins_never_share_a_kubelet_resource() -> None:
    victim = InstancePlugin(ObjectKey("a", "cam-8120fe"), "cam")
    lookalike = ConfigPlugin("b", "cam-8120fe")  # a Configuration named like a's Instance
    same_name = ConfigPlugin("b", "cam")
    owner = ConfigPlugin("a", "cam")
    desired: set[Plugin] = {victim, lookalike, same_name, owner}
    kept, dropped = one_per_resource(desired, running=[])
    assert kept == {victim, owner}
    assert len(dropped) == 2 and all("not served" in line for line in dropped)
    kept, _ = one_per_resource(desired, running=[lookalike, same_name])  # the running one stays
    assert kept == {lookalike, same_name}
    assert one_per_resource({owner}, []) == ({owner}, [])
