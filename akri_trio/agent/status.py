"""This node's entry in a Configuration's status, as a pure function of what it knows.

Upstream leaves a user with nothing but agent logs when a Configuration does not work. Here each
node's agent writes one entry of `status.nodes` (a list-map keyed by node, so every agent owns
its own entry under server-side apply): the handlers it uses and their state, how many Instances
it serves, and conditions that say what is wrong in words a user can act on — `kubectl describe
akric` shows them. Conditions keep their `lastTransitionTime` while their status is unchanged, so
an unchanged situation produces an identical entry and therefore no write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from akri_trio.discovery.registry import Active, HandlerStatus, Offline, Waiting
from akri_trio.model.resources import JSON

# Lines a condition message (or `problems`) lists before "and N more", each cut to
# MAX_LINE_CHARS: a status stays small whatever a handler sends (at most ~10 KB a message).
MAX_LISTED: Final = 10
MAX_LINE_CHARS: Final = 1000


def node_entry_of(status: Mapping[str, Any] | None, node: str) -> JSON | None:
    """`node`'s entry in a Configuration's `status.nodes` (None: it has none)."""
    entries = (status or {}).get("nodes") or []
    return next((e for e in entries if isinstance(e, dict) and e.get("node") == node), None)


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "..."


def bounded_lines(lines: Sequence[str]) -> list[str]:
    """The first MAX_LISTED of `lines`, each cut to MAX_LINE_CHARS, then "and N more"."""
    more = len(lines) - MAX_LISTED
    return [_cut(line) for line in lines[:MAX_LISTED]] + ([f"and {more} more"] if more > 0 else [])


def _listed(lines: Sequence[str]) -> str:
    return "; ".join(bounded_lines(lines))


def _handler_state(status: HandlerStatus, to_wall: Callable[[float], str]) -> JSON:
    match status:
        case Waiting():
            return {"state": "Waiting"}
        case Active():
            return {"state": "Active"}
        case Offline(since):
            return {"state": "Offline", "offlineSince": to_wall(since)}
    raise AssertionError(status)


def _condition(
    kind: str, ok: bool, reason: str, message: str, previous: Mapping[str, JSON], now: str
) -> JSON:
    status = "True" if ok else "False"
    before = previous.get(kind)
    since = before["lastTransitionTime"] if before and before.get("status") == status else now
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }


def node_entry(
    *,
    node: str,
    handler: str,
    handlers: Mapping[str, HandlerStatus],
    invalid_details: Sequence[str],
    unsolvable: str | None,
    other_problems: Sequence[str],
    instances: int,
    previous: Mapping[str, Any] | None,
    now: str,
    to_wall: Callable[[float], str],
    unsolvable_reason: str = "UnsolvableProperty",
    refused_devices: Sequence[str] = (),
    refused: tuple[str, str] | None = None,
    broker_info_problems: Sequence[str] | None = None,
    handler_problems: Sequence[str] = (),
) -> JSON:
    """The status entry for `node`; `previous` is its current entry (or None).

    `refused_devices`: devices dropped or cut (DevicesAccepted). `refused`: (reason, message)
    when this node serves nothing of the Configuration at all (Accepted), e.g. its name is
    another namespace's on this node's kubelet, or its capacity is over the agent's maximum.
    `broker_info_problems`: files brokerInfo skipped (None: brokerInfo is off, no condition).
    `handler_problems`: what the handlers say they cannot discover (DiscoveryHealthy).
    """
    prev_conditions = {c["type"]: c for c in (previous or {}).get("conditions") or []}
    if unsolvable is not None:
        props = _condition(
            "PropertiesResolved", False, unsolvable_reason, _cut(unsolvable), prev_conditions, now
        )
    else:
        props = _condition("PropertiesResolved", True, "Resolved", "", prev_conditions, now)
    if handlers:
        available = _condition(
            "HandlerAvailable",
            True,
            "Registered",
            f"{len(handlers)} endpoint(s) registered for {handler!r}",
            prev_conditions,
            now,
        )
    else:
        available = _condition(
            "HandlerAvailable",
            False,
            "NoHandler",
            f"no discovery handler named {handler!r} is registered with the agent on {node}",
            prev_conditions,
            now,
        )
    if invalid_details:
        details = _condition(
            "DiscoveryDetailsValid",
            False,
            "InvalidDiscoveryDetails",
            _listed(invalid_details),
            prev_conditions,
            now,
        )
    else:
        details = _condition("DiscoveryDetailsValid", True, "Valid", "", prev_conditions, now)
    if refused_devices:
        devices = _condition(
            "DevicesAccepted",
            False,
            "DevicesRefused",
            _listed(refused_devices),
            prev_conditions,
            now,
        )
    else:
        devices = _condition("DevicesAccepted", True, "Accepted", "", prev_conditions, now)
    if refused is not None:
        accepted = _condition("Accepted", False, refused[0], _cut(refused[1]), prev_conditions, now)
    else:
        accepted = _condition("Accepted", True, "Accepted", "", prev_conditions, now)
    healthy = _condition(
        "DiscoveryHealthy",
        not handler_problems,
        "HandlerProblems" if handler_problems else "Healthy",
        _listed(handler_problems),
        prev_conditions,
        now,
    )
    conditions = [accepted, available, details, props, devices, healthy]
    if broker_info_problems is not None:
        conditions.append(
            _condition(
                "BrokerInfoValid",
                not broker_info_problems,
                "FileSkipped" if broker_info_problems else "Valid",
                _listed(broker_info_problems),
                prev_conditions,
                now,
            )
        )
    return {
        "node": node,
        "instances": instances,
        "handlers": [
            {"endpoint": endpoint, **_handler_state(status, to_wall)}
            for endpoint, status in sorted(handlers.items())
        ],
        "problems": bounded_lines(other_problems),
        "conditions": conditions,
    }
