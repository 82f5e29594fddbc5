"""Broker Pod / Job bodies and their names (akri_trio.controller.brokers, names)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.controller import (
    PLACEHOLDER,
    broker_job,
    broker_pod,
    broker_pod_name,
    broker_pods,
    label_value,
    pin_to_node,
    rename_placeholder,
)
from akri_trio.controller.names import (
    broker_job_name,
    configuration_service_name,
    instance_service_name,
    is_dns1035_label,
    is_label_value,
    is_short_name,
)
from tests.controller.objects import configuration, instance

NODE_TERM = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}


POD_SPEC: dict[str, Any] = {
    "containers": [
        {
            "name": "broker",
            "image": "nginx",
            "resources": {
                "limits": {"cpu": "1", PLACEHOLDER: "1", "memory": "1Gi"},
                "requests": {PLACEHOLDER: "2"},
            },
        },
        {"name": "side", "image": "busybox"},
    ],
    "initContainers": [{"name": "init", "resources": {"limits": {PLACEHOLDER: "1"}}}],
}


# --- names ---------------------------------------------------------------------------------------


def test_pod_names_follow_upstream_when_valid() -> None:
    assert broker_pod_name("akri-foo-8120fe", "node-a", shared=True) == "node-a-akri-foo-8120fe-pod"
    assert broker_pod_name("akri-foo-8120fe", "node-a", shared=False) == "akri-foo-8120fe-pod"
    assert broker_pod_name("inst.a", "node", shared=True) == "node-inst-a-pod"
    assert broker_pod_name("inst.a", "node", shared=False) == "inst-a-pod"


def test_other_names_follow_upstream_when_valid() -> None:
    assert broker_job_name("akri-foo-8120fe", 7) == "akri-foo-8120fe-7-job"
    assert instance_service_name("akri-foo-8120fe") == "akri-foo-8120fe-svc"
    assert configuration_service_name("akri-foo") == "akri-foo-svc"


def test_long_names_are_shortened_with_a_digest_and_stay_distinct() -> None:
    node = "n" * 60
    a = broker_pod_name("akri-foo-aaaaaa", node, shared=True)
    b = broker_pod_name("akri-foo-bbbbbb", node, shared=True)
    assert a != b
    for name in (a, b):
        assert len(name) <= 63 and is_short_name(name) and name.endswith("-pod")


def test_service_name_starting_with_a_digit_becomes_a_dns1035_label() -> None:
    name = instance_service_name("1-0-0-1-abcdef")
    assert is_dns1035_label(name) and name.endswith("-svc")


def test_long_node_name_label_is_shortened() -> None:
    node = "a" * 70 + ".example.com"
    assert is_label_value(label_value(node)) and label_value(node) != label_value(node + "x")
    assert label_value("node-a") == "node-a"


_dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?", fullmatch=True)
_subdomain = st.lists(_dns_label, min_size=1, max_size=4).map(".".join)


@given(_subdomain, _subdomain, st.booleans(), st.integers(0, 10**12))
def test_every_generated_name_is_valid(inst: str, node: str, shared: bool, gen: int) -> None:
    assert is_short_name(broker_pod_name(inst, node, shared))
    assert is_short_name(broker_job_name(inst, gen))
    assert is_dns1035_label(instance_service_name(inst))
    assert is_dns1035_label(configuration_service_name(inst))
    assert is_label_value(label_value(node))


# --- placeholder ---------------------------------------------------------------------------------


def test_placeholder_renamed_in_containers_and_init_containers_quantity_kept() -> None:
    out = rename_placeholder(POD_SPEC, "akri.sh/inst")
    broker = out["containers"][0]["resources"]
    assert broker["limits"] == {"cpu": "1", "akri.sh/inst": "1", "memory": "1Gi"}
    assert list(broker["limits"]) == ["cpu", "akri.sh/inst", "memory"]
    assert broker["requests"] == {"akri.sh/inst": "2"}
    assert out["initContainers"][0]["resources"]["limits"] == {"akri.sh/inst": "1"}
    assert "resources" not in out["containers"][1]


def test_placeholder_rename_does_not_mutate_input() -> None:
    before = copy.deepcopy(POD_SPEC)
    rename_placeholder(POD_SPEC, "akri.sh/inst")
    assert before == POD_SPEC


_key = st.text(st.sampled_from("abc./-{}PLACEHOLDER"), min_size=1, max_size=16)
_quantities = st.dictionaries(st.one_of(_key, st.just(PLACEHOLDER)), st.text(max_size=4))


@given(st.lists(st.fixed_dictionaries({"limits": _quantities, "requests": _quantities})))
def test_placeholder_rename_never_touches_other_keys(resources: list[dict[str, Any]]) -> None:
    spec = {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]}
    out = rename_placeholder(spec, "akri.sh/x")
    for before, after in zip(resources, out["containers"], strict=True):
        for kind in ("limits", "requests"):
            old, new = before[kind], after["resources"][kind]
            others = {k: v for k, v in old.items() if k not in (PLACEHOLDER, "akri.sh/x")}
            assert {k: v for k, v in new.items() if k != "akri.sh/x"} == others
            if PLACEHOLDER in old:
                assert new["akri.sh/x"] == old[PLACEHOLDER]
            else:
                assert new == old


# --- node affinity -------------------------------------------------------------------------------


def test_pin_without_user_affinity_is_the_only_term() -> None:
    out = pin_to_node({"containers": []}, "node-a")
    required = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": [{"matchFields": [NODE_TERM]}]}


def test_pin_is_anded_into_every_user_term_and_empty_terms_stay_empty() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]},
        {},
    ]
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
            },
            "podAntiAffinity": {"x": 1},
        }
    }
    before = copy.deepcopy(spec)
    out = pin_to_node(spec, "node-a")
    assert spec == before
    terms = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0] == {**user_terms[0], "matchFields": [NODE_TERM]}
    assert terms[1]["matchFields"] == [*user_terms[1]["matchFields"], NODE_TERM]
    assert terms[2] == {}
    assert out["affinity"]["podAntiAffinity"] == {"x": 1}
    assert out["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]


# --- Pod and Job bodies --------------------------------------------------------------------------


def test_broker_pod_body() -> None:
    config = configuration({"brokerPodSpec": POD_SPEC})
    inst = instance()
    pod = broker_pod(config, inst, "node-a")
    meta = pod["metadata"]
    assert meta["name"] == "node-a-akri-debug-echo-foo-8120fe-pod"
    assert meta["namespace"] == "ns"
    assert meta["labels"] == {
        "app": meta["name"],
        "controller": "akri.sh",
        "akri.sh/configuration": "akri-debug-echo-foo",
        "akri.sh/instance": "akri-debug-echo-foo-8120fe",
        "akri.sh/target-node": "node-a",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "akri.sh/v0",
            "kind": "Instance",
            "name": "akri-debug-echo-foo-8120fe",
            "uid": "akri-debug-echo-foo-8120fe-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["akri.sh/akri-debug-echo-foo-8120fe"] == "1"
    assert config.spec.broker_spec is not None
    assert config.spec.broker_spec.spec == POD_SPEC  # the Configuration is untouched


def test_broker_pods_one_per_node_none_when_deleting_or_no_pod_spec() -> None:
    config = configuration({"brokerPodSpec": POD_SPEC})
    pods = broker_pods(config, instance(nodes=("node-a", "node-b")))
    assert sorted(pods) == [
        "node-a-akri-debug-echo-foo-8120fe-pod",
        "node-b-akri-debug-echo-foo-8120fe-pod",
    ]
    assert list(broker_pods(config, instance(shared=False))) == ["akri-debug-echo-foo-8120fe-pod"]
    assert broker_pods(config, instance(deleting=True)) == {}
    assert broker_pods(configuration(None), instance()) == {}


def test_broker_job_body() -> None:
    job_spec: dict[str, Any] = {
        "parallelism": 2,
        "template": {
            "metadata": {"labels": {"app": "mine"}, "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {PLACEHOLDER: "1"}}}]},
        },
    }
    config = configuration({"brokerJobSpec": job_spec}, generation=4)
    job = broker_job(config, instance())
    assert job is not None
    assert job["metadata"]["name"] == "akri-debug-echo-foo-8120fe-4-job"
    assert job["metadata"]["labels"] == {
        "app": "akri-debug-echo-foo-8120fe-4-job",
        "controller": "akri.sh",
        "akri.sh/configuration": "akri-debug-echo-foo",
        "akri.sh/instance": "akri-debug-echo-foo-8120fe",
    }
    template = job["spec"]["template"]
    assert template["metadata"]["labels"] == {
        "app": "mine",
        "controller": "akri.sh",
        "akri.sh/configuration": "akri-debug-echo-foo",
        "akri.sh/instance": "akri-debug-echo-foo-8120fe",
    }
    assert template["metadata"]["annotations"] == {"a": "b"}
    assert template["spec"]["containers"][0]["resources"]["limits"] == {
        "akri.sh/akri-debug-echo-foo-8120fe": "1"
    }
    assert "affinity" not in template["spec"]
    assert job["spec"]["parallelism"] == 2
    assert job_spec["template"]["metadata"]["labels"] == {"app": "mine"}  # input untouched
    assert broker_job(config, instance(deleting=True)) is None
    assert broker_job(configuration({"brokerPodSpec": POD_SPEC}), instance()) is None
