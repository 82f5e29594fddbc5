"""The controller's decisions in DRA mode, as plain data: DeviceClasses, shared pools, broker
claims, and the keys their reconciles run under. The edge (reconcilers.py beside it) reads the
caches, asks these functions, writes the answer.

- One DeviceClass per Configuration (`device_class`, for `akri.sh/<configuration>`) and
  one per Instance (`instance_class`, for `akri.sh/<instance>`). A cluster-scoped object
  cannot have a namespaced owner, so nothing deletes it for us: its reconcile is keyed by the
  class's name and deletes a class of ours that no Configuration or Instance wants.
- One pool per SHARED Instance, written by the controller alone: its devices
  (`pool_devices`) on a node selector of exactly the hostnames of `Instance.spec.nodes`
  (`shared_pool_wanted`). Keyed by the pool's name; no Instance (gone, being deleted, no node
  left, not shared any more) means nothing wanted, so once the offline grace of the devices it
  had ends (meanwhile they stay, tainted) the pool goes: `akri_trio.dra.plan_round`, the round
  the agent's node pools go through too.
- Brokers claim their device instead of asking for `akri.sh/<instance>` in `limits`: one
  ResourceClaimTemplate per Instance (owned by it; the request names the Configuration's
  DeviceClass and selects the Instance by CEL on `akri.sh/instance`), and every broker Pod, and
  a Job's Pod template, references it. kube-controller-manager makes one ResourceClaim per
  Pod from it and deletes it with the Pod, so Pod and Job brokers work the same way and no
  claim outlives its broker. The scheduler then enforces the Instance's capacity.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from akri_trio.address import ObjectKey
from akri_trio.controller import names
from akri_trio.controller.brokers import akri_labels, owned_object
from akri_trio.dra import (
    HOSTNAME_LABEL,
    LABEL_NAMESPACE,
    LABEL_POOL_KIND,
    Wanted,
    claim_spec,
    device_class,
    device_class_name,
    instance_class,
    instance_class_name,
    pool_devices,
    pool_labels,
    shared_placement,
    shared_pool,
)
from akri_trio.model import naming
from akri_trio.model.resources import JSON, Instance

CLAIM_NAME: Final = "akri"  # the Pod's `resourceClaims` entry its containers refer to
TEMPLATE_API_VERSION: Final = "resource.k8s.io/v1"


# --- DeviceClasses ---------------------------------------------------------------------------


def class_wanted(
    configurations: Sequence[tuple[str, str]],
    class_name: str,
    instances: Sequence[tuple[str, str, str]] = (),
) -> JSON | None:
    """The DeviceClass `class_name` should be, given the (namespace, name) of the
    Configurations and the (namespace, name, configuration) of the Instances that map to it:
    the first one's class (two could only share a name through a hash collision of overlong
    names, or a dotted Configuration name spelling an Instance class's), or None when none
    wants it."""
    bodies = [device_class(name, namespace) for namespace, name in sorted(configurations)]
    bodies += [
        instance_class(configuration, namespace, name)
        for namespace, name, configuration in sorted(instances)
    ]
    for body in bodies:
        if body["metadata"]["name"] == class_name:
            return body
    return None


def class_up_to_date(existing: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether the stored class already has our labels and exactly our spec, but for an
    `extendedResourceName` missing from it: an API server without DRAExtendedResource (off by
    default before 1.36) drops that field, and applying it again would change nothing."""
    if existing is None:
        return False
    labels = (existing.get("metadata") or {}).get("labels") or {}
    ours = wanted["metadata"]["labels"]
    spec = dict(wanted.get("spec") or {})
    stored = existing.get("spec") or {}
    if "extendedResourceName" not in stored:
        spec.pop("extendedResourceName", None)
    return all(labels.get(k) == v for k, v in ours.items()) and stored == spec


def is_our_class(obj: Mapping[str, Any]) -> bool:
    """A DeviceClass we made: it carries the namespace label `device_class` puts on it."""
    return LABEL_NAMESPACE in ((obj.get("metadata") or {}).get("labels") or {})


# --- shared pools ----------------------------------------------------------------------------


def shared_pool_of(instance: Instance) -> str | None:
    """The pool a shared Instance's devices go to (None for a non-shared one: the agent of
    its node publishes those)."""
    if not instance.spec.shared:
        return None
    return shared_pool(instance.metadata.namespace, instance.metadata.name)


def publishes(instance: Instance | None) -> bool:
    """Whether `instance` has devices in a shared pool right now."""
    return (
        instance is not None
        and instance.spec.shared
        and not instance.metadata.deletion_timestamp
        and bool(instance.spec.nodes)
        and instance.spec.capacity > 0
    )


def shared_pool_wanted(
    pool: str, instance: Instance | None, *, hostname: Mapping[str, str], consumable: bool
) -> Wanted | None:
    """What `pool` should hold now: `instance`'s devices on exactly its nodes, or nothing
    (None) when it does not publish there.

    `hostname`: node name -> its `kubernetes.io/hostname` label, for the nodes whose Node says
    so; any other node is selected by its name (which is what the kubelet sets the label to).
    """
    if instance is None or not publishes(instance) or shared_pool_of(instance) != pool:
        return None
    return Wanted(
        pool_devices([instance], consumable=consumable),
        shared_placement(hostname.get(n, n) for n in instance.spec.nodes),
        pool_labels("shared", instance.metadata.namespace),
    )


# --- broker claims ---------------------------------------------------------------------------


def claim_template(instance: Instance) -> JSON:
    """The ResourceClaimTemplate of `instance`'s brokers: one device of the Configuration's
    class, of this Instance; owned by the Instance so it goes with it."""
    meta, spec = instance.metadata, instance.spec
    labels = {naming.LABEL_CONTROLLER: naming.CONTROLLER_VALUE, **akri_labels(instance)}
    body = {"spec": claim_spec(spec.configuration_name, meta.namespace, meta.name)}
    name = names.claim_template_name(meta.name)
    return owned_object(TEMPLATE_API_VERSION, "ResourceClaimTemplate", name, labels, instance, body)


def _claim_pod_spec(pod_spec: Mapping[str, Any], resource: str, template: str) -> JSON:
    """A copy of `pod_spec` in which each container asking for `resource` in its limits or
    requests asks for the Pod's claim instead; the claim is added to the Pod only when a
    container uses it (a broker without the placeholder gets no device in either mode)."""
    spec = copy.deepcopy(dict(pod_spec))
    used = False
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            asked = False
            for kind in ("limits", "requests"):
                quantities = resources.get(kind)
                if isinstance(quantities, dict) and resource in quantities:
                    asked = True
                    rest = {k: v for k, v in quantities.items() if k != resource}
                    if rest:
                        resources[kind] = rest
                    else:
                        del resources[kind]
            if asked:
                used = True
                claims = [c for c in resources.get("claims") or [] if c.get("name") != CLAIM_NAME]
                resources["claims"] = [*claims, {"name": CLAIM_NAME}]
    if used:
        entries = [c for c in spec.get("resourceClaims") or [] if c.get("name") != CLAIM_NAME]
        spec["resourceClaims"] = [
            *entries,
            {"name": CLAIM_NAME, "resourceClaimTemplateName": template},
        ]
    return spec


def claim_broker_pod(pod: Mapping[str, Any], instance: Instance) -> JSON:
    """A broker Pod (brokers.broker_pod) that claims its device through the Instance's
    template instead of the `akri.sh/<instance>` extended resource."""
    body = copy.deepcopy(dict(pod))
    body["spec"] = _claim_pod_spec(
        body.get("spec") or {},
        naming.resource_name(instance.metadata.name),
        names.claim_template_name(instance.metadata.name),
    )
    return body


def claim_broker_job(job: Mapping[str, Any], instance: Instance) -> JSON:
    """A broker Job (brokers.broker_job) whose Pods claim their device likewise."""
    body = copy.deepcopy(dict(job))
    template = body["spec"]["template"]
    template["spec"] = _claim_pod_spec(
        template.get("spec") or {},
        naming.resource_name(instance.metadata.name),
        names.claim_template_name(instance.metadata.name),
    )
    return body


# --- what the reconciles are keyed by --------------------------------------------------------

# The indexes of the controller's Configuration and Instance caches in DRA mode, by the key of
# the class or pool an object maps to (reconcilers.CONFIGURATION_INDEXES, INSTANCE_INDEXES).
CLASS_INDEX: Final = "deviceclass"
POOL_INDEX: Final = "sharedpool"


def _class_key(obj: JSON, class_name: Callable[[str, str], str]) -> ObjectKey | None:
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not name or not namespace:
        return None
    return ObjectKey("", class_name(str(name), str(namespace)))


def class_key(obj: JSON) -> ObjectKey | None:
    """A Configuration's DeviceClass, as the key its reconcile runs under."""
    return _class_key(obj, device_class_name)


def instance_class_key(obj: JSON) -> ObjectKey | None:
    """An Instance's DeviceClass, as the key its reconcile runs under."""
    return _class_key(obj, instance_class_name)


def shared_pool_key(obj: JSON) -> ObjectKey | None:
    """A shared Instance's pool, as the key its reconcile runs under."""
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    if not spec.get("shared") or not meta.get("name"):
        return None
    return ObjectKey("", shared_pool(str(meta.get("namespace") or ""), str(meta["name"])))


def class_selector(namespace: str | None) -> str:
    """Our DeviceClasses: all, or those of one namespace's Configurations."""
    return LABEL_NAMESPACE if namespace is None else f"{LABEL_NAMESPACE}={namespace}"


def slice_selector(namespace: str | None) -> str:
    """The shared pools' slices (the agents' node pools are theirs)."""
    return f"{LABEL_POOL_KIND}=shared,{class_selector(namespace)}"


def hostname_of(node: Mapping[str, Any]) -> str | None:
    """A Node's `kubernetes.io/hostname` label."""
    return ((node.get("metadata") or {}).get("labels") or {}).get(HOSTNAME_LABEL)
