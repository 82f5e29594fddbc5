"""Configuration admission (akri_trio.webhook.validate, parsers)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.interface import InvalidDetails
from akri_trio.webhook import (
    MAX_CAPACITY,
    BadReview,
    Schemas,
    builtin_parser,
    review,
    validate_configuration,
)
from akri_trio.webhook.validate import parse_handler_namespaces
from tests.webhook.schema import DOCUMENT

SCHEMAS = Schemas(DOCUMENT)

VALID: dict[str, Any] = {
    "apiVersion": "akri.sh/v0",
    "kind": "Configuration",
    "metadata": {
        "name": "akri-debug-echo-foo",
        "namespace": "cams",
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {
        "discoveryHandler": {
            "name": "debugEcho",
            "discoveryDetails": "descriptions: [bar0, bar1]\n",
            "discoveryProperties": [
                {"name": "plain", "value": "x"},
                {
                    "name": "secret_one",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "namespace": "cams"}},
                },
            ],
        },
        "capacity": 2,
        "brokerSpec": {
            "brokerPodSpec": {
                "containers": [
                    {
                        "name": "nginx",
                        "image": "nginx:stable-alpine",
                        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
                    }
                ]
            }
        },
        "instanceServiceSpec": {"type": "ClusterIP", "ports": [{"port": 6052}]},
        "configurationServiceSpec": {"type": "ClusterIP", "ports": [{"port": 6052}]},
        "brokerProperties": {"A": "b"},
    },
}


def with_spec(**changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(VALID)
    config["spec"].update(changes)
    return config


def handler(**changes: Any) -> dict[str, Any]:
    return {**VALID["spec"]["discoveryHandler"], **changes}


def problems(config: dict[str, Any], **kw: Any) -> list[str]:
    return validate_configuration(config, SCHEMAS, **kw)


def test_valid_configuration_has_no_problems() -> None:
    assert problems(VALID) == []


def test_unknown_field_in_broker_pod_spec() -> None:
    config = copy.deepcopy(VALID)
    config["spec"]["brokerSpec"]["brokerPodSpec"]["containers"][0]["xUnknownSyntheticField"] = 1
    assert problems(config) == [
        "spec.brokerSpec.brokerPodSpec.containers[0].xUnknownSyntheticField: unknown field"
    ]


def test_unknown_and_mistyped_fields_in_services_and_job() -> None:
    config = with_spec(
        brokerSpec={
            "brokerJobSpec": {"template": {"spec": {"containers": []}}, "parallelism": "2"}
        },
        instanceServiceSpec={"ports": [{"port": 1, "nodePortt": 2}]},
        configurationServiceSpec={"type": 1},
    )
    assert problems(config) == [
        "spec.brokerSpec.brokerJobSpec.parallelism: expected an integer, got a string",
        "spec.instanceServiceSpec.ports[0].nodePortt: unknown field",
        "spec.configurationServiceSpec.type: expected a string, got an integer",
    ]


@pytest.mark.parametrize(
    ("broker", "which"),
    [
        ({"brokerPodSpec": {"containers": []}, "brokerJobSpec": {"template": {}}}, "both"),
        ({}, "neither"),
    ],
)
def test_broker_spec_needs_exactly_one_kind(broker: dict[str, Any], which: str) -> None:
    assert problems(with_spec(brokerSpec=broker)) == [
        f"spec.brokerSpec: exactly one of brokerPodSpec, brokerJobSpec is needed, got {which}"
    ]


def test_broker_spec_may_be_absent_or_null() -> None:
    assert problems(with_spec(brokerSpec=None)) == []
    config = copy.deepcopy(VALID)
    del config["spec"]["brokerSpec"]
    assert problems(config) == []


def test_spec_level_unknown_and_mistyped_fields() -> None:
    assert problems(with_spec(capacty=2, brokerProperties={"A": 1})) == [
        "spec.brokerProperties['A']: expected str, got int 1",
        "spec: extra fields found (capacty)",
    ]


@pytest.mark.parametrize("capacity", [0, -1, MAX_CAPACITY + 1])
def test_capacity_out_of_range(capacity: int) -> None:
    assert problems(with_spec(capacity=capacity)) == [
        f"spec.capacity: must be between 1 and {MAX_CAPACITY}, got {capacity}"
    ]


def test_capacity_bounds_are_allowed() -> None:
    assert problems(with_spec(capacity=1)) == problems(with_spec(capacity=MAX_CAPACITY)) == []


CONFIG_MAP_REF = {"name": "c", "key": "k", "namespace": "cams"}


def test_property_names_and_exclusivity() -> None:
    props = [
        {"name": "1bad"},
        {
            "name": "ok",
            "value": "x",
            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "namespace": "cams"}},
        },
        {"name": "refs", "valueFrom": {}},
        {"name": "ok", "value": "again"},
    ]
    where = "spec.discoveryHandler.discoveryProperties"
    assert problems(with_spec(discoveryHandler=handler(discoveryProperties=props))) == [
        f"{where}[0].name: '1bad' is not a name of letters, digits and '_' that starts with a "
        "letter or '_'",
        f"{where}[0]: exactly one of value, valueFrom is needed, got neither",
        f"{where}[1]: exactly one of value, valueFrom is needed, got both",
        f"{where}[2].valueFrom: exactly one of secretKeyRef, configMapKeyRef is needed, "
        "got neither",
        f"{where}[3].name: 'ok' is already discoveryProperties[1]",
    ]


def test_reference_to_another_namespace_is_refused() -> None:
    other = {"secretKeyRef": {"name": "s", "key": "k", "namespace": "kube-system"}}
    omitted = {"configMapKeyRef": {"name": "c", "key": "k"}}
    props = [{"name": "a", "valueFrom": other}, {"name": "b", "valueFrom": omitted}]
    where = "spec.discoveryHandler.discoveryProperties"
    assert problems(with_spec(discoveryHandler=handler(discoveryProperties=props))) == [
        f"{where}[0].valueFrom.secretKeyRef.namespace: 'kube-system' is not the Configuration's "
        "namespace 'cams'; a Configuration may only read its own namespace (leave `namespace` "
        "out for its own)",
    ]  # [1] names no namespace: the Configuration's own, as upstream for one in `default`


def test_request_namespace_wins_over_metadata() -> None:
    assert problems(VALID, namespace="cams") == []
    assert len(problems(VALID, namespace="elsewhere")) == 1


def test_details_refused_by_the_builtin_handler_parser() -> None:
    config = with_spec(discoveryHandler=handler(discoveryDetails="descriptions: 3\n"))
    assert problems(config) == [
        "spec.discoveryHandler.discoveryDetails.descriptions: must be a list of strings, got int"
    ]


def test_udev_details_use_the_udev_parser() -> None:
    details = "udevRules: ['KERNEL==\"video0\"']\npermissions: xyz\n"
    config = with_spec(discoveryHandler={"name": "udev", "discoveryDetails": details})
    (problem,) = problems(config)
    assert problem.startswith("spec.discoveryHandler.discoveryDetails.permissions: ")


def test_unknown_handler_details_are_not_judged() -> None:
    config = with_spec(discoveryHandler={"name": "myHandler", "discoveryDetails": ": : :"})
    assert problems(config) == []


def test_a_parser_that_crashes_is_reported_not_raised() -> None:
    def crash(text: str) -> object:
        raise RuntimeError("boom")

    assert problems(VALID, parser_for=lambda name: crash) == [
        "spec.discoveryHandler.discoveryDetails: debugEcho cannot use them: boom"
    ]


def test_handler_name_change_on_update_is_refused() -> None:
    renamed = with_spec(discoveryHandler=handler(name="myHandler"))
    assert problems(renamed, old=VALID) == [
        "spec.discoveryHandler.name: cannot change ('debugEcho' -> 'myHandler'); "
        "create a new Configuration instead"
    ]
    assert problems(with_spec(capacity=3), old=VALID) == []


def test_name_too_long_for_instances() -> None:
    config = copy.deepcopy(VALID)
    config["metadata"]["name"] = "a" * 247
    assert problems(config)[0].startswith("metadata.name: at most 246 characters")


def test_builtin_parser_is_the_handlers_own() -> None:
    from akri_trio.discovery.handlers.debug_echo import parse_details

    parse = builtin_parser("debugEcho")
    assert parse is not None
    assert parse("descriptions: [a]") == parse_details("descriptions: [a]")
    with pytest.raises(InvalidDetails):
        parse("")
    assert builtin_parser("notShipped") is None


# --- AdmissionReview -----------------------------------------------------------------------------


def admission(
    obj: dict[str, Any],
    version: str = "admission.k8s.io/v1",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "akri.sh", "version": "v0", "kind": "Configuration"},
        "resource": {"group": "akri.sh", "version": "v0", "resource": "configurations"},
        "namespace": "cams",
        "operation": operation,
        "object": obj,
        "oldObject": old,
    }
    return {"apiVersion": version, "kind": "AdmissionReview", "request": request}


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_review_allows_valid_and_echoes_uid_and_version(version: str) -> None:
    assert review(admission(VALID, version), SCHEMAS) == {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "response": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True},
    }


def test_review_denies_with_the_field_path() -> None:
    config = with_spec(capacity=0)
    response = review(admission(config, "admission.k8s.io/v1beta1"), SCHEMAS)
    assert response["apiVersion"] == "admission.k8s.io/v1beta1"
    body = response["response"]
    assert body["allowed"] is False and body["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert body["status"]["code"] == 422
    assert body["status"]["message"] == (
        "Configuration akri-debug-echo-foo is invalid: "
        f"spec.capacity: must be between 1 and {MAX_CAPACITY}, got 0"
    )


def test_review_update_compares_with_old_object() -> None:
    renamed = with_spec(discoveryHandler=handler(name="other"))
    assert (
        review(admission(renamed, operation="UPDATE", old=VALID), SCHEMAS)["response"]["allowed"]
        is False
    )
    assert (
        review(admission(renamed, operation="CREATE", old=VALID), SCHEMAS)["response"]["allowed"]
        is True
    )


def test_review_allows_what_it_does_not_judge() -> None:
    assert review(admission({}, operation="DELETE"), SCHEMAS)["response"]["allowed"]
    pod = admission({})
    pod["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    assert review(pod, SCHEMAS)["response"]["allowed"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {"uid": "u"}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 1}},
    ],
)
def test_not_an_admission_review(body: dict[str, Any]) -> None:
    with pytest.raises(BadReview):
        review(body, SCHEMAS)


_field_names = st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=12)


@given(st.dictionaries(_field_names, st.integers(), min_size=1, max_size=3))
def test_any_unknown_container_field_is_refused_by_path(extra: dict[str, int]) -> None:
    config = copy.deepcopy(VALID)
    container = config["spec"]["brokerSpec"]["brokerPodSpec"]["containers"][0]
    unknown = {k: v for k, v in extra.items() if k not in container}
    container.update(unknown)
    where = "spec.brokerSpec.brokerPodSpec.containers[0]"
    assert sorted(problems(config)) == sorted(f"{where}.{k}: unknown field" for k in unknown)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=6,
)
_spec_keys = st.sampled_from([*VALID["spec"], "other"])
_handler_keys = st.sampled_from([*VALID["spec"]["discoveryHandler"], "other"])


@given(
    st.dictionaries(_spec_keys, _json, max_size=4),
    st.dictionaries(_handler_keys, _json, max_size=3),
    st.one_of(st.none(), _json),
)
def test_any_json_gets_an_answer_never_an_exception(
    spec: dict[str, Any], discovery_handler: dict[str, Any], old_spec: Any
) -> None:
    if "discoveryHandler" not in spec:
        spec["discoveryHandler"] = handler(**discovery_handler)
    config = with_spec(**spec)
    old = {"spec": old_spec}
    found = problems(config, old=old)
    assert all(isinstance(p, str) and ": " in p for p in found)


def test_review_refuses_a_create_of_a_name_another_namespace_uses() -> None:
    used = {"akri-debug-echo-foo": ["team-b", "cams"]}
    body = review(admission(VALID), SCHEMAS, namespaces_using=lambda n: used.get(n, []))
    response = body["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "Configuration akri-debug-echo-foo is invalid: metadata.name: a Configuration "
        "akri-debug-echo-foo already exists in namespace team-b; kubelet resources "
        "(akri.sh/akri-debug-echo-foo) are per node, not per namespace, so agents would refuse "
        "this one on every node: choose another name"
    )


def test_review_allows_the_name_in_its_own_namespace_and_on_update() -> None:
    own = review(admission(VALID), SCHEMAS, namespaces_using=lambda n: ["cams"])
    assert own["response"]["allowed"] is True
    # An UPDATE of a Configuration that already collides is not blocked (agents decide which
    # one a node serves): only new collisions are refused.
    update = admission(VALID, operation="UPDATE", old=VALID)
    assert review(update, SCHEMAS, namespaces_using=lambda n: ["team-b"])["response"]["allowed"]


# --- handlers restricted to namespaces (--handler-namespace) ------------------------------------


def test_handler_namespaces_parse_from_flag_entries() -> None:
    assert parse_handler_namespaces(["udev:device-ops", "udev:kube-system", "onvif:cams"]) == {
        "udev": frozenset({"device-ops", "kube-system"}),
        "onvif": frozenset({"cams"}),
    }
    for bad in ["udev", "udev:", ":ops"]:
        with pytest.raises(ValueError, match="is not HANDLER:NAMESPACE"):
            parse_handler_namespaces([bad])


def test_review_refuses_a_handler_the_namespace_may_not_use() -> None:
    udev = with_spec(discoveryHandler=handler(name="udev", discoveryDetails="udevRules: []\n"))
    policy = {"udev": frozenset({"device-ops"})}
    response = review(admission(udev), SCHEMAS, handler_namespaces=policy)["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "Configuration akri-debug-echo-foo is invalid: spec.discoveryHandler.name: namespace "
        "cams may not use the udev discovery handler (the cluster admin allows it in: "
        "device-ops)"
    )
    # Updates too (a Configuration admitted before the policy cannot be edited into use) ...
    update = admission(udev, operation="UPDATE", old=udev)
    assert review(update, SCHEMAS, handler_namespaces=policy)["response"]["allowed"] is False
    # ... while a handler no entry names, and the allowed namespace, pass.
    assert review(admission(VALID), SCHEMAS, handler_namespaces=policy)["response"]["allowed"]
    allowed = {"udev": frozenset({"cams"})}
    assert review(admission(udev), SCHEMAS, handler_namespaces=allowed)["response"]["allowed"]
    assert review(admission(udev), SCHEMAS)["response"]["allowed"]  # no policy: as before
