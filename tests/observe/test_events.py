"""Events: dedup and rate-limit decisions (pure, on a fake clock), which agent changes mean
which Events, and a recorder that never blocks its caller."""

from __future__ import annotations

import itertools

import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.events import AgentEvents, condition_events, device_events
from akri_trio.kube.events import (
    Correlator,
    Create,
    Drop,
    EventRecorder,
    ObjectRef,
    Patch,
    Recorded,
    event_body,
)

CAM = ObjectRef("akri.sh/v0", "Configuration", "ns", "cam", "uid-1")
names = (f"cam.{i}" for i in itertools.count())


def correlator(**kw: float) -> Correlator:
    return Correlator(new_name=lambda ref: next(names), **kw)  # type: ignore[arg-type]


def test_same_event_is_one_object_with_a_count() -> None:
    c = correlator()
    e = Recorded(CAM, "Warning", "HandlerUnavailable", "n1: no handler")
    first = c.decide(e, 0.0)
    assert isinstance(first, Create) and first.count == 1
    assert c.decide(e, 1.0) == Patch(first.name, 2)
    assert c.decide(e, 2.0) == Patch(first.name, 3)
    other = c.decide(Recorded(CAM, "Warning", "HandlerUnavailable", "n2: no handler"), 3.0)
    assert isinstance(other, Create) and other.name != first.name
    c.forget(e)
    assert isinstance(c.decide(e, 4.0), Create)
    restarted = c.restart(e)
    assert c.decide(e, 5.0) == Patch(restarted.name, 2)


def test_burst_then_one_per_refill_period_per_object() -> None:
    c = correlator(burst=3, refill_s=300.0)
    events = [Recorded(CAM, "Normal", "DeviceFound", f"d{i}") for i in range(10)]
    decided = [c.decide(e, 0.0) for e in events[:5]]
    assert [isinstance(d, Drop) for d in decided] == [False, False, False, True, True]
    assert isinstance(c.decide(events[5], 299.0), Drop)
    assert isinstance(c.decide(events[6], 301.0), Create)
    # another object has its own bucket
    other = ObjectRef("akri.sh/v0", "Instance", "ns", "cam-1")
    assert isinstance(c.decide(Recorded(other, "Normal", "DeviceFound", "x"), 301.0), Create)


def test_memory_is_bounded() -> None:
    c = correlator(max_keys=4)
    for i in range(20):
        c.decide(Recorded(ObjectRef("v1", "K", "ns", f"o{i}"), "Normal", "R", "m"), float(i))
    assert len(c._seen) <= 4 and len(c._buckets) <= 4


def test_event_body_is_what_kubectl_describe_lists() -> None:
    e = Recorded(CAM, "Warning", "AllocateRefused", "why")
    body = event_body(e, "cam.1", component="akri-agent", host="n1", first="t0", last="t1", count=2)
    assert body["involvedObject"] == {
        "apiVersion": "akri.sh/v0", "kind": "Configuration", "namespace": "ns", "name": "cam",
        "uid": "uid-1",
    }  # fmt: skip
    assert (body["metadata"], body["count"], body["source"]) == (
        {"name": "cam.1", "namespace": "ns"},
        2,
        {"component": "akri-agent", "host": "n1"},
    )


def _entry(**conds: tuple[str, str]) -> dict[str, object]:
    return {
        "node": "n1",
        "conditions": [{"type": t, "status": s, "message": m} for t, (s, m) in conds.items()],
    }


def test_condition_events_on_turning_false_or_a_new_message() -> None:
    ok = _entry(HandlerAvailable=("True", ""), DiscoveryDetailsValid=("True", ""))
    bad = _entry(HandlerAvailable=("False", "none"), DiscoveryDetailsValid=("False", "bad: x"))
    assert condition_events(None, ok) == []
    assert condition_events(ok, bad) == [
        ("HandlerUnavailable", "n1: none"),
        ("DiscoveryDetailsRejected", "n1: bad: x"),
    ]
    assert condition_events(bad, bad) == []
    worse = _entry(HandlerAvailable=("False", "none"), DiscoveryDetailsValid=("False", "bad: y"))
    assert condition_events(bad, worse) == [("DiscoveryDetailsRejected", "n1: bad: y")]
    props = _entry(PropertiesResolved=("False", "Secret ns/s missing"))
    assert condition_events(None, props) == [("PropertiesUnresolved", "n1: Secret ns/s missing")]
    refused = _entry(Accepted=("False", "name taken"), DevicesAccepted=("False", "d dropped"))
    assert condition_events(None, refused) == [
        ("ConfigurationRefused", "n1: name taken"),
        ("DevicesRefused", "n1: d dropped"),
    ]


def test_device_events() -> None:
    assert device_events(["a", "b"], ["b", "c"]) == [("DeviceFound", "c"), ("DeviceLost", "a")]


async def test_recorder_never_blocks_and_counts_drops() -> None:
    recorder = EventRecorder(None, "akri-agent", "n1", queue_size=2)  # type: ignore[arg-type]
    for i in range(5):
        recorder.warning(CAM, "R", f"m{i}")
    assert recorder.dropped == 3


async def test_agent_events_without_a_recorder_do_nothing() -> None:
    events = AgentEvents()
    events.devices(ObjectKey("ns", "cam"), [ObjectKey("ns", "cam-1")])
    events.allocate_refused(ObjectKey("ns", "cam-1"), "instance", [["x"]], "why")
    events.slots_reclaimed(ObjectKey("ns", "cam-1"), ["cam-1-0"])
    await trio.lowlevel.checkpoint()


async def test_agent_events_found_lost_refused_reclaimed() -> None:
    recorder = EventRecorder(None, "akri-agent", "n1")  # type: ignore[arg-type]
    inst = ObjectRef("akri.sh/v0", "Instance", "ns", "cam-1", "u2")
    events = AgentEvents(recorder, "n1", configuration=lambda key: None, instance=lambda key: inst)
    key = ObjectKey("ns", "cam")
    events.devices(key, [])  # the first, empty, result says nothing
    events.devices(key, [ObjectKey("ns", "cam-1")])
    events.devices(key, [])
    events.allocate_refused(ObjectKey("ns", "cam-1"), "instance", [["cam-1-7"]], "no slot cam-1-7")
    events.slots_reclaimed(ObjectKey("ns", "cam-1"), ["cam-1-0"])
    got = []
    while True:
        try:
            got.append(recorder._receive.receive_nowait())
        except trio.WouldBlock:
            break
    assert [(e.obj.kind, e.type, e.reason) for e in got] == [
        ("Configuration", "Normal", "DeviceFound"),
        ("Configuration", "Normal", "DeviceLost"),
        ("Instance", "Warning", "AllocateRefused"),
        ("Instance", "Normal", "SlotReclaimed"),
    ]
    assert got[2].message == "n1: Allocate of cam-1-7 refused: no slot cam-1-7"
