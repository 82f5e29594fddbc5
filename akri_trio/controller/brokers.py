"""The broker Pods and Jobs a Configuration asks for on an Instance, as plain JSON.

The controller's edge compares these bodies with what it observes and creates what is missing
(lifecycle.py decides when); nothing here reads the cluster. Every function returns new data and
never mutates the Configuration, the Instance or the user's PodSpec / JobSpec inside them: the
same Configuration is rendered for every Instance and node, so an in-place edit would leak one
broker's resource name or node into the next.

Where this departs from upstream's objects, and why:

- Node affinity: upstream appends a `matchFields metadata.name In [node]` term to the user's
  `nodeSelectorTerms`. Terms are ORed, so with any user term present the broker may land on
  another node, where its device is not. Here the requirement is ANDed into every user term
  (a term's requirements are ANDed), or is the only term when there is none. An empty user term
  matches no node and is kept empty, so what it means does not change.
- Job Pods also carry `controller=akri.sh`: the Services select on it (as upstream's do), and
  without it Job brokers would never be reachable through them.
- Label values and object names go through names.py, which keeps upstream's form when valid.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from akri_trio.controller import names
from akri_trio.model import naming
from akri_trio.model.resources import JSON, Configuration, Instance

PLACEHOLDER: Final = "{{PLACEHOLDER}}"
APP_LABEL: Final = "app"
NODE_NAME_FIELD: Final = "metadata.name"


def owner_reference(obj: Configuration | Instance) -> JSON:
    """A controller ownerReference: the garbage collector removes brokers with their owner."""
    return {
        "apiVersion": obj.api_version,
        "kind": obj.kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_object(
    api_version: str,
    kind: str,
    name: str,
    labels: Mapping[str, str],
    owner: Configuration | Instance,
    spec: JSON,
) -> JSON:
    """An object in its owner's namespace, with a controller ownerReference to it."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": owner.metadata.namespace,
            "labels": dict(labels),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": spec,
    }


def akri_labels(instance: Instance) -> dict[str, str]:
    """The two labels every broker Pod (Job Pods included) carries."""
    return {
        naming.LABEL_CONFIGURATION: names.label_value(instance.spec.configuration_name),
        naming.LABEL_INSTANCE: names.label_value(instance.metadata.name),
    }


def instance_selector(instance_name: str) -> dict[str, str]:
    """Labels that select every broker Pod of one Instance (Pod and Job brokers alike)."""
    return {naming.LABEL_INSTANCE: names.label_value(instance_name)}


def configuration_selector(configuration_name: str) -> dict[str, str]:
    return {naming.LABEL_CONFIGURATION: names.label_value(configuration_name)}


def rename_placeholder(pod_spec: Mapping[str, Any], resource: str) -> JSON:
    """A copy of `pod_spec` in which every container's and initContainer's `{{PLACEHOLDER}}`
    key in `resources.limits` / `resources.requests` is renamed to `resource`, with its
    quantity and its position among the keys kept. Nothing is added where the key is absent."""
    spec = copy.deepcopy(dict(pod_spec))
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if not isinstance(containers, list):
            continue
        for container in containers:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            for kind in ("limits", "requests"):
                quantities = resources.get(kind)
                if isinstance(quantities, dict) and PLACEHOLDER in quantities:
                    resources[kind] = {
                        (resource if key == PLACEHOLDER else key): value
                        for key, value in quantities.items()
                        if key != resource
                    }
    return spec


def _node_requirement(node: str) -> JSON:
    return {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}


def pin_to_node(pod_spec: Mapping[str, Any], node: str) -> JSON:
    """A copy of `pod_spec` whose required node affinity admits only `node` on top of whatever
    the user's own required terms demand (see the module docstring)."""
    spec = copy.deepcopy(dict(pod_spec))
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)]
    pinned = [
        {**term, "matchFields": [*(term.get("matchFields") or []), _node_requirement(node)]}
        if term.get("matchFields") or term.get("matchExpressions")
        else term
        for term in terms
    ]
    if not terms:
        pinned = [{"matchFields": [_node_requirement(node)]}]
    spec["affinity"] = {
        **affinity,
        "nodeAffinity": {
            **node_affinity,
            "requiredDuringSchedulingIgnoredDuringExecution": {
                **required,
                "nodeSelectorTerms": pinned,
            },
        },
    }
    return spec


def broker_pod(configuration: Configuration, instance: Instance, node: str) -> JSON:
    """The broker Pod for `instance` on `node` (the Configuration must have a brokerPodSpec)."""
    broker = configuration.spec.broker_spec
    if broker is None or broker.kind != "pod":
        raise ValueError(f"Configuration {configuration.metadata.name} has no brokerPodSpec")
    name = names.broker_pod_name(instance.metadata.name, node, instance.spec.shared)
    spec = rename_placeholder(broker.spec, naming.resource_name(instance.metadata.name))
    labels = {
        APP_LABEL: name,
        naming.LABEL_CONTROLLER: naming.CONTROLLER_VALUE,
        **akri_labels(instance),
        naming.LABEL_TARGET_NODE: names.label_value(node),
    }
    return owned_object("v1", "Pod", name, labels, instance, pin_to_node(spec, node))


def broker_pods(configuration: Configuration, instance: Instance) -> dict[str, JSON]:
    """Pod name -> body: one per node in `spec.nodes`; none without a brokerPodSpec or while
    the Instance is being deleted. Capacity is not enforced here: the kubelet's Allocate is."""
    broker = configuration.spec.broker_spec
    if broker is None or broker.kind != "pod" or instance.metadata.deletion_timestamp:
        return {}
    nodes = dict.fromkeys(instance.spec.nodes)
    pods = (broker_pod(configuration, instance, node) for node in nodes)
    return {pod["metadata"]["name"]: pod for pod in pods}


def broker_job(configuration: Configuration, instance: Instance) -> JSON | None:
    """The Job of the current Configuration generation, or None (no brokerJobSpec, or the
    Instance is being deleted)."""
    broker = configuration.spec.broker_spec
    if broker is None or broker.kind != "job" or instance.metadata.deletion_timestamp:
        return None
    name = names.broker_job_name(instance.metadata.name, configuration.metadata.generation)
    job_spec = copy.deepcopy(broker.spec)
    template = job_spec.get("template")
    template = dict(template) if isinstance(template, dict) else {}
    metadata = dict(template.get("metadata") or {})
    metadata["labels"] = {
        **(metadata.get("labels") or {}),
        naming.LABEL_CONTROLLER: naming.CONTROLLER_VALUE,
        **akri_labels(instance),
    }
    template["metadata"] = metadata
    template["spec"] = rename_placeholder(
        template.get("spec") or {}, naming.resource_name(instance.metadata.name)
    )
    job_spec["template"] = template
    labels = {
        **akri_labels(instance),
        APP_LABEL: name,
        naming.LABEL_CONTROLLER: naming.CONTROLLER_VALUE,
    }
    return owned_object("batch/v1", "Job", name, labels, instance, job_spec)
