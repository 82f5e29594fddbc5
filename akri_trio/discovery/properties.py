"""Resolving a Configuration's discoveryProperties into the bytes a handler receives.

Handlers get `{name: bytes | None}` (discovery.proto's `map<string, ByteData>`); users write
plain values or references to Secret / ConfigMap keys (credentials for ONVIF cameras, say).
This is upstream's `discovery_property_solver.rs` as a pure function: the caller fetches the
referenced objects (see `referenced_objects`) with the kube client and passes them in, so the
rules — which source wins, what optional means, how base64 is decoded — are tested without an
API server.

Lookups: `config_maps` and `secrets` map `(namespace, name)` to the object's JSON as the API
server returns it (`data` / `binaryData` for ConfigMaps, base64 `data` for Secrets). An object
absent from the mapping is "not found".
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from akri_trio.model.resources import DiscoveryProperty, KeyRef

ObjectKey = tuple[str, str]  # (namespace, name)
Objects = Mapping[ObjectKey, Mapping[str, Any]]


class UnsolvableProperty(Exception):
    """A non-optional property whose source is missing or unreadable."""

    def __init__(self, property_name: str, source: str, problem: str) -> None:
        self.property_name = property_name
        self.source = source
        super().__init__(f"discoveryProperties {property_name!r}: {source}: {problem}")


@attrs.frozen
class ObjectRef:
    kind: Literal["Secret", "ConfigMap"]
    namespace: str
    name: str


def _source(prop: DiscoveryProperty) -> tuple[Literal["Secret", "ConfigMap"], KeyRef] | None:
    if prop.value_from is None:
        return None
    # Upstream's ValueFrom is an enum: one of the two; we honour Secret first if both are set.
    if prop.value_from.secret_key_ref is not None:
        return "Secret", prop.value_from.secret_key_ref
    if prop.value_from.config_map_key_ref is not None:
        return "ConfigMap", prop.value_from.config_map_key_ref
    return None


def referenced_objects(properties: Iterable[DiscoveryProperty]) -> set[ObjectRef]:
    """The Secrets and ConfigMaps that `resolve` will look up (for the fetching shell)."""
    refs: set[ObjectRef] = set()
    for prop in properties:
        source = _source(prop) if prop.value is None else None
        if source is not None:
            kind, ref = source
            refs.add(ObjectRef(kind, ref.namespace, ref.name))
    return refs


def _b64(text: Any, prop: str, where: str) -> bytes:
    if not isinstance(text, str):
        raise UnsolvableProperty(prop, where, "value is not a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UnsolvableProperty(prop, where, f"invalid base64: {exc}") from exc


def _lookup(
    prop: str, kind: str, ref: KeyRef, config_maps: Objects, secrets: Objects
) -> bytes | None:
    where = f"{kind} {ref.namespace}/{ref.name} key {ref.key!r}"
    obj = (secrets if kind == "Secret" else config_maps).get((ref.namespace, ref.name))
    if obj is None:
        return None
    data = obj.get("data") or {}
    if kind == "ConfigMap":
        if ref.key in data:
            value = data[ref.key]
            if not isinstance(value, str):
                raise UnsolvableProperty(prop, where, "value is not a string")
            return value.encode()
        binary = obj.get("binaryData") or {}
        if ref.key in binary:
            return _b64(binary[ref.key], prop, where)
        return None
    if ref.key in data:
        return _b64(data[ref.key], prop, where)
    return None


def resolve(
    properties: Iterable[DiscoveryProperty] | None,
    config_maps: Objects,
    secrets: Objects,
) -> dict[str, bytes | None]:
    """discoveryProperties -> {name: bytes | None}.

    `value` -> its UTF-8 bytes; `valueFrom` -> the ConfigMap's `data` then `binaryData`
    (base64), or the Secret's `data` (base64); a missing source that is `optional` is omitted,
    otherwise UnsolvableProperty names the property and the source; neither -> None.
    """
    resolved: dict[str, bytes | None] = {}
    for prop in properties or ():
        if prop.value is not None:
            resolved[prop.name] = prop.value.encode()
            continue
        source = _source(prop)
        if source is None:
            resolved[prop.name] = None
            continue
        kind, ref = source
        value = _lookup(prop.name, kind, ref, config_maps, secrets)
        if value is not None:
            resolved[prop.name] = value
        elif not ref.optional:
            where = f"{kind} {ref.namespace}/{ref.name} key {ref.key!r}"
            raise UnsolvableProperty(prop.name, where, "not found (and not optional)")
    return resolved
