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
  A handler may also say what it cannot discover (cameras refusing the credentials, say) with
  `report_problems(send, lines)`: the full current set of lines for the Configuration's status,
  `[]` once resolved. The `send` that `discover_changes` hands out carries them to its `report`
  callback; a plain `send` (a test's function) drops them.

The small YAML helpers below keep every handler's errors worded the same way. discoveryDetails
are written by whoever may create a Configuration, so `load_mapping` bounds what a document
may cost (size, nesting) and turns everything YAML can throw (tags that fail to construct,
impossible dates, integers past Python's digit limit) into `InvalidDetails`; `details_parser`
is the last line: whatever else a handler's parser raises is `InvalidDetails` too, so a bad
document is a Configuration problem and never a handler failure.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, ParamSpec, Protocol, TypeVar

from akri_trio.model.device import Device

DetailsT = TypeVar("DetailsT")
P = ParamSpec("P")
T = TypeVar("T")

# A handful of upstream examples are under 1 KiB; this leaves room for long udev rule lists.
MAX_DETAILS_BYTES: Final = 64 * 1024
MAX_DETAILS_BYTES_ENV: Final = "AKRI_DISCOVERY_DETAILS_MAX_BYTES"
# No handler's format nests beyond 4 levels; PyYAML's composer recurses once per level.
MAX_DETAILS_DEPTH: Final = 32
DetailsT_co = TypeVar("DetailsT_co", covariant=True)

# The handler hands over the full list each time; `send` may wait (back-pressure).
Send = Callable[[list[Device]], Awaitable[None]]
# Takes the handler's problems (full set each time); see `report_problems`.
Report = Callable[[tuple[str, ...]], Awaitable[None]]
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


class ChangesOnly:
    """The `send` that `discover_changes` gives a handler: passes on device lists and
    problems that differ from the last ones passed on."""

    def __init__(self, send: Send, report: Report | None) -> None:
        self._send = send
        self._report = report
        self._last: list[Device] | None = None
        self._problems: tuple[str, ...] = ()

    async def __call__(self, devices: list[Device]) -> None:
        current = _canonical(devices)
        if current != self._last:
            self._last = current
            await self._send(list(current))

    async def problems(self, lines: Sequence[str]) -> None:
        current = tuple(lines)
        if current != self._problems:
            self._problems = current
            if self._report is not None:
                await self._report(current)


async def report_problems(send: Send, lines: Sequence[str]) -> None:
    """For a handler: replace its problems for the Configuration's status with `lines`
    (sent on only when they change; dropped when `send` is not `discover_changes`' own)."""
    if isinstance(send, ChangesOnly):
        await send.problems(lines)


async def discover_changes(
    handler: DiscoveryHandler[DetailsT],
    details: DetailsT,
    properties: Properties,
    send: Send,
    *,
    report: Report | None = None,
) -> None:
    """Run `handler.discover`, passing on the first list and then only lists that differ from
    the last one passed on (ignoring order). Lists go out sorted by device id. The handler's
    problems go to `report` (when given) as they change; none at first."""
    await handler.discover(details, properties, ChangesOnly(send, report))


# ---- details parsing helpers (pure) -------------------------------------------------------------


def details_parser(parse: Callable[P, T]) -> Callable[P, T]:
    """Decorate a `parse_details`: anything it raises other than InvalidDetails (a case its
    own checks missed) becomes InvalidDetails for the document as a whole."""

    @functools.wraps(parse)
    def parse_or_refuse(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return parse(*args, **kwargs)
        except InvalidDetails:
            raise
        except Exception as exc:
            raise InvalidDetails(None, f"cannot be used: {_reason(exc)}") from exc

    return parse_or_refuse


def positive_int_setting(env: Mapping[str, str], key: str, default: int) -> int:
    """A limit from the environment: `env[key]` if set (a positive integer, else ValueError),
    otherwise `default`."""
    raw = env.get(key, "").strip() or str(default)
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"{key} must be a positive integer, got {raw!r}")
    return int(raw)


def max_details_bytes(env: Mapping[str, str] | None = None) -> int:
    """`AKRI_DISCOVERY_DETAILS_MAX_BYTES` (default 64 KiB), for handlers' `from_env`."""
    env = os.environ if env is None else env
    return positive_int_setting(env, MAX_DETAILS_BYTES_ENV, MAX_DETAILS_BYTES)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError | IndexError) or not text:
        text = f"{type(exc).__name__} {text}".strip()
    return text[:200]


def _check_depth(text: str, max_depth: int) -> None:
    """Refuse documents nested deeper than `max_depth`, from parser events alone (PyYAML's
    parser is iterative; its composer, which runs next, recurses per level)."""
    import yaml  # on first use: an agent with no Configuration parses no YAML (0.7 MB of RSS)

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise InvalidDetails(None, f"nests deeper than {max_depth} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load_mapping(text: str, *, max_bytes: int = MAX_DETAILS_BYTES) -> dict[str, Any]:
    """Parse discoveryDetails (YAML; JSON is a subset) into a mapping. Empty text is `{}`.
    Raises InvalidDetails for a document over `max_bytes` (UTF-8) or MAX_DETAILS_DEPTH levels
    deep, for bad YAML, and for values YAML cannot construct (`!!int x`, `2020-02-30`)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise InvalidDetails(None, f"is {size} bytes long; the limit is {max_bytes}")
    import yaml  # on first use, as in _check_depth

    try:
        if not text.strip():
            doc: Any = {}
        else:
            _check_depth(text, MAX_DETAILS_DEPTH)
            doc = yaml.safe_load(text)
    except InvalidDetails:
        raise
    except yaml.YAMLError as exc:
        # The first line carries the position; the rest is a code excerpt.
        raise InvalidDetails(None, f"not valid YAML: {str(exc).splitlines()[0]}") from exc
    except Exception as exc:
        # A tag whose constructor fails (`!!bool x`, `!!int ""`, `!!timestamp x`), an
        # impossible date, an integer past Python's digit limit: PyYAML lets these through
        # as whatever the constructor raised.
        problem = f"a value does not fit its type: {_reason(exc)}"
        raise InvalidDetails(None, f"not valid YAML: {problem}") from exc
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
