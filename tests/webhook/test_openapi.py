"""Checking values against OpenAPI v2 definitions (akri_trio.webhook.openapi)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.webhook import Schemas, is_quantity
from tests.webhook.schema import DOCUMENT

SCHEMAS = Schemas(DOCUMENT)
POD = "io.k8s.api.core.v1.PodSpec"


def pod_problems(spec: dict[str, Any]) -> list[str]:
    return SCHEMAS.problems(spec, POD, "pod")


def test_valid_pod_spec_has_no_problems() -> None:
    spec = {
        "containers": [
            {
                "name": "c",
                "image": "nginx",
                "resources": {"limits": {"{{PLACEHOLDER}}": "1", "cpu": "500m", "memory": 1024}},
                "ports": [{"containerPort": 80}],
                "livenessProbe": {"httpGet": {"port": "http", "path": "/"}},
            }
        ],
        "nodeSelector": {"zone": "a"},
        "affinity": {"anything": ["goes", 1]},
        "activeDeadlineSeconds": 2**40,
        "hostNetwork": False,
        "weights": [1, 2.5],
    }
    assert pod_problems(spec) == []


def test_unknown_field_named_with_its_path() -> None:
    spec = {"containers": [{"name": "c", "xUnknownSyntheticField": 1}]}
    assert pod_problems(spec) == ["pod.containers[0].xUnknownSyntheticField: unknown field"]


def test_mistyped_fields_named_with_their_paths() -> None:
    spec = {
        "containers": {"name": "c"},
        "initContainers": [{"name": 3, "ports": [{"containerPort": "80"}]}],
        "hostNetwork": "yes",
        "nodeSelector": {"zone": 1},
        "weights": [True],
    }
    assert sorted(pod_problems(spec)) == [
        "pod.containers: expected an array, got an object",
        "pod.hostNetwork: expected a boolean, got a string",
        "pod.initContainers[0].name: expected a string, got an integer",
        "pod.initContainers[0].ports[0].containerPort: expected an integer, got a string",
        "pod.nodeSelector.zone: expected a string, got an integer",
        "pod.weights[0]: expected a number, got a boolean",
    ]


def test_required_fields() -> None:
    assert pod_problems({"initContainers": [{}]}) == [
        "pod.containers: required",
        "pod.initContainers[0].name: required",
    ]


def test_int_or_string() -> None:
    def probe(port: Any) -> list[str]:
        container = {"name": "c", "livenessProbe": {"httpGet": {"port": port}}}
        return pod_problems({"containers": [container]})

    assert probe(8080) == [] and probe("http") == []
    assert probe(True) == [
        "pod.containers[0].livenessProbe.httpGet.port: expected an integer or a string, "
        "got a boolean"
    ]
    assert probe(1.5) != []


def test_quantities() -> None:
    def limits(value: Any) -> list[str]:
        return pod_problems({"containers": [{"name": "c", "resources": {"limits": {"x": value}}}]})

    for good in ("1", "500m", "2Gi", "1e3", "0.5", ".5", "+1k", "-2", 3, 0.25):
        assert limits(good) == [], good
    for bad in ("abc", "1.2.3", "2 Gi", "1Gb", "", True, [1]):
        assert limits(bad), bad


def test_int32_range() -> None:
    def port(value: int) -> list[str]:
        return pod_problems({"containers": [{"name": "c", "ports": [{"containerPort": value}]}]})

    assert port(2**31 - 1) == []
    assert port(2**31) == [
        "pod.containers[0].ports[0].containerPort: 2147483648 is out of the int32 range"
    ]


def test_null_free_form_preserved_and_undefined_refs_are_accepted() -> None:
    spec = {
        "containers": [{"name": "c", "image": None}],
        "raw": {"any": {"thing": [1]}},
        "preserved": {"known": "x", "other": {"y": 1}},
        "affinity": "not even an object",
    }
    assert pod_problems(spec) == []
    assert pod_problems({"containers": [], "preserved": {"known": 1}}) == [
        "pod.preserved.known: expected a string, got an integer"
    ]


def test_job_spec_template_walked_into_pod_spec() -> None:
    job = {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"nam": 1}]}}}
    assert SCHEMAS.problems(job, "io.k8s.api.batch.v1.JobSpec", "job") == [
        "job.template.spec.containers[0].name: required",
        "job.template.spec.containers[0].nam: unknown field",
    ]


def test_service_spec() -> None:
    service = {"ports": [{"port": 80, "targetPort": "web", "nodePort": 1}], "type": "ClusterIP"}
    assert SCHEMAS.problems(service, "io.k8s.api.core.v1.ServiceSpec", "svc") == [
        "svc.ports[0].nodePort: unknown field"
    ]


@pytest.mark.parametrize("missing", ["io.k8s.api.core.v1.Nothing", ""])
def test_a_definition_the_document_lacks_accepts_anything(missing: str) -> None:
    assert SCHEMAS.problems({"x": 1}, missing, "x") == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(_json)
def test_free_form_object_accepts_any_object(value: Any) -> None:
    assert pod_problems({"containers": [], "raw": {"v": value}}) == []


@given(st.integers(), st.integers(-3, 3), st.sampled_from(["", "m", "k", "Ki", "Mi", "G", "e3"]))
def test_number_with_suffix_is_a_quantity(whole: int, frac: int, suffix: str) -> None:
    text = f"{whole}.{abs(frac)}{suffix}" if frac else f"{whole}{suffix}"
    assert is_quantity(text)


@given(st.text(alphabet="abcdfhjlopqrstvwxyz ", min_size=1))
def test_words_are_not_quantities(text: str) -> None:
    assert not is_quantity(text)
