"""The DeviceClasses of a Configuration and of an Instance, and CEL selectors over Akri's
attributes.

Each class names Akri's extended resource (`extendedResourceName`, Kubernetes 1.37's
DRAExtendedResource): a Pod asking `akri.sh/<configuration>: 2` or `akri.sh/<instance>: 1` in
its limits is allocated devices of that class by the scheduler, as a device plugin's resource
would be. A DeviceClass names one extended resource and a claim request one class, so the
Instance-level resource needs a class of its own per Instance, selecting that Instance's devices.

CEL evaluates `&&` left to right and a false left side hides an error on the right, so every
selector checks the driver first: a device of another driver lacks the `akri.sh` attributes,
and reading a missing attribute is an error that aborts the whole allocation.
"""

from __future__ import annotations

from akri_trio.dra.attributes import CONFIGURATION, INSTANCE, NAMESPACE
from akri_trio.dra.devices import API_VERSION
from akri_trio.dra.names import (
    DOMAIN,
    DRIVER,
    LABEL_NAMESPACE,
    cel_string,
    device_class_name,
    extended_resource_name,
    fit_value,
    instance_class_name,
)
from akri_trio.model.naming import LABEL_CONFIGURATION, LABEL_INSTANCE
from akri_trio.model.resources import JSON


def _attribute(name: str) -> str:
    return f"device.attributes[{cel_string(DOMAIN)}].{name}"


def is_ours() -> str:
    return f"device.driver == {cel_string(DRIVER)}"


def configuration_selector(configuration: str, namespace: str) -> str:
    """CEL: the devices of one Configuration."""
    return " && ".join(
        [
            is_ours(),
            f"{_attribute(NAMESPACE)} == {cel_string(fit_value(namespace))}",
            f"{_attribute(CONFIGURATION)} == {cel_string(fit_value(configuration))}",
        ]
    )


def instance_selector(instance: str) -> str:
    """CEL, for a claim request in a Configuration's class: the device(s) of one Instance."""
    return f"{_attribute(INSTANCE)} == {cel_string(fit_value(instance))}"


def device_class(configuration: str, namespace: str) -> JSON:
    """The DeviceClass `<configuration>.<namespace>.akri.sh` selecting that Configuration's
    devices, for `akri.sh/<configuration>` (labels name the Configuration; label values are at
    most 63 chars, so an overlong name is left to the selector alone)."""
    return _class(
        device_class_name(configuration, namespace),
        {LABEL_CONFIGURATION: configuration},
        namespace,
        configuration_selector(configuration, namespace),
        extended_resource_name(configuration),
    )


def instance_class(configuration: str, namespace: str, instance: str) -> JSON:
    """The DeviceClass `<instance>.<namespace>.instance.akri.sh` selecting one Instance's
    devices (its slots, or its one consumable-capacity device), for `akri.sh/<instance>`."""
    selector = (
        f"{configuration_selector(configuration, namespace)} && {instance_selector(instance)}"
    )
    return _class(
        instance_class_name(instance, namespace),
        {LABEL_CONFIGURATION: configuration, LABEL_INSTANCE: instance},
        namespace,
        selector,
        extended_resource_name(instance),
    )


def _class(
    name: str, names: dict[str, str], namespace: str, selector: str, resource: str | None
) -> JSON:
    labels = {LABEL_NAMESPACE: namespace, **{k: v for k, v in names.items() if len(v) <= 63}}
    spec: JSON = {"selectors": [{"cel": {"expression": selector}}]}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def claim_spec(
    configuration: str, namespace: str, instance: str | None = None, *, request: str = "device"
) -> JSON:
    """A ResourceClaimSpec asking for one device of a Configuration's class, of one Instance
    when `instance` is given (what a broker or a Pod's ResourceClaimTemplate holds)."""
    exactly: JSON = {"deviceClassName": device_class_name(configuration, namespace)}
    if instance is not None:
        exactly["selectors"] = [{"cel": {"expression": instance_selector(instance)}}]
    return {"devices": {"requests": [{"name": request, "exactly": exactly}]}}
