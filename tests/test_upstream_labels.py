"""Every kind of object akri-trio makes carries upstream Akri's labels, as its tooling and its
e2e suite select on them: the controller's broker Pods, Jobs and Services (upstream's
`shared/src/k8s/{pod,job,service}.rs`) and the chart's workloads (upstream's chart:
`app.kubernetes.io/name`, `part-of: akri`, selectors of part-of, instance and name)."""

from __future__ import annotations

from typing import Any

import pytest

from akri_trio.controller import broker_job, broker_pods, configuration_service, instance_service
from tests.controller.objects import CONFIG, INSTANCE, configuration, instance
from tests.deploy.test_chart import EVERYTHING
from tests.support.chart import render, workloads

SERVICE = {"type": "ClusterIP", "ports": [{"port": 6052}]}
POD_CONFIG = configuration(
    {"brokerPodSpec": {"containers": [{"name": "c"}]}},
    instanceServiceSpec=SERVICE,
    configurationServiceSpec=SERVICE,
)
JOB_CONFIG = configuration(
    {"brokerJobSpec": {"template": {"metadata": {"labels": {"mine": "x"}}, "spec": {}}}}
)
INST = instance(shared=False)


def test_broker_pod_labels_are_upstreams() -> None:
    ((name, pod),) = broker_pods(POD_CONFIG, INST).items()
    assert pod["metadata"]["labels"] == {
        "app": name,
        "controller": "akri.sh",
        "akri.sh/configuration": CONFIG,
        "akri.sh/instance": INSTANCE,
        "akri.sh/target-node": "node-a",
    }


def test_broker_job_labels_are_upstreams() -> None:
    job = broker_job(JOB_CONFIG, INST)
    assert job is not None
    assert job["metadata"]["labels"] == {
        "app": job["metadata"]["name"],
        "controller": "akri.sh",
        "akri.sh/configuration": CONFIG,
        "akri.sh/instance": INSTANCE,
    }
    # the user's labels and upstream's two, plus `controller` so that the Services select Job
    # brokers too (a listed difference: upstream's never do)
    assert job["spec"]["template"]["metadata"]["labels"] == {
        "mine": "x",
        "akri.sh/configuration": CONFIG,
        "akri.sh/instance": INSTANCE,
        "controller": "akri.sh",
    }


def test_service_labels_are_upstreams() -> None:
    """`akri.sh/instance` only on an instance Service, `akri.sh/configuration` only on the
    configuration Service: upstream's e2e counts 1 Service for `-l akri.sh/configuration=X`."""
    isvc = instance_service(POD_CONFIG, INST)
    csvc = configuration_service(POD_CONFIG)
    assert isvc is not None and csvc is not None
    assert isvc["metadata"]["labels"] == {
        "app": f"{INSTANCE}-svc",
        "controller": "akri.sh",
        "akri.sh/instance": INSTANCE,
    }
    assert isvc["spec"]["selector"] == {"controller": "akri.sh", "akri.sh/instance": INSTANCE}
    assert csvc["metadata"]["labels"] == {
        "app": f"{CONFIG}-svc",
        "controller": "akri.sh",
        "akri.sh/configuration": CONFIG,
    }
    assert csvc["spec"]["selector"] == {"controller": "akri.sh", "akri.sh/configuration": CONFIG}


# upstream's chart: workload -> (app.kubernetes.io/name, app.kubernetes.io/component)
UPSTREAM_WORKLOADS = {
    "akri-agent-daemonset": ("akri-agent", "agent"),
    "akri-controller-deployment": ("akri-controller", "controller"),
    "akri-webhook-configuration": ("akri-webhook-configuration", "admission-webhook"),
    "akri-debug-echo-discovery-daemonset": ("akri-debug-echo-discovery", "discovery-handler"),
    "akri-udev-discovery-daemonset": ("akri-udev-discovery", "discovery-handler"),
    "akri-onvif-discovery-daemonset": ("akri-onvif-discovery", "discovery-handler"),
    "akri-opcua-discovery-daemonset": ("akri-opcua-discovery", "discovery-handler"),
    "akri-custom-discovery-daemonset": ("akri-custom-discovery", "discovery-handler"),
}


@pytest.fixture(scope="module")
def chart_workloads() -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in workloads(render(EVERYTHING, release="rel"))}


@pytest.mark.parametrize("workload", sorted(UPSTREAM_WORKLOADS))
def test_chart_workload_labels_are_upstreams(
    chart_workloads: dict[str, dict[str, Any]], workload: str
) -> None:
    obj = chart_workloads[workload]
    name, component = UPSTREAM_WORKLOADS[workload]
    upstream = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "akri",
        "app.kubernetes.io/instance": "rel",
        "app.kubernetes.io/managed-by": "Helm",
    }
    for labels in (obj["metadata"]["labels"], obj["spec"]["template"]["metadata"]["labels"]):
        assert upstream.items() <= labels.items()
        assert set(labels) - set(upstream) == {"app.kubernetes.io/version", "helm.sh/chart"}
    assert obj["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/part-of": "akri",
        "app.kubernetes.io/instance": "rel",
        "app.kubernetes.io/name": name,
    }
