"""JSON <-> model conversion with cattrs: camelCase keys, defaults omitted, clear errors.

Two converters: `lenient` for objects read from the API server (which has already pruned them
against the CRD schema; a newer upstream field must not break an older agent), and `strict`,
which rejects unknown keys — what the validating webhook uses to tell a user about a typo.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from akri_trio.model.resources import (
    JSON,
    BrokerSpec,
    Configuration,
    ObjectMeta,
    with_own_namespace,
)

T = TypeVar("T")

# Emitted even when equal to the default: an object without them cannot be applied.
_ALWAYS = {(None, "api_version"), (None, "kind"), (ObjectMeta, "namespace")}
_BROKER_KEYS = {"pod": "brokerPodSpec", "job": "brokerJobSpec"}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _always(cls: type, field: str) -> bool:
    return (None, field) in _ALWAYS or (cls, field) in _ALWAYS


def _make(strict: bool) -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=strict)

    def structure_factory(cls: type) -> Any:
        renames: dict[str, Any] = {
            f.name: override(rename=camel(f.name)) for f in attrs.fields(cls)
        }
        return make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=strict, **renames)

    def unstructure_factory(cls: type) -> Any:
        renames: dict[str, Any] = {
            f.name: override(rename=camel(f.name), omit_if_default=not _always(cls, f.name))
            for f in attrs.fields(cls)
        }
        return make_dict_unstructure_fn(cls, conv, **renames)

    def structure_broker(value: Any, _: type) -> BrokerSpec:
        if not isinstance(value, dict) or len(value) != 1:
            raise ValueError("brokerSpec must have exactly one of brokerPodSpec, brokerJobSpec")
        ((key, spec),) = value.items()
        kinds = {v: k for k, v in _BROKER_KEYS.items()}
        if key not in kinds:
            raise ValueError(f"brokerSpec: unknown broker kind {key!r}")
        if not isinstance(spec, dict):
            raise ValueError(f"brokerSpec.{key} must be an object")
        return BrokerSpec(kinds[key], spec)  # type: ignore[arg-type]

    def structure_json(value: Any, _: type) -> JSON:
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {type(value).__name__}")
        return value

    conv.register_structure_hook(BrokerSpec, structure_broker)
    conv.register_unstructure_hook(BrokerSpec, lambda b: {_BROKER_KEYS[b.kind]: b.spec})
    conv.register_structure_hook_func(lambda t: t == JSON, structure_json)
    for scalar in (str, int, bool):
        conv.register_structure_hook(scalar, _exact(scalar))
    conv.register_structure_hook_factory(
        lambda t: attrs.has(t) and t is not BrokerSpec, structure_factory
    )
    configuration = structure_factory(Configuration)
    conv.register_structure_hook(
        Configuration, lambda value, t: with_own_namespace(configuration(value, t))
    )
    conv.register_unstructure_hook_factory(
        lambda t: attrs.has(t) and t is not BrokerSpec, unstructure_factory
    )
    return conv


def _exact(kind: type[T]) -> Any:
    """cattrs would coerce (str(3) == "3", int("2") == 2); a Configuration with the wrong type
    is a user error to report, not to paper over."""

    def check(value: Any, _: type) -> T:
        if type(value) is not kind and not (
            kind is int and type(value) is float and value == int(value)
        ):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return kind(value)  # type: ignore[call-arg]

    return check


lenient = _make(strict=False)
strict = _make(strict=True)


def drop_nulls(data: Any) -> Any:
    """The API server writes `null` for emptied fields (e.g. `finalizers` after the last one is
    removed); for Kubernetes objects null and absent mean the same, so read null as absent."""
    if isinstance(data, dict):
        return {k: drop_nulls(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [drop_nulls(v) for v in data]
    return data


def structure(data: Any, cls: type[T], *, strict_keys: bool = False) -> T:
    """Strict mode (the webhook) checks what a user wrote, nulls included; lenient mode reads
    what the API server returns."""
    if strict_keys:
        return strict.structure(data, cls)
    return lenient.structure(drop_nulls(data), cls)


def unstructure(obj: Any) -> Any:
    return lenient.unstructure(obj)


_SNAKE_SEGMENT = re.compile(r"\.([a-z][a-z0-9]*(?:_[a-z0-9]+)+)")


def error_messages(exc: BaseException, root: str = "") -> list[str]:
    """Flatten a cattrs validation error into 'problem @ path' lines a user can act on."""
    if isinstance(exc, cattrs.BaseValidationError):
        lines = cattrs.transform_error(exc, path=root or "$", format_exception=_describe)
        return [_SNAKE_SEGMENT.sub(lambda m: "." + camel(m[1]), line) for line in lines]
    return [str(exc)]


def _describe(exc: BaseException, type_: type | None) -> str:
    # Our own hooks raise ValueError/TypeError with a message meant for the user; keep it.
    if isinstance(exc, ValueError | TypeError) and str(exc) and not isinstance(exc, KeyError):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)
