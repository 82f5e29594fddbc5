"""Checking user-written Kubernetes objects against the cluster's OpenAPI v2 document.

A Configuration carries a PodSpec or JobSpec and two ServiceSpecs that the CRD keeps as
free-form objects (`x-kubernetes-preserve-unknown-fields`), so the API server accepts a typo
there; the typo surfaces only when the controller creates the broker and the server refuses
it, far from the user. Checking them against the very schemas the API server will apply (the
`definitions` of its `/openapi/v2`, e.g. `io.k8s.api.core.v1.PodSpec`) moves that refusal to
admission time, with the field's path, and stays right for any Kubernetes version.

What is checked: unknown fields, JSON types, required fields, int32/int64 ranges,
int-or-string values and quantities (a string in Kubernetes' quantity syntax, or a number).
What is accepted unchecked: `null` (decoding reads it as absent), anything under
`x-kubernetes-preserve-unknown-fields` or a schema with no properties (free-form objects such
as `RawExtension`), and anything behind a `$ref` the document does not define.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

QUANTITY: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
POD_SPEC: Final = "io.k8s.api.core.v1.PodSpec"
JOB_SPEC: Final = "io.k8s.api.batch.v1.JobSpec"
SERVICE_SPEC: Final = "io.k8s.api.core.v1.ServiceSpec"

# <sign><digits>[.<digits>]<suffix>: binary SI (Ki..Ei), decimal SI (n..E) or an exponent.
_QUANTITY_SYNTAX = re.compile(
    r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?"
)
_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_TYPE_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
}


def describe(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def is_quantity(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and _QUANTITY_SYNTAX.fullmatch(value) is not None


class Schemas:
    """The `definitions` of an OpenAPI v2 document (as parsed JSON), to check values against."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.definitions: Mapping[str, Any] = document.get("definitions") or {}

    def problems(self, value: Any, definition: str, path: str) -> list[str]:
        """`path: problem` lines for `value` checked against the named definition."""
        out: list[str] = []
        self._check(value, {"$ref": f"#/definitions/{definition}"}, path, out)
        return out

    def _check(self, value: Any, schema: Mapping[str, Any], path: str, out: list[str]) -> None:
        if value is None:
            return
        ref = schema.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name == QUANTITY:
                if not is_quantity(value):
                    out.append(f"{path}: expected a quantity (e.g. 1, 500m, 2Gi), got {value!r}")
                return
            target = self.definitions.get(name)
            if isinstance(target, Mapping):
                self._check(value, target, path, out)
            return
        for part in schema.get("allOf") or ():
            self._check(value, part, path, out)
        if schema.get("format") == "int-or-string" or schema.get("x-kubernetes-int-or-string"):
            if isinstance(value, bool) or not isinstance(value, int | str):
                out.append(f"{path}: expected an integer or a string, got {describe(value)}")
            return
        kind = schema.get("type")
        if kind == "object" or (kind is None and "properties" in schema):
            self._object(value, schema, path, out)
        elif kind == "array":
            if not isinstance(value, list):
                out.append(f"{path}: expected an array, got {describe(value)}")
                return
            items = schema.get("items")
            if isinstance(items, Mapping):
                for i, item in enumerate(value):
                    self._check(item, items, f"{path}[{i}]", out)
        elif kind is not None:
            self._scalar(value, kind, schema.get("format"), path, out)

    def _object(self, value: Any, schema: Mapping[str, Any], path: str, out: list[str]) -> None:
        if not isinstance(value, dict):
            out.append(f"{path}: expected an object, got {describe(value)}")
            return
        properties: Mapping[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        open_ended = schema.get("x-kubernetes-preserve-unknown-fields") is True or extra is True
        free_form = not properties and extra is None
        for name in schema.get("required") or ():
            if value.get(name) is None:
                out.append(f"{path}.{name}: required")
        for key, item in value.items():
            where = f"{path}.{key}"
            if key in properties:
                self._check(item, properties[key], where, out)
            elif isinstance(extra, Mapping):
                self._check(item, extra, where, out)
            elif not (open_ended or free_form):
                out.append(f"{where}: unknown field")

    @staticmethod
    def _scalar(value: Any, kind: str, fmt: Any, path: str, out: list[str]) -> None:
        ok = {
            "string": isinstance(value, str),
            "boolean": isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
        }.get(kind, True)
        if not ok:
            out.append(
                f"{path}: expected {'an' if kind == 'integer' else 'a'} {kind}, got "
                f"{describe(value)}"
            )
        elif kind == "integer" and fmt in _RANGES:
            low, high = _RANGES[fmt]
            if not low <= value <= high:
                out.append(f"{path}: {value} is out of the {fmt} range")
