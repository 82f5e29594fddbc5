"""What the controller caches and which changes wake which reconciler (triggers.py's transforms
and mappers), without a cluster: a busy kubelet or an agent writing status must wake nobody."""

from __future__ import annotations

from typing import Any

from akri_trio.controller.triggers import (
    configuration_to_instances,
    instance_to_configuration,
    instance_to_services,
    labelled,
    make_caches,
    never,
    pod_to_services,
    service_to_configurations,
    slim_node,
    slim_pod,
    through,
    when_changed,
)
from akri_trio.kube import JSON, Apply, Change, Init, InitApply, InitDone, ObjectKey, Store
from akri_trio.model import naming


def _instance(name: str, config: str = "cfg") -> JSON:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name},
        "spec": {"configurationName": config, "cdiName": f"akri.sh/{config}={name}", "capacity": 1},
    }


def _configuration(**meta: Any) -> JSON:
    return {
        "metadata": {"name": "cfg", "namespace": "ns", "uid": "c", **meta},
        "spec": {"discoveryHandler": {"name": "debugEcho"}},
    }


def _pod(phase: str, **status: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "labels": {naming.LABEL_INSTANCE: "i"},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": phase, **status},
    }


def test_a_pods_status_churn_is_not_cached() -> None:
    a = slim_pod(_pod("Running", conditions=[{"type": "Ready", "status": "True"}]))
    b = slim_pod(_pod("Running", conditions=[{"type": "Ready", "status": "False"}], podIP="1"))
    assert a == b and "spec" not in a and "managedFields" not in a["metadata"]
    assert slim_pod(_pod("Failed")) != a


def test_a_pods_claims_are_cached_by_name() -> None:
    pod = _pod("Running")
    pod["spec"] = {"resourceClaims": [{"name": "akri", "resourceClaimTemplateName": "t"}]}
    assert slim_pod(pod)["spec"] == {"resourceClaims": [{"name": "akri"}]}


def test_a_nodes_heartbeats_are_not_cached() -> None:
    def node(ready: str, beat: str) -> dict[str, object]:
        cond = {"type": "Ready", "status": ready, "lastHeartbeatTime": beat}
        other = {"type": "MemoryPressure", "status": "False"}
        return {"metadata": {"name": "n"}, "status": {"conditions": [cond, other], "images": [1]}}

    assert slim_node(node("True", "t1")) == slim_node(node("True", "t2"))
    assert slim_node(node("True", "t1")) != slim_node(node("False", "t1"))
    # When Ready last changed is kept: a NotReady node's grace at start is counted from it.
    changed = node("False", "t1")
    changed["status"]["conditions"][0]["lastTransitionTime"] = "t0"  # type: ignore[index]
    (ready,) = slim_node(changed)["status"]["conditions"]
    assert ready == {"type": "Ready", "status": "False", "lastTransitionTime": "t0"}


def test_unchanged_cached_objects_wake_nobody() -> None:
    mapper = when_changed(lambda change: [change.key])
    key = ObjectKey("ns", "p")
    pod = slim_pod(_pod("Running"))
    assert list(mapper(Change(key, pod, dict(pod)))) == []
    assert list(mapper(Change(key, pod, None))) == [key]


def test_configuration_status_writes_do_not_reconcile_its_instances() -> None:
    caches = make_caches()
    inst = _instance("cfg-1")
    for event in (Init(), InitApply(inst), InitDone()):
        caches.instances.apply(event)
    mapper = configuration_to_instances(caches.instances)
    decode = caches.configurations.decode
    cfg = _configuration(generation=1)
    key = ObjectKey("ns", "cfg")
    with_status = decode({**cfg, "status": {"nodes": [{"node": "a"}]}})
    assert list(mapper(Change(key, decode(cfg), with_status))) == []
    bumped = {
        **cfg,
        "metadata": {**cfg["metadata"], "generation": 2},
        "spec": {**cfg["spec"], "capacity": 3},
    }
    assert set(mapper(Change(key, decode(cfg), decode(bumped)))) == {ObjectKey("ns", "cfg-1")}
    typed = caches.instances.get(ObjectKey("ns", "cfg-1"))
    assert set(instance_to_configuration(Change(ObjectKey("ns", "cfg-1"), None, typed))) == {key}
    caches.instances.apply(Apply(inst))  # the store still answers by index after an update
    assert caches.instances.keys_for("config", key) == {ObjectKey("ns", "cfg-1")}


def _fill(store: Store[Any], *objs: JSON) -> None:
    store.apply(Init())
    for obj in objs:
        store.apply(InitApply(obj))
    store.apply(InitDone())


def test_broker_churn_reconciles_services_only_when_it_can_change_them() -> None:
    caches = make_caches()
    config = ObjectKey("ns", "cfg")
    labels = {naming.LABEL_INSTANCE: "i", naming.LABEL_CONFIGURATION: "cfg"}
    _fill(caches.configurations, _configuration())
    _fill(caches.instances, _instance("i"))
    inst = caches.instances.get(ObjectKey("ns", "i"))
    _fill(caches.services)

    def pod(phase: str | None) -> dict[str, object] | None:
        if phase is None:
            return None
        raw = _pod(phase)
        raw["metadata"]["labels"] = labels  # type: ignore[index]
        return slim_pod(raw)

    def mapped(old: str | None, new: str | None) -> list[ObjectKey]:
        return list(pods(Change(ObjectKey("ns", "p"), pod(old), pod(new))))

    pods = pod_to_services(caches, lambda change: {config})
    instances = instance_to_services(caches)
    # No Service yet: only a broker starting or stopping to run matters.
    assert mapped(None, "Pending") == [] and mapped("Pending", "Failed") == []
    assert mapped("Pending", "Running") == [config] and mapped("Running", None) == [config]
    assert list(instances(Change(ObjectKey("ns", "i"), None, inst))) == []
    _fill(caches.pods, pod("Running"))  # type: ignore[arg-type]
    assert list(instances(Change(ObjectKey("ns", "i"), None, inst))) == [config]
    # With a Service, every broker change may keep or drop it.
    svc = {"metadata": {"name": "cfg-svc", "namespace": "ns", "labels": labels}}
    _fill(caches.services, svc)
    assert mapped(None, "Pending") == [config] and mapped("Pending", "Failed") == [config]


def test_a_labelled_broker_maps_to_its_instance_and_a_service_to_its_configuration() -> None:
    caches = make_caches()
    _fill(caches.configurations, _configuration())
    _fill(caches.instances, _instance("i"))
    inst = caches.instances.get(ObjectKey("ns", "i"))
    instance_of = through(caches.instances, "label", labelled(naming.LABEL_INSTANCE))
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {naming.LABEL_INSTANCE: "i"}}}
    assert set(instance_of(Change(ObjectKey("ns", "p"), None, pod))) == {ObjectKey("ns", "i")}
    stray = {"metadata": {"name": "q", "namespace": "ns"}}
    assert set(instance_of(Change(ObjectKey("ns", "q"), None, stray))) == set()
    # An instance Service names only its Instance; its Configuration is found through it.
    svc = {"metadata": {"name": "i-svc", "namespace": "ns", "labels": {naming.LABEL_INSTANCE: "i"}}}
    mapper = service_to_configurations(caches)
    assert set(mapper(Change(ObjectKey("ns", "i-svc"), svc, None))) == {ObjectKey("ns", "cfg")}
    assert list(never(Change(ObjectKey("ns", "i"), None, inst))) == []
