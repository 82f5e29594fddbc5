"""The controller's DRA-mode decisions (akri_trio.controller.dra.plan): DeviceClasses, shared
pools, broker claims, and what the DRA reconcilers are keyed by."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from akri_trio import dra
from akri_trio.address import ObjectKey
from akri_trio.controller import PLACEHOLDER, broker_job, broker_pod
from akri_trio.controller.dra.plan import (
    CLAIM_NAME,
    claim_broker_job,
    claim_broker_pod,
    claim_template,
    class_key,
    class_selector,
    class_up_to_date,
    class_wanted,
    hostname_of,
    instance_class_key,
    is_our_class,
    shared_pool_key,
    shared_pool_wanted,
    slice_selector,
)
from akri_trio.controller.names import claim_template_name
from akri_trio.controller.triggers import (
    configuration_to_class,
    instance_class_keys,
    instance_to_shared_pool,
)
from akri_trio.kube import Change
from akri_trio.model import naming
from akri_trio.model.convert import unstructure
from akri_trio.model.resources import Instance
from tests.controller.objects import CONFIG, INSTANCE, configuration, instance

JSON = dict[str, Any]
POOL = dra.shared_pool("ns", INSTANCE)


def plan_shared_pool(
    inst: Instance | None,
    existing: list[JSON],
    *,
    hostname: dict[str, str] | None = None,
    consumable: bool = False,
    written: int = 0,
) -> dra.PoolPlan:
    """The writes of the pool's round, as the controller's reconcile asks for them (no grace
    memory: what a fresh controller does)."""
    wanted = shared_pool_wanted(POOL, inst, hostname=hostname or {}, consumable=consumable)
    return dra.plan_round(POOL, wanted, existing, None, now=0.0, written=written).plan


def _stored(plan: dra.PoolPlan, held: dict[str, JSON] | None = None) -> dict[str, JSON]:
    """What the API holds after the controller carried out `plan`."""
    out = dict(held or {})
    for body in plan.apply:
        stored = copy.deepcopy(body)
        stored["metadata"]["uid"] = "u"
        out[body["metadata"]["name"]] = stored
    for name in plan.delete:
        out.pop(name, None)
    return out


# --- DeviceClasses ---------------------------------------------------------------------------


def test_a_configuration_wants_its_named_class() -> None:
    name = dra.device_class_name(CONFIG, "ns")
    wanted = class_wanted([("ns", CONFIG)], name)
    assert wanted is not None
    assert wanted["metadata"]["name"] == f"{CONFIG}.ns.akri.sh"
    assert is_our_class(wanted)


def test_no_configuration_wants_an_orphaned_class() -> None:
    assert class_wanted([], dra.device_class_name(CONFIG, "ns")) is None


def test_an_instance_wants_its_class_for_its_extended_resource() -> None:
    name = dra.instance_class_name(INSTANCE, "ns")
    wanted = class_wanted([], name, [("ns", INSTANCE, CONFIG)])
    assert wanted == dra.instance_class(CONFIG, "ns", INSTANCE)
    assert wanted["spec"]["extendedResourceName"] == f"akri.sh/{INSTANCE}"
    assert is_our_class(wanted)
    # Its Configuration's class is another one, and the Instance gone leaves it to deletion.
    assert class_wanted([], dra.device_class_name(CONFIG, "ns"), [("ns", INSTANCE, CONFIG)]) is None
    assert class_wanted([("ns", CONFIG)], name) is None


def test_an_instance_maps_to_its_class_only_when_it_comes_or_goes() -> None:
    """The mappers read the typed stores' changes (`Store[Instance]`, `Store[Configuration]`);
    the indexes file the same objects by their JSON."""
    inst = instance()
    key = ObjectKey("", dra.instance_class_name(INSTANCE, "ns"))
    assert instance_class_key(unstructure(inst)) == key
    assert instance_class_keys(Change(ObjectKey("ns", INSTANCE), None, inst)) == [key]
    assert instance_class_keys(Change(ObjectKey("ns", INSTANCE), inst, None)) == [key]
    assert instance_class_keys(Change(ObjectKey("ns", INSTANCE), inst, inst)) == []
    # The Configurations' mapper: its class, as the index files it.
    config = configuration()
    change = Change(ObjectKey("ns", CONFIG), None, config)
    assert set(configuration_to_class(change)) == {class_key(unstructure(config))}


def test_a_shared_instance_maps_to_its_pool_when_it_changes() -> None:
    shared = instance()
    moved = instance(nodes=("node-a", "node-b"))
    key = ObjectKey("", POOL)
    assert set(instance_to_shared_pool(Change(key, None, shared))) == {key}
    assert set(instance_to_shared_pool(Change(key, shared, moved))) == {key}
    assert set(instance_to_shared_pool(Change(key, shared, None))) == {key}
    assert set(instance_to_shared_pool(Change(key, shared, shared))) == set()  # nothing new
    assert set(instance_to_shared_pool(Change(key, None, instance(shared=False)))) == set()
    assert shared_pool_key(unstructure(shared)) == key  # as the index files it


def test_a_class_with_our_spec_and_labels_is_up_to_date_whatever_else_it_holds() -> None:
    wanted = dra.device_class(CONFIG, "ns")
    stored = copy.deepcopy(wanted)
    stored["metadata"]["labels"]["team"] = "x"
    stored["metadata"]["uid"] = "u"
    assert class_up_to_date(stored, wanted)
    edited = copy.deepcopy(stored)
    edited["spec"]["selectors"][0]["cel"]["expression"] = "true"
    assert not class_up_to_date(edited, wanted)
    assert not class_up_to_date(None, wanted)


def test_a_class_whose_server_dropped_the_extended_resource_is_up_to_date() -> None:
    """Before 1.36 the API server drops `extendedResourceName` (DRAExtendedResource off):
    applying it again would change nothing, so the class is taken as it is."""
    wanted = dra.device_class(CONFIG, "ns")
    stored = copy.deepcopy(wanted)
    del stored["spec"]["extendedResourceName"]
    assert class_up_to_date(stored, wanted)
    stored["spec"]["extendedResourceName"] = "akri.sh/other"
    assert not class_up_to_date(stored, wanted)


def test_a_class_without_our_label_is_not_ours() -> None:
    assert not is_our_class({"metadata": {"name": "gpu.example.com", "labels": {}}})


# --- shared pools ----------------------------------------------------------------------------


def test_a_shared_instance_is_one_pool_selecting_exactly_its_nodes() -> None:
    inst = instance(nodes=("node-b", "node-a"))
    plan = plan_shared_pool(inst, [], hostname={"node-b": "b"})
    (body,) = plan.apply
    spec = body["spec"]
    assert "nodeName" not in spec
    (term,) = spec["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": dra.HOSTNAME_LABEL, "operator": "In", "values": ["b", "node-a"]}
    ]
    assert spec["pool"] == {"name": POOL, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"{INSTANCE}-0", f"{INSTANCE}-1"]
    assert body["metadata"]["labels"] == dra.pool_labels("shared", "ns")


def test_consumable_capacity_publishes_one_device() -> None:
    plan = plan_shared_pool(instance(), [], consumable=True)
    (device,) = plan.apply[0]["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True


def test_a_node_joining_bumps_the_generation_and_nothing_changes_without_it() -> None:
    held = _stored(plan_shared_pool(instance(), []))
    same = plan_shared_pool(instance(), list(held.values()))
    assert same.unchanged
    joined = instance(nodes=("node-a", "node-b"))
    plan = plan_shared_pool(joined, list(held.values()))
    assert plan.generation == 2 and len(plan.apply) == 1
    values = plan.apply[0]["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert values[0]["values"] == ["node-a", "node-b"]


def test_the_pool_goes_with_the_instance_its_nodes_or_its_sharing() -> None:
    held = list(_stored(plan_shared_pool(instance(), [])).values())
    names = [s["metadata"]["name"] for s in held]
    for gone in (
        None,
        instance(deleting=True),
        instance(nodes=()),
        instance(shared=False),
    ):
        assert shared_pool_wanted(POOL, gone, hostname={}, consumable=False) is None
        plan = plan_shared_pool(gone, held)
        assert plan.apply == () and list(plan.delete) == names


def test_another_instances_pool_wants_nothing_of_it() -> None:
    other = dra.shared_pool("ns", "other-abc123")
    assert shared_pool_wanted(other, instance(), hostname={}, consumable=False) is None


def test_a_pool_published_again_never_repeats_a_generation() -> None:
    plan = plan_shared_pool(instance(), [], written=4)
    assert plan.generation == 5


@given(st.lists(st.sampled_from(["n1", "n2", "n3", "n4"]), max_size=6), st.booleans())
def test_every_history_of_nodes_ends_in_one_pool_at_a_higher_generation(
    steps: list[str], consumable: bool
) -> None:
    held: dict[str, JSON] = {}
    nodes: list[str] = []
    last = 0
    for node in steps:  # a node joins, or leaves when it was there
        nodes = [n for n in nodes if n != node] if node in nodes else [*nodes, node]
        inst = instance(nodes=tuple(nodes))
        plan = plan_shared_pool(inst, list(held.values()), consumable=consumable, written=last)
        held = _stored(plan, held)
        if plan.apply:
            assert plan.generation > last
            last = plan.generation
        if not nodes:
            assert held == {}
        else:
            (body,) = held.values()
            term = body["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]
            assert term["values"] == sorted(nodes)


# --- broker claims ---------------------------------------------------------------------------

POD_SPEC: JSON = {
    "containers": [
        {
            "name": "broker",
            "image": "nginx",
            "resources": {"limits": {"cpu": "1", PLACEHOLDER: "1"}, "requests": {PLACEHOLDER: "1"}},
        },
        {"name": "side", "image": "busybox"},
    ],
}


def test_the_claim_template_selects_the_instance_in_its_configurations_class() -> None:
    inst = instance()
    body = claim_template(inst)
    assert body["kind"] == "ResourceClaimTemplate"
    assert body["metadata"]["name"] == claim_template_name(INSTANCE) == f"{INSTANCE}-claim"
    assert body["metadata"]["ownerReferences"][0]["uid"] == inst.metadata.uid
    (request,) = body["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == dra.device_class_name(CONFIG, "ns")
    (selector,) = request["exactly"]["selectors"]
    assert selector["cel"]["expression"] == dra.instance_selector(INSTANCE)


def test_a_broker_pod_claims_instead_of_asking_for_the_extended_resource() -> None:
    inst = instance()
    pod = claim_broker_pod(broker_pod(configuration({"brokerPodSpec": POD_SPEC}), inst, "n"), inst)
    broker, side = pod["spec"]["containers"]
    assert broker["resources"] == {"limits": {"cpu": "1"}, "claims": [{"name": CLAIM_NAME}]}
    assert "resources" not in side
    assert pod["spec"]["resourceClaims"] == [
        {"name": CLAIM_NAME, "resourceClaimTemplateName": claim_template_name(INSTANCE)}
    ]
    assert naming.resource_name(INSTANCE) not in str(pod)
    # still pinned to its node
    assert pod["spec"]["affinity"]["nodeAffinity"]


def test_a_broker_without_the_placeholder_gets_no_claim() -> None:
    inst = instance()
    spec = {"containers": [{"name": "b", "image": "nginx"}]}
    pod = claim_broker_pod(broker_pod(configuration({"brokerPodSpec": spec}), inst, "n"), inst)
    assert "resourceClaims" not in pod["spec"]


def test_a_broker_jobs_pods_claim_through_the_template() -> None:
    inst = instance()
    job_spec = {"template": {"spec": {**POD_SPEC, "restartPolicy": "Never"}}}
    job = broker_job(configuration({"brokerJobSpec": job_spec}), inst)
    assert job is not None
    claimed = claim_broker_job(job, inst)
    template = claimed["spec"]["template"]["spec"]
    assert template["resourceClaims"][0]["resourceClaimTemplateName"] == f"{INSTANCE}-claim"
    assert template["containers"][0]["resources"]["claims"] == [{"name": CLAIM_NAME}]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]  # untouched


# --- what the DRA reconcilers are keyed by ---------------------------------------------------


def test_a_configuration_its_class_and_a_shared_instance_its_pool_map_to_one_key() -> None:
    config = {"metadata": {"name": CONFIG, "namespace": "ns"}}
    assert class_key(config) == ObjectKey("", dra.device_class_name(CONFIG, "ns"))
    assert class_key(dra.device_class(CONFIG, "ns")) is None  # cluster-scoped: no namespace
    shared = {"metadata": {"name": INSTANCE, "namespace": "ns"}, "spec": {"shared": True}}
    local = {"metadata": {"name": INSTANCE, "namespace": "ns"}, "spec": {"shared": False}}
    assert shared_pool_key(shared) == ObjectKey("", POOL)
    assert shared_pool_key(local) is None
    (body,) = plan_shared_pool(instance(), []).apply
    assert dra.pool_key(body) == ObjectKey("", POOL)
    assert class_selector(None) == "akri.sh/namespace"
    assert slice_selector("ns") == "akri.sh/pool-kind=shared,akri.sh/namespace=ns"
    node = {"metadata": {"name": "n1", "labels": {dra.HOSTNAME_LABEL: "h1"}}}
    assert hostname_of(node) == "h1" and hostname_of({"metadata": {}}) is None
