"""Which broker Services should exist, given the broker Pods observed: a pure decision.

Two kinds, as upstream: `<instance>-svc` in front of one Instance's brokers (owned by the
Instance) and `<configuration>-svc` in front of all brokers of a Configuration (owned by the
Configuration). Labels and selectors are upstream's: an instance Service carries
`akri.sh/instance` only, so `-l akri.sh/configuration=X` finds the one configuration Service.
It names its Configuration in an annotation of the same key instead (`configuration_of` reads
either): the Configuration's plan then sees the Services of Instances that are gone and deletes
them at once, rather than waiting for the garbage collector.

A Service is wanted once one of its brokers is Running, and kept while one is Running or
Pending, so recreating a broker (Failed -> deleted -> Pending -> Running) does not delete and
re-create the Service in between; it goes when every broker it selects has ended or is being
deleted. Job brokers count too: their Pods carry the same labels (brokers.py).

The edge applies `ServicePlan.apply` (server-side apply, so a changed instanceServiceSpec
reaches an existing Service) and deletes `ServicePlan.delete`. Every body it applies carries a
fingerprint of itself in an annotation (`fingerprinted`); a Service whose annotation matches
what would be applied is left alone (`up_to_date`), so a steady state costs no request, also
after a restart, and a Service made by someone else (upstream's controller) is taken over once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from akri_trio.controller import brokers, names
from akri_trio.controller.observed import Delete, ObservedPod
from akri_trio.model import naming
from akri_trio.model.resources import JSON, Configuration, Instance

_KEEPS_SERVICE = frozenset({"Running", "Pending"})
FINGERPRINT: Final = "akri.sh/applied-fingerprint"
CONFIGURATION_ANNOTATION: Final = naming.LABEL_CONFIGURATION


def fingerprint(body: Mapping[str, Any]) -> str:
    """A digest of a body as the controller would apply it (its own annotation left out)."""
    meta = dict(body.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != FINGERPRINT}
    meta["annotations"] = annotations
    text = json.dumps({**body, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def fingerprinted(body: Mapping[str, Any]) -> JSON:
    """`body` with its fingerprint annotation."""
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), FINGERPRINT: fingerprint(body)}
    return {**body, "metadata": meta}


def up_to_date(existing: Mapping[str, Any] | None, body: Mapping[str, Any]) -> bool:
    """Does the observed Service already carry what applying `body` would write?"""
    if existing is None:
        return False
    annotations = (existing.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(FINGERPRINT) == fingerprint(body))


@attrs.frozen
class ServicePlan:
    apply: tuple[JSON, ...] = ()
    delete: tuple[Delete, ...] = ()


def configuration_of(service: Mapping[str, Any]) -> str | None:
    """The (label-valued) Configuration a Service of ours fronts: its `akri.sh/configuration`
    label on a configuration Service, the annotation of that key on an instance Service."""
    meta = service.get("metadata") or {}
    for where in ("labels", "annotations"):
        value = (meta.get(where) or {}).get(CONFIGURATION_ANNOTATION)
        if value is not None:
            return str(value)
    return None


def _service(
    name: str,
    user_spec: Mapping[str, Any],
    selector: Mapping[str, str],
    owner: Configuration | Instance,
    configuration: str | None = None,
) -> JSON:
    labels = {
        brokers.APP_LABEL: name,
        naming.LABEL_CONTROLLER: naming.CONTROLLER_VALUE,
        **selector,
    }
    spec = dict(user_spec)
    spec["selector"] = {
        **(spec.get("selector") or {}),
        naming.LABEL_CONTROLLER: naming.CONTROLLER_VALUE,
        **selector,
    }
    body = brokers.owned_object("v1", "Service", name, labels, owner, spec)
    if configuration is not None:
        body["metadata"]["annotations"] = {CONFIGURATION_ANNOTATION: configuration}
    return body


def instance_service(configuration: Configuration, instance: Instance) -> JSON | None:
    """The Instance's Service body, or None when the Configuration has no instanceServiceSpec."""
    user = configuration.spec.instance_service_spec
    if user is None:
        return None
    name = names.instance_service_name(instance.metadata.name)
    selector = brokers.instance_selector(instance.metadata.name)
    config = names.label_value(instance.spec.configuration_name)
    return _service(name, user, selector, instance, config)


def configuration_service(configuration: Configuration) -> JSON | None:
    user = configuration.spec.configuration_service_spec
    if user is None:
        return None
    name = names.configuration_service_name(configuration.metadata.name)
    selector = brokers.configuration_selector(configuration.metadata.name)
    return _service(name, user, selector, configuration)


def _selects_labels(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class _Phases:
    """The phases of the live broker Pods, grouped once by each label the selectors use, so
    planning N Instances' Services costs O(N + pods), not O(N x pods)."""

    def __init__(self, pods: Iterable[ObservedPod]) -> None:
        self._by: dict[tuple[str, str], set[str]] = {}
        for pod in pods:
            if pod.deleting:
                continue
            for label in (naming.LABEL_INSTANCE, naming.LABEL_CONFIGURATION):
                if label in pod.labels:
                    self._by.setdefault((label, pod.labels[label]), set()).add(pod.phase)

    def wanted(self, selector: Mapping[str, str], exists: bool) -> bool:
        # Each selector is one label (instance_selector / configuration_selector).
        ((label, value),) = selector.items()
        phases = self._by.get((label, value), set())
        return "Running" in phases or (exists and bool(phases & _KEEPS_SERVICE))


def plan_services(
    configuration: Configuration,
    instances: Iterable[Instance],
    pods: Iterable[ObservedPod],
    services: Iterable[Mapping[str, Any]],
) -> ServicePlan:
    """The Services of one Configuration. `instances` are its Instances, `pods` the broker Pods
    in its namespace and `services` the Services there labelled `controller=akri.sh`; Services
    of other Configurations among them are left alone."""
    phases = _Phases(pods)
    instances = list(instances)
    existing = {s["metadata"]["name"]: s for s in services}
    deleting = configuration.metadata.deletion_timestamp is not None
    apply: list[JSON] = []
    # A body is built only for a Service that is wanted: while brokers start (all Pending, no
    # Service yet) a plan over N Instances is N dictionary lookups.
    if not deleting and configuration.spec.instance_service_spec is not None:
        for i in instances:
            name = names.instance_service_name(i.metadata.name)
            selector = brokers.instance_selector(i.metadata.name)
            if i.metadata.deletion_timestamp is None and phases.wanted(selector, name in existing):
                body = instance_service(configuration, i)
                if body is not None:
                    apply.append(body)
    if not deleting:
        body = configuration_service(configuration)
        selector = brokers.configuration_selector(configuration.metadata.name)
        if body is not None and phases.wanted(selector, body["metadata"]["name"] in existing):
            apply.append(body)
    keep = {body["metadata"]["name"] for body in apply}
    delete = [
        Delete.of(svc)
        for name, svc in existing.items()
        if name not in keep and _belongs(svc, configuration, instances)
    ]
    return ServicePlan(tuple(apply), tuple(delete))


def _belongs(
    service: Mapping[str, Any], configuration: Configuration, instances: Iterable[Instance]
) -> bool:
    """Ours to delete: this Configuration's (configuration_of), or labelled with one of its
    Instances."""
    labels = service.get("metadata", {}).get("labels") or {}
    if configuration_of(service) == names.label_value(configuration.metadata.name):
        return True
    return any(
        _selects_labels(brokers.instance_selector(i.metadata.name), labels) for i in instances
    )
