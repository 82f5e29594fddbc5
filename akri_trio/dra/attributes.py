"""The attributes a DRA device carries for an Instance, within DRA's limits.

Three identify it — `akri.sh/configuration`, `akri.sh/namespace`, `akri.sh/instance` — and the
Instance's broker properties follow when they fit: a name that is a C identifier of at most 32
chars, a value of at most 64, and at most 32 attributes and capacities per device in all. What is
left out is reported with the reason; it still reaches the container through the CDI spec's env.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import attrs

from akri_trio.dra.names import ATTRIBUTE_VALUE_MAX, DOMAIN, fit_value
from akri_trio.model.resources import JSON

MAX_ENTRIES: Final = 32  # attributes + capacities of one device
NAME_MAX: Final = 32
CONFIGURATION: Final = "configuration"
NAMESPACE: Final = "namespace"
INSTANCE: Final = "instance"
IDENTITY: Final = (CONFIGURATION, NAMESPACE, INSTANCE)

_C_IDENTIFIER = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")


@attrs.frozen
class Omitted:
    """A broker property that is not an attribute, and why."""

    name: str
    reason: str


@attrs.frozen
class Attributes:
    """`values`: unqualified name -> string value (published as `akri.sh/<name>`)."""

    values: Mapping[str, str]
    omitted: tuple[Omitted, ...] = ()

    def as_api(self) -> dict[str, JSON]:
        """The `attributes` map of a resource.k8s.io/v1 Device."""
        return {f"{DOMAIN}/{k}": {"string": v} for k, v in sorted(self.values.items())}


def qualified(name: str) -> str:
    return f"{DOMAIN}/{name}"


def identity(configuration: str, namespace: str, instance: str) -> dict[str, str]:
    """The three identifying attributes; overlong names are hashed as `names.fit_value` does."""
    return {
        CONFIGURATION: fit_value(configuration),
        NAMESPACE: fit_value(namespace),
        INSTANCE: fit_value(instance),
    }


def device_attributes(
    configuration: str,
    namespace: str,
    instance: str,
    properties: Mapping[str, str],
    *,
    capacities: int = 0,
) -> Attributes:
    """Identity first, then the properties that fit, by name, until the device holds
    MAX_ENTRIES attributes plus `capacities` capacities."""
    values = identity(configuration, namespace, instance)
    omitted: list[Omitted] = []
    room = MAX_ENTRIES - capacities - len(values)
    for name in sorted(properties):
        value = properties[name]
        if name in IDENTITY:
            reason = "name is reserved for an identifying attribute"
        elif len(name) > NAME_MAX:
            reason = f"name longer than {NAME_MAX} chars"
        elif not _C_IDENTIFIER.fullmatch(name):
            reason = "name is not a C identifier"
        elif len(value) > ATTRIBUTE_VALUE_MAX:
            reason = f"value longer than {ATTRIBUTE_VALUE_MAX} chars"
        elif room <= 0:
            reason = f"more than {MAX_ENTRIES} attributes and capacities"
        else:
            values[name] = value
            room -= 1
            continue
        omitted.append(Omitted(name, reason))
    return Attributes(values, tuple(omitted))
