"""The OpenAPI walk against the real /openapi/v2 of the local cluster's API server: the shapes
our small test document imitates (int-or-string ports, quantities, int32 ranges, nested $refs)
are checked as the API server itself defines them."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from akri_trio.kube import Client, load_config
from akri_trio.webhook import Schemas, validate_configuration
from akri_trio.webhook.openapi import JOB_SPEC, POD_SPEC, SERVICE_SPEC
from akri_trio.webhook.server import OPENAPI_PATH
from tests.webhook.test_validate import VALID

pytestmark = pytest.mark.k8s


async def _fetch(kubeconfig: str) -> Schemas:
    async with Client.open(load_config(kubeconfig)) as api:
        return Schemas(await api.request("GET", OPENAPI_PATH))


@pytest.fixture(scope="module")
def schemas(cluster: dict[str, str]) -> Schemas:
    """Fetched once for the module, as the webhook does once at start."""
    return trio.run(_fetch, cluster["KUBECONFIG"])


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "image": "nginx", **fields}


def test_the_document_defines_the_broker_and_service_specs(schemas: Schemas) -> None:
    assert {POD_SPEC, JOB_SPEC, SERVICE_SPEC} <= set(schemas.definitions)


def test_a_full_pod_spec_passes(schemas: Schemas) -> None:
    spec = {
        "containers": [
            container(
                ports=[{"containerPort": 80, "name": "http", "protocol": "TCP"}],
                resources={
                    "limits": {"{{PLACEHOLDER}}": "1", "cpu": "500m", "memory": "1Gi"},
                    "requests": {"cpu": 0.25, "memory": 268435456, "ephemeral-storage": "1e9"},
                },
                livenessProbe={"httpGet": {"port": "http", "path": "/healthz"}},
                readinessProbe={"tcpSocket": {"port": 80}},
                env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                securityContext={"capabilities": {"drop": ["ALL"]}, "runAsUser": 1000},
            )
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}
                    ]
                }
            }
        },
        "overhead": {"cpu": "10m"},
        "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Gi"}}],
        "tolerations": [{"operator": "Exists"}],
    }
    assert schemas.problems(spec, POD_SPEC, "pod") == []


def test_mistyped_fields_are_named(schemas: Schemas) -> None:
    spec = {
        "containers": [container(ports=[{"containerPort": "80"}], tty="yes", args="--x")],
        "hostNetwork": "true",
        "terminationGracePeriodSeconds": 1.5,
        "nodeSelector": {"zone": 1},
    }
    assert sorted(schemas.problems(spec, POD_SPEC, "pod")) == [
        "pod.containers[0].args: expected an array, got a string",
        "pod.containers[0].ports[0].containerPort: expected an integer, got a string",
        "pod.containers[0].tty: expected a boolean, got a string",
        "pod.hostNetwork: expected a boolean, got a string",
        "pod.nodeSelector.zone: expected a string, got an integer",
        "pod.terminationGracePeriodSeconds: expected an integer, got a number",
    ]


def test_unknown_fields_and_missing_required_ones(schemas: Schemas) -> None:
    spec = {"containers": [{"image": "nginx", "imagePullPolcy": "Always"}]}
    assert sorted(schemas.problems(spec, POD_SPEC, "pod")) == [
        "pod.containers[0].imagePullPolcy: unknown field",
        "pod.containers[0].name: required",
    ]


def test_int_or_string_ports(schemas: Schemas) -> None:
    def probe(port: Any) -> list[str]:
        spec = {"containers": [container(livenessProbe={"httpGet": {"port": port}})]}
        return schemas.problems(spec, POD_SPEC, "pod")

    assert probe(8080) == probe("http") == []
    where = "pod.containers[0].livenessProbe.httpGet.port"
    assert probe(1.5) == [f"{where}: expected an integer or a string, got a number"]
    assert probe(True) == [f"{where}: expected an integer or a string, got a boolean"]
    service = {"ports": [{"port": 80, "targetPort": "http"}, {"port": 81, "targetPort": 8081}]}
    assert schemas.problems(service, SERVICE_SPEC, "svc") == []
    assert schemas.problems({"ports": [{"port": "80"}]}, SERVICE_SPEC, "svc") == [
        "svc.ports[0].port: expected an integer, got a string"
    ]


def test_quantities_in_resources(schemas: Schemas) -> None:
    def limits(**values: Any) -> list[str]:
        spec = {"containers": [container(resources={"limits": values})]}
        return schemas.problems(spec, POD_SPEC, "pod")

    assert limits(cpu="500m", memory="2Gi", gpu=1, storage="1.5e3", small=".5") == []
    assert limits(memory="lots", cpu=[1]) == [
        "pod.containers[0].resources.limits.memory: expected a quantity (e.g. 1, 500m, 2Gi), "
        "got 'lots'",
        "pod.containers[0].resources.limits.cpu: expected a quantity (e.g. 1, 500m, 2Gi), got [1]",
    ]


def test_int32_range(schemas: Schemas) -> None:
    spec = {"containers": [container(ports=[{"containerPort": 2**31}])]}
    assert schemas.problems(spec, POD_SPEC, "pod") == [
        "pod.containers[0].ports[0].containerPort: 2147483648 is out of the int32 range"
    ]


def test_job_spec_reaches_its_pod_template(schemas: Schemas) -> None:
    job = {"template": {"spec": {"containers": [container(comand=["x"])]}}, "backoffLimit": "3"}
    assert sorted(schemas.problems(job, JOB_SPEC, "job")) == [
        "job.backoffLimit: expected an integer, got a string",
        "job.template.spec.containers[0].comand: unknown field",
    ]


def test_the_unit_tests_valid_configuration_is_valid_for_the_real_schemas(
    schemas: Schemas,
) -> None:
    assert validate_configuration(VALID, schemas) == []
