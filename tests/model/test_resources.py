"""Configuration / Instance models: upstream's JSON in, the same JSON out, clear errors."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from akri_trio.model.convert import error_messages, structure, unstructure
from akri_trio.model.resources import BrokerSpec, Configuration, Instance

UPSTREAM_ONVIF: dict[str, Any] = {
    "apiVersion": "akri.sh/v0",
    "kind": "Configuration",
    "metadata": {"name": "akri-onvif", "namespace": "default"},
    "spec": {
        "discoveryHandler": {
            "name": "onvif",
            "discoveryDetails": "ipAddresses:\n  action: Exclude\n  items: []\n",
            "discoveryProperties": [
                {"name": "username_default", "value": "admin"},
                {
                    "name": "password_default",
                    "valueFrom": {
                        "secretKeyRef": {"key": "pw", "name": "cam-secret", "namespace": "cams"}
                    },
                },
            ],
        },
        "capacity": 5,
        "brokerSpec": {
            "brokerPodSpec": {
                "containers": [
                    {
                        "name": "broker",
                        "image": "ghcr.io/project-akri/akri/onvif-video-broker:latest",
                        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
                        "xFutureField": {"kept": True},
                    }
                ]
            }
        },
        "instanceServiceSpec": {"type": "ClusterIP", "ports": [{"port": 80, "name": "grpc"}]},
        "configurationServiceSpec": {"type": "ClusterIP", "ports": [{"port": 80}]},
        "brokerProperties": {"RESOLUTION_WIDTH": "640"},
    },
}


def test_upstream_configuration_round_trips_unchanged() -> None:
    config = structure(UPSTREAM_ONVIF, Configuration, strict_keys=True)
    assert config.spec.capacity == 5
    assert config.spec.broker_spec == BrokerSpec(
        "pod", UPSTREAM_ONVIF["spec"]["brokerSpec"]["brokerPodSpec"]
    )
    props = config.spec.discovery_handler.discovery_properties
    assert props is not None
    assert props[1].value_from is not None
    assert props[1].value_from.secret_key_ref is not None
    assert props[1].value_from.secret_key_ref.namespace == "cams"
    assert unstructure(config) == UPSTREAM_ONVIF  # PodSpec kept whole, unknown fields included


def test_job_broker_round_trips() -> None:
    raw = {"brokerJobSpec": {"template": {"spec": {"containers": []}}, "backoffLimit": 0}}
    data = {
        "metadata": {"name": "j"},
        "spec": {"discoveryHandler": {"name": "x"}, "brokerSpec": raw},
    }
    config = structure(data, Configuration)
    assert config.spec.broker_spec is not None
    assert config.spec.broker_spec.kind == "job"
    assert unstructure(config)["spec"]["brokerSpec"] == raw


def test_defaults_match_upstream() -> None:
    config = structure(
        {"metadata": {"name": "c"}, "spec": {"discoveryHandler": {"name": "udev"}}}, Configuration
    )
    assert config.spec.capacity == 1
    assert config.spec.discovery_handler.discovery_details == ""
    assert config.spec.broker_spec is None
    assert config.spec.broker_properties == {}
    assert config.metadata.namespace == "default"


def test_debug_echo_example_parses() -> None:
    with open("k8s/examples/debug-echo.yaml") as f:
        config = structure(yaml.safe_load(f), Configuration, strict_keys=True)
    assert config.spec.discovery_handler.name == "debugEcho"
    details = yaml.safe_load(config.spec.discovery_handler.discovery_details)
    assert details == {"descriptions": ["foo0", "foo1"]}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, "required field missing @ $.spec.discoveryHandler"),
        ({"discoveryHandler": {}}, "required field missing @ $.spec.discoveryHandler.name"),
        (
            {"discoveryHandler": {"name": "x"}, "capacity": "2"},
            "expected int, got str '2' @ $.spec.capacity",
        ),
        (
            {"discoveryHandler": {"name": "x"}, "capacty": 2},
            "extra fields found (capacty) @ $.spec",
        ),
        (
            {
                "discoveryHandler": {"name": "x"},
                "brokerSpec": {"brokerPodSpec": {}, "brokerJobSpec": {}},
            },
            "exactly one of brokerPodSpec, brokerJobSpec",
        ),
        (
            {"discoveryHandler": {"name": "x"}, "brokerProperties": {"K": 1}},
            "expected str, got int 1 @ $.spec.brokerProperties['K']",
        ),
    ],
)
def test_strict_errors_name_the_field(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(Exception) as info:
        structure({"metadata": {"name": "c"}, "spec": spec}, Configuration, strict_keys=True)
    messages = error_messages(info.value)
    assert any(expected in m for m in messages), messages


def test_lenient_ignores_fields_from_newer_versions() -> None:
    data = {"metadata": {"name": "c"}, "spec": {"discoveryHandler": {"name": "x"}, "newThing": 1}}
    assert structure(data, Configuration).spec.discovery_handler.name == "x"


def test_instance_round_trip() -> None:
    data = {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": "akri-debug-echo-foo-8120fe", "namespace": "default"},
        "spec": {
            "configurationName": "akri-debug-echo-foo",
            "cdiName": "akri.sh/akri-debug-echo-foo=8120fe",
            "capacity": 2,
            "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": "foo0"},
            "shared": True,
            "nodes": ["node-a", "node-b"],
            "deviceUsage": {"akri-debug-echo-foo-8120fe-0": "node-a"},
        },
    }
    inst = structure(data, Instance, strict_keys=True)
    assert inst.spec.nodes == ("node-a", "node-b")
    assert unstructure(inst) == data


def test_nulls_from_the_api_server_read_as_absent() -> None:
    data = {
        "metadata": {"name": "i", "finalizers": None, "deletionTimestamp": None},
        "spec": {
            "configurationName": "c",
            "cdiName": "akri.sh/c=1",
            "capacity": 1,
            "nodes": None,
            "deviceUsage": None,
        },
    }
    inst = structure(data, Instance)
    assert inst.metadata.finalizers == ()
    assert inst.spec.nodes == () and inst.spec.device_usage == {}
