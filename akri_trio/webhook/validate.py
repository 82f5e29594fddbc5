"""Admission validation of Configurations, as a pure function of the AdmissionReview.

The CRD schema lets through what only Akri knows is wrong, and each of those mistakes
otherwise surfaces late and far from the user: a typo in the broker PodSpec when the
controller's create is refused, bad discoveryDetails in an agent's status, a Secret in another
namespace as a silently missing credential. Here each becomes a refusal naming the field:

- the spec's own fields, unknown or mistyped (the model's strict converter);
- brokerSpec with both or neither of brokerPodSpec / brokerJobSpec;
- brokerPodSpec, brokerJobSpec, instanceServiceSpec, configurationServiceSpec against the
  cluster's own OpenAPI schemas (openapi.py);
- capacity outside 1..MAX_CAPACITY;
- discoveryProperties: a name that is not an identifier or is repeated, not exactly one of
  value / valueFrom, not exactly one reference kind, a reference to another namespace (an
  omitted namespace means "default", as the agent reads it);
- discoveryDetails that the named built-in handler's own `parse_details` refuses (a handler
  this project does not ship is external, and its details are its own business);
- a discoveryHandler.name changed by an UPDATE (agents key their discovery on it);
- on CREATE, a name another namespace already uses: kubelet resources (`akri.sh/<name>`) are
  per node, not per namespace, so agents would refuse the newer one on every node;
- a handler the cluster admin restricted to some namespaces (`--handler-namespace
  HANDLER:NAMESPACE`), used from another one: the tenant may not reach that kind of device at
  all (udev: the node's own devices). A handler no entry names may be used anywhere.

`review` answers admission.k8s.io/v1 and v1beta1 alike, in the version it was asked in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from akri_trio.discovery.interface import InvalidDetails
from akri_trio.model import convert
from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.model.resources import OWN_NAMESPACE, ConfigurationSpec, DiscoveryProperty, KeyRef
from akri_trio.webhook import openapi
from akri_trio.webhook.openapi import Schemas
from akri_trio.webhook.parsers import Parser, builtin_parser

# An Instance is named `<configuration>-<6 hex>` and must fit in 253 characters.
MAX_NAME: Final = 253 - 7
REVIEW_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

_PROPERTY_NAME = re.compile(r"[_A-Za-z][_A-Za-z0-9]*")
_BROKER_KINDS = {"brokerPodSpec": openapi.POD_SPEC, "brokerJobSpec": openapi.JOB_SPEC}
_SERVICES = ("instanceServiceSpec", "configurationServiceSpec")
_HANDLER = "spec.discoveryHandler"

ParserFor = Callable[[str], Parser | None]
# The namespaces holding a Configuration of a given name (the server's watch answers it).
NamespacesUsing = Callable[[str], Sequence[str]]


# Handler name -> the only namespaces whose Configurations may use it (--handler-namespace).
HandlerNamespaces = Mapping[str, frozenset[str]]


def no_namespaces(name: str) -> Sequence[str]:
    return ()


def parse_handler_namespaces(entries: Sequence[str]) -> HandlerNamespaces:
    """`HANDLER:NAMESPACE` entries as a mapping; ValueError naming the entry that is wrong."""
    allowed: dict[str, set[str]] = {}
    for entry in entries:
        handler, sep, namespace = entry.partition(":")
        if not (sep and handler and namespace):
            raise ValueError(f"{entry!r} is not HANDLER:NAMESPACE")
        allowed.setdefault(handler, set()).add(namespace)
    return {handler: frozenset(namespaces) for handler, namespaces in allowed.items()}


def handler_refused(handler: object, namespace: str, policy: HandlerNamespaces) -> list[str]:
    """The refusal of a Configuration in `namespace` using `handler`, if the admin restricted it."""
    if not isinstance(handler, str) or handler not in policy or namespace in policy[handler]:
        return []
    return [
        f"{_HANDLER}.name: namespace {namespace} may not use the {handler} discovery handler "
        f"(the cluster admin allows it in: {', '.join(sorted(policy[handler]))})"
    ]


class BadReview(ValueError):
    """The body is not an AdmissionReview request this webhook can answer (HTTP 400)."""


def review(
    body: Mapping[str, Any],
    schemas: Schemas,
    parser_for: ParserFor = builtin_parser,
    namespaces_using: NamespacesUsing = no_namespaces,
    handler_namespaces: HandlerNamespaces | None = None,
) -> dict[str, Any]:
    """The AdmissionReview response to `body`, allowing or denying its request."""
    version = body.get("apiVersion")
    request = body.get("request")
    if version not in REVIEW_VERSIONS or body.get("kind") != "AdmissionReview":
        raise BadReview(f"not an AdmissionReview of {' or '.join(REVIEW_VERSIONS)}")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise BadReview("AdmissionReview without request.uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    operation = request.get("operation")
    kind = _dig(request, "kind", "kind"), _dig(request, "kind", "group")
    ours = kind == ("Configuration", "akri.sh")
    if ours and operation in ("CREATE", "UPDATE"):
        obj = request.get("object")
        problems = validate_configuration(
            obj,
            schemas,
            namespace=request.get("namespace"),
            old=request.get("oldObject") if operation == "UPDATE" else None,
            parser_for=parser_for,
        )
        name = _dig(obj, "metadata", "name") or request.get("name") or ""
        if operation == "CREATE" and isinstance(name, str) and name:
            problems += name_taken(name, request.get("namespace"), namespaces_using(name))
        handler = _dig(obj, "spec", "discoveryHandler", "name")
        namespace = request.get("namespace") or _dig(obj, "metadata", "namespace") or "default"
        problems += handler_refused(handler, namespace, handler_namespaces or {})
        if problems:
            response["allowed"] = False
            response["status"] = {
                "status": "Failure",
                "code": 422,
                "reason": "Invalid",
                "message": f"Configuration {name} is invalid: " + "; ".join(problems),
            }
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def validate_configuration(
    obj: Any,
    schemas: Schemas,
    *,
    namespace: str | None = None,
    old: Mapping[str, Any] | None = None,
    parser_for: ParserFor = builtin_parser,
) -> list[str]:
    """Every problem with `obj` (a Configuration as JSON), as `field.path: problem` lines."""
    namespace = namespace or _dig(obj, "metadata", "namespace") or "default"
    problems: list[str] = []
    name = _dig(obj, "metadata", "name")
    if isinstance(name, str) and len(name) > MAX_NAME:
        problems.append(
            f"metadata.name: at most {MAX_NAME} characters, so that its Instances' names "
            "(<name>-<6 hex>) are valid"
        )
    spec = _dig(obj, "spec")
    if not isinstance(spec, Mapping):
        return [*problems, f"spec: required, got {openapi.describe(spec)}"]
    spec = dict(spec)
    broker_problems = _broker_spec(spec.get("brokerSpec"), schemas)
    if broker_problems:
        problems += broker_problems
        spec.pop("brokerSpec")
    for field in _SERVICES:
        if isinstance(spec.get(field), dict):
            problems += schemas.problems(spec[field], openapi.SERVICE_SPEC, f"spec.{field}")
    problems += _handler_renamed(spec, old)
    try:
        typed = convert.structure(spec, ConfigurationSpec, strict_keys=True)
    except Exception as exc:
        return problems + [_path_first(line) for line in convert.error_messages(exc, "spec")]
    problems += _capacity(typed.capacity)
    for i, prop in enumerate(typed.discovery_handler.discovery_properties or ()):
        raw = spec["discoveryHandler"]["discoveryProperties"][i]
        where = f"{_HANDLER}.discoveryProperties[{i}]"
        problems += _property(prop, raw, where, namespace)
    problems += _duplicate_names(typed.discovery_handler.discovery_properties or ())
    problems += _details(typed, parser_for)
    return problems


def name_taken(name: str, namespace: str | None, used_in: Sequence[str]) -> list[str]:
    """A CREATE of `name` in `namespace`, given the namespaces that already hold that name."""
    others = sorted({ns for ns in used_in if ns != namespace})
    if not others:
        return []
    return [
        f"metadata.name: a Configuration {name} already exists in namespace "
        f"{', '.join(others)}; kubelet resources (akri.sh/{name}) are per node, not per "
        "namespace, so agents would refuse this one on every node: choose another name"
    ]


def _path_first(line: str) -> str:
    """The converter writes 'problem @ path'; every other message here is 'path: problem'."""
    problem, sep, path = line.rpartition(" @ ")
    return f"{path}: {problem}" if sep else line


def _broker_spec(broker: Any, schemas: Schemas) -> list[str]:
    if broker is None:
        return []
    if not isinstance(broker, dict):
        return [f"spec.brokerSpec: expected an object, got {openapi.describe(broker)}"]
    problems = [f"spec.brokerSpec.{k}: unknown field" for k in broker if k not in _BROKER_KINDS]
    given = [k for k in _BROKER_KINDS if broker.get(k) is not None]
    if len(given) != 1:
        which = "both" if given else "neither"
        problems.append(
            f"spec.brokerSpec: exactly one of brokerPodSpec, brokerJobSpec is needed, got {which}"
        )
    for kind in given:
        path = f"spec.brokerSpec.{kind}"
        if isinstance(broker[kind], dict):
            problems += schemas.problems(broker[kind], _BROKER_KINDS[kind], path)
        else:
            problems.append(f"{path}: expected an object, got {openapi.describe(broker[kind])}")
    return problems


def _handler_renamed(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    if old is None:
        return []
    before = _dig(old, "spec", "discoveryHandler", "name")
    after = _dig(spec, "discoveryHandler", "name")
    if isinstance(before, str) and isinstance(after, str) and before != after:
        return [
            f"{_HANDLER}.name: cannot change ({before!r} -> {after!r}); "
            "create a new Configuration instead"
        ]
    return []


def _dig(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]..., or None where a level is missing or not an object."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _capacity(capacity: int) -> list[str]:
    if 1 <= capacity <= MAX_CAPACITY:
        return []
    return [f"spec.capacity: must be between 1 and {MAX_CAPACITY}, got {capacity}"]


def _property(
    prop: DiscoveryProperty, raw: Mapping[str, Any], where: str, namespace: str
) -> list[str]:
    problems = []
    if not _PROPERTY_NAME.fullmatch(prop.name):
        problems.append(
            f"{where}.name: {prop.name!r} is not a name of letters, digits and '_' "
            "that starts with a letter or '_'"
        )
    if (prop.value is None) == (prop.value_from is None):
        which = "both" if prop.value is not None else "neither"
        problems.append(f"{where}: exactly one of value, valueFrom is needed, got {which}")
    source = prop.value_from
    if source is None:
        return problems
    refs: list[tuple[str, KeyRef]] = [
        (field, ref)
        for field, ref in (
            ("secretKeyRef", source.secret_key_ref),
            ("configMapKeyRef", source.config_map_key_ref),
        )
        if ref is not None
    ]
    if len(refs) != 1:
        which = "both" if refs else "neither"
        problems.append(
            f"{where}.valueFrom: exactly one of secretKeyRef, configMapKeyRef is needed, "
            f"got {which}"
        )
    for field, ref in refs:
        # An omitted one is the Configuration's own (filled from metadata, which the request's
        # namespace wins over here).
        given = raw["valueFrom"][field].get("namespace")
        if given not in (None, OWN_NAMESPACE) and ref.namespace != namespace:
            problems.append(
                f"{where}.valueFrom.{field}.namespace: {ref.namespace!r} is not the "
                f"Configuration's namespace {namespace!r}; a Configuration may only read its own "
                "namespace (leave `namespace` out for its own)"
            )
    return problems


def _duplicate_names(props: tuple[DiscoveryProperty, ...]) -> list[str]:
    seen: dict[str, int] = {}
    problems = []
    for i, prop in enumerate(props):
        if prop.name in seen:
            problems.append(
                f"{_HANDLER}.discoveryProperties[{i}].name: {prop.name!r} is already "
                f"discoveryProperties[{seen[prop.name]}]"
            )
        seen.setdefault(prop.name, i)
    return problems


def _details(spec: ConfigurationSpec, parser_for: ParserFor) -> list[str]:
    handler = spec.discovery_handler
    parse = parser_for(handler.name)
    if parse is None:
        return []
    try:
        parse(handler.discovery_details)
    except InvalidDetails as exc:
        return [f"{_HANDLER}.{exc}"]
    except Exception as exc:
        return [f"{_HANDLER}.discoveryDetails: {handler.name} cannot use them: {exc}"]
    return []
