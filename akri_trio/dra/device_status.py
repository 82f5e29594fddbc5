"""A claim's `status.devices` for driver `akri.sh`: what brokers report, per allocated device.

In DRA mode a broker's brokerInfo files (see docs/brokerinfo.md) reach its own ResourceClaim
as well as its Instance: each allocated device of ours gets the entry
`{driver, pool, device[, shareID], data: {"brokerInfo": {"<node>/<file name>": text}}}`, the
keys the Instance's `spec.brokerInfo` uses. A claim of a shared device may be prepared on
several nodes (Pods sharing one claim), and `data` is one atomic value to the API server, so
a node's write keeps the keys other nodes wrote there and replaces only its own (`plan`).

Limits: the API server takes at most 10 KiB of JSON in one device's `data`
(AllocatedDeviceStatusDataMaxLength); a node's files beyond it are left out whole, in key
order after the other nodes' entries, and reported, as every other brokerInfo limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from akri_trio.dra.claims import our_results
from akri_trio.dra.names import DRIVER
from akri_trio.model import naming

DATA_MAX_BYTES: Final = 10 * 1024
DATA_KEY: Final = "brokerInfo"


@attrs.frozen(order=True)
class DeviceKey:
    """An entry's key in `status.devices` (its list-map keys, of our driver)."""

    pool: str
    device: str
    share_id: str | None = None


def stored_json_size(value: object) -> int:
    """An upper bound on the size of `value` as the API server stores it (Go's encoding/json:
    UTF-8 as is, `<`, `>` and `&` as six-byte escapes), from Python's ASCII-only JSON, where
    each non-ASCII character takes six or twelve bytes, at least its UTF-8 length."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return len(text) + 5 * sum(text.count(c) for c in "<>&")


def fit(
    entries: Mapping[str, str],
    others: Mapping[str, str],
    most: int = DATA_MAX_BYTES,
) -> tuple[dict[str, str], list[str]]:
    """Which of one node's `entries` fit in one device's `data` beside `others` (the other
    nodes' entries there), in key order, and what did not (file names with the reason)."""
    kept: dict[str, str] = {}
    problems: list[str] = []
    for key, text in sorted(entries.items()):
        if stored_json_size({DATA_KEY: {**others, **kept, key: text}}) > most:
            name = key.partition(naming.BROKER_INFO_SEPARATOR)[2]
            problems.append(f"{name!r}: over {most} bytes of claim status data")
        else:
            kept[key] = text
    return kept, problems


def allocated(claim: Mapping[str, Any]) -> set[DeviceKey]:
    """The claim's allocated devices of our driver (none when it is not allocated)."""
    if not (claim.get("status") or {}).get("allocation"):
        return set()
    return {DeviceKey(r.pool, r.device, r.share_id) for r in our_results(claim)}


def reported(claim: Mapping[str, Any]) -> dict[DeviceKey, dict[str, str]]:
    """What `status.devices` holds for our driver: each entry's brokerInfo map (empty when
    its data has none or is not the shape we write)."""
    out: dict[DeviceKey, dict[str, str]] = {}
    for entry in (claim.get("status") or {}).get("devices") or []:
        if entry.get("driver") != DRIVER:
            continue
        key = DeviceKey(
            str(entry.get("pool", "")),
            str(entry.get("device", "")),
            str(entry["shareID"]) if entry.get("shareID") else None,
        )
        info = (entry.get("data") or {}).get(DATA_KEY)
        out[key] = (
            {str(k): v for k, v in info.items() if isinstance(v, str)}
            if isinstance(info, dict)
            else {}
        )
    return out


@attrs.frozen
class StatusPlan:
    devices: tuple[dict[str, Any], ...]  # the whole list of our entries to apply
    unchanged: bool  # what the claim holds already
    problems: Mapping[DeviceKey, tuple[str, ...]]  # per device: this node's files left out


def plan(
    node: str,
    claim: Mapping[str, Any],
    mine: Mapping[DeviceKey, Mapping[str, str]],
    most: int = DATA_MAX_BYTES,
) -> StatusPlan:
    """Our `status.devices` entries of `claim` once this node's part of each allocated device
    is `mine` (`<node>/<file>` -> text; a device left out: none). Other nodes' keys stay; an
    entry left with no key at all is left out (removed by the apply), and so is a device that
    is not allocated (the API server refuses an entry for one)."""
    current = reported(claim)
    now = allocated(claim)
    entries: dict[DeviceKey, dict[str, str]] = {}
    problems: dict[DeviceKey, tuple[str, ...]] = {}
    for key in sorted(now):
        held = current.get(key, {})
        others = {k: v for k, v in held.items() if k not in naming.node_broker_info(held, node)}
        kept, over = fit(mine.get(key, {}), others, most)
        if over:
            problems[key] = tuple(over)
        if merged := {**others, **kept}:
            entries[key] = merged
    unchanged = entries == {k: v for k, v in current.items() if v and k in now}
    return StatusPlan(tuple(_entry(k, v) for k, v in entries.items()), unchanged, problems)


def _entry(key: DeviceKey, info: Mapping[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": DRIVER, "pool": key.pool, "device": key.device}
    if key.share_id is not None:
        entry["shareID"] = key.share_id
    entry["data"] = {DATA_KEY: dict(sorted(info.items()))}
    return entry


def apply_body(claim: Mapping[str, Any], devices: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A server-side apply of our `status.devices` entries, on the version read: a write that
    raced another node's is refused (409) instead of dropping what that node wrote."""
    meta = claim.get("metadata") or {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "status": {"devices": list(devices)},
    }
