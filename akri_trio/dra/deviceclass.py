"""The DeviceClass of a Configuration and CEL selectors over Akri's attributes.

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
    fit_value,
)
from akri_trio.model.naming import LABEL_CONFIGURATION
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
    devices (labels name the Configuration; label values are at most 63 chars, so an overlong
    name is left to the selector alone)."""
    labels = {LABEL_NAMESPACE: namespace}
    if len(configuration) <= 63:
        labels[LABEL_CONFIGURATION] = configuration
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": device_class_name(configuration, namespace), "labels": labels},
        "spec": {
            "selectors": [{"cel": {"expression": configuration_selector(configuration, namespace)}}]
        },
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
