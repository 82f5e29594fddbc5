"""What a discovery handler is, whoever runs it: the agent in-process, or its own gRPC server.

Upstream ships every handler twice (a library linked into `agent-full` and a standalone
binary); here a handler is written once against this interface and both the agent's embedded
path and `standalone.py` drive the very same object. A handler is:

- `name`, `shared`: what it registers as (upstream's names: "debugEcho", "udev", ...);
- `parse_details(text)`: PURE, YAML or JSON text -> a typed details value, or `InvalidDetails`
  naming the bad field. The validating webhook calls it as is; served over gRPC it becomes
  `InvalidArgument`;
- `discover(details, properties, send)`: runs until cancelled and `send`s the FULL device list
  whenever it may have changed. `discover_changes` wraps it so that only real changes (and
  always the first list) go out, which is upstream's "send only on change" rule in one place.

The small YAML helpers below keep every handler's errors worded the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

import yaml

from akri_trio.model.device import Device

DetailsT = TypeVar("DetailsT")
DetailsT_co = TypeVar("DetailsT_co", covariant=True)

# The handler hands over the full list each time; `send` may wait (back-pressure).
Send = Callable[[list[Device]], Awaitable[None]]
# discoveryProperties as the agent resolved them: None = declared without a value.
Properties = Mapping[str, bytes | None]


class InvalidDetails(ValueError):
    """discoveryDetails that a handler cannot use. `field` is the dotted path of the offending
    field (None when the document as a whole is bad); str() is the message users see."""

    def __init__(self, field: str | None, problem: str) -> None:
        self.field = field
        self.problem = problem
        where = f"discoveryDetails.{field}" if field else "discoveryDetails"
        super().__init__(f"{where}: {problem}")


class DiscoveryHandler(Protocol[DetailsT]):
    """One discovery protocol. See the module docstring for the contract."""

    @property
    def name(self) -> str: ...

    @property
    def shared(self) -> bool: ...

    def parse_details(self, text: str) -> DetailsT: ...

    async def discover(self, details: DetailsT, properties: Properties, send: Send) -> None: ...


AnyHandler = DiscoveryHandler[Any]


def _canonical(devices: Iterable[Device]) -> list[Device]:
    # Handlers need not keep a stable order; a reordering alone is not a change.
    return sorted(devices, key=lambda d: d.id)


async def discover_changes(
    handler: DiscoveryHandler[DetailsT],
    details: DetailsT,
    properties: Properties,
    send: Send,
) -> None:
    """Run `handler.discover`, passing on the first list and then only lists that differ from
    the last one passed on (ignoring order). Lists go out sorted by device id."""
    last: list[Device] | None = None

    async def send_if_changed(devices: list[Device]) -> None:
        nonlocal last
        current = _canonical(devices)
        if current != last:
            last = current
            await send(list(current))

    await handler.discover(details, properties, send_if_changed)


# ---- details parsing helpers (pure) -------------------------------------------------------------


def load_mapping(text: str) -> dict[str, Any]:
    """Parse discoveryDetails (YAML; JSON is a subset) into a mapping. Empty text is `{}`."""
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        # The first line carries the position; the rest is a code excerpt.
        raise InvalidDetails(None, f"not valid YAML: {str(exc).splitlines()[0]}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise InvalidDetails(None, f"must be a mapping, got {describe_kind(doc)}")
    return doc


def required_str_list(doc: Mapping[str, Any], field: str) -> tuple[str, ...]:
    """`doc[field]` as a tuple of strings; missing or mistyped -> InvalidDetails(field)."""
    if field not in doc or doc[field] is None:
        raise InvalidDetails(field, "is required")
    return str_list(doc[field], field)


def str_list(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidDetails(field, f"must be a list of strings, got {describe_kind(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidDetails(f"{field}[{i}]", f"must be a string, got {describe_kind(item)}")
    return tuple(value)


def describe_kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)
