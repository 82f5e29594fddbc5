"""Broker Services (akri_trio.controller.services)."""

from __future__ import annotations

from typing import Any

import attrs

from akri_trio.controller import (
    Delete,
    ObservedPod,
    broker_job,
    broker_pods,
    configuration_of,
    configuration_service,
    fingerprinted,
    instance_service,
    plan_services,
    up_to_date,
)
from tests.controller.objects import CONFIG, INSTANCE, configuration, instance, pod_json

SERVICE_SPEC = {"type": "ClusterIP", "selector": {"tier": "x"}, "ports": [{"port": 6052}]}
CONFIG_WITH_SERVICES = configuration(
    {"brokerPodSpec": {"containers": [{"name": "c"}]}},
    instanceServiceSpec=SERVICE_SPEC,
    configurationServiceSpec=SERVICE_SPEC,
)
INST = instance()
POD_LABELS = next(iter(broker_pods(CONFIG_WITH_SERVICES, INST).values()))["metadata"]["labels"]
ISVC, CSVC = f"{INSTANCE}-svc", f"{CONFIG}-svc"


def pod(phase: str, labels: dict[str, str] = POD_LABELS, deleting: bool = False) -> ObservedPod:
    return ObservedPod.of(pod_json("p", phase, labels, deleting=deleting))


def svc(
    name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"{name}-uid", "labels": labels}
    return {"metadata": {**meta, "annotations": annotations or {}}}


def test_instance_service_body() -> None:
    """Upstream's labels exactly (`-l akri.sh/configuration=X` finds the configuration Service
    alone); the Configuration is named in an annotation."""
    body = instance_service(CONFIG_WITH_SERVICES, INST)
    assert body is not None
    assert body["metadata"]["name"] == ISVC
    assert body["metadata"]["labels"] == {
        "app": ISVC,
        "controller": "akri.sh",
        "akri.sh/instance": INSTANCE,
    }
    assert body["metadata"]["annotations"] == {"akri.sh/configuration": CONFIG}
    assert configuration_of(body) == CONFIG
    assert body["metadata"]["ownerReferences"][0]["kind"] == "Instance"
    assert body["spec"]["selector"] == {
        "tier": "x",
        "controller": "akri.sh",
        "akri.sh/instance": INSTANCE,
    }
    assert body["spec"]["ports"] == [{"port": 6052}]
    assert SERVICE_SPEC["selector"] == {"tier": "x"}  # input untouched


def test_configuration_service_body() -> None:
    body = configuration_service(CONFIG_WITH_SERVICES)
    assert body is not None
    assert body["metadata"]["name"] == CSVC
    assert body["metadata"]["labels"] == {
        "app": CSVC,
        "controller": "akri.sh",
        "akri.sh/configuration": CONFIG,
    }
    assert "annotations" not in body["metadata"]
    assert configuration_of(body) == CONFIG
    owner = body["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Configuration", "c-uid", True)
    assert body["spec"]["selector"]["akri.sh/configuration"] == CONFIG


def test_no_service_spec_no_service() -> None:
    plain = configuration({"brokerPodSpec": {"containers": []}})
    assert instance_service(plain, INST) is None and configuration_service(plain) is None
    assert plan_services(plain, [INST], [pod("Running")], []).apply == ()


def test_services_wanted_once_a_broker_runs() -> None:
    assert plan_services(CONFIG_WITH_SERVICES, [INST], [pod("Pending")], []).apply == ()
    plan = plan_services(CONFIG_WITH_SERVICES, [INST], [pod("Running")], [])
    assert sorted(s["metadata"]["name"] for s in plan.apply) == sorted([ISVC, CSVC])


def test_existing_services_kept_while_a_broker_is_pending() -> None:
    existing = [
        svc(ISVC, {"akri.sh/instance": INSTANCE}),
        svc(CSVC, {"akri.sh/configuration": CONFIG}),
    ]
    plan = plan_services(CONFIG_WITH_SERVICES, [INST], [pod("Pending")], existing)
    assert len(plan.apply) == 2 and plan.delete == ()


def test_services_deleted_when_every_broker_ended_or_is_deleting() -> None:
    existing = [
        svc(ISVC, {"akri.sh/instance": INSTANCE}),
        svc(CSVC, {"akri.sh/configuration": CONFIG}),
        svc("other-svc", {"akri.sh/configuration": "other"}),
    ]
    pods = [pod("Failed"), pod("Running", deleting=True)]
    plan = plan_services(CONFIG_WITH_SERVICES, [INST], pods, existing)
    assert plan.apply == ()
    assert sorted(plan.delete, key=lambda d: d.name) == [
        Delete("ns", ISVC, f"{ISVC}-uid"),
        Delete("ns", CSVC, f"{CSVC}-uid"),
    ]


def test_job_broker_pods_are_selected_by_both_services() -> None:
    config = configuration(
        {"brokerJobSpec": {"template": {"spec": {"containers": []}}}},
        instanceServiceSpec=SERVICE_SPEC,
        configurationServiceSpec=SERVICE_SPEC,
    )
    job = broker_job(config, INST)
    assert job is not None
    job_pod_labels = job["spec"]["template"]["metadata"]["labels"]
    plan = plan_services(config, [INST], [pod("Running", job_pod_labels)], [])
    assert len(plan.apply) == 2
    for service in plan.apply:
        selector = service["spec"]["selector"]
        assert {k: v for k, v in selector.items() if k != "tier"}.items() <= job_pod_labels.items()


def test_a_deleting_configuration_wants_no_service() -> None:
    existing = [svc(CSVC, {"akri.sh/configuration": CONFIG})]
    live = configuration(instanceServiceSpec=SERVICE_SPEC, configurationServiceSpec={})
    meta = attrs.evolve(live.metadata, deletion_timestamp="2024-01-01T00:00:00Z")
    deleting = attrs.evolve(live, metadata=meta)
    plan = plan_services(deleting, [INST], [pod("Running")], existing)
    assert plan.apply == () and [d.name for d in plan.delete] == [CSVC]


def test_service_of_a_vanished_instance_is_deleted() -> None:
    body = instance_service(CONFIG_WITH_SERVICES, INST)
    assert body is not None
    left = svc(ISVC, body["metadata"]["labels"], body["metadata"]["annotations"])
    plan = plan_services(CONFIG_WITH_SERVICES, [], [], [left])
    assert [d.name for d in plan.delete] == [ISVC]


def test_fingerprint_tells_a_changed_body() -> None:
    body = instance_service(CONFIG_WITH_SERVICES, INST)
    assert body is not None
    applied = fingerprinted(body)
    assert up_to_date(applied, body)
    assert fingerprinted(applied) == applied  # its own annotation does not count
    other = {**body, "spec": {**body["spec"], "ports": [{"port": 7000}]}}
    assert not up_to_date(applied, other)
    assert not up_to_date(None, body)
    assert not up_to_date(svc(ISVC, {}), body)  # made by someone else: taken over once
