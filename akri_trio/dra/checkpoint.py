"""What the kubelet plugin has prepared, as it is kept on disk between agent runs.

The kubelet asks again to prepare claims it already prepared (after its own restart, or when
an answer was lost), possibly after the agent restarted; the answer must be the same, without
the API server if need be. The record is small JSON with a version, read strictly: a file we
cannot read raises BadCheckpoint, for the caller to report, never silently an empty record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

VERSION: Final = 1


class BadCheckpoint(ValueError):
    pass


@attrs.frozen
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answered it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    slots: int = 1  # what it consumed of a consumable device (a checkpoint without it: 1)


@attrs.frozen
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec_file: str  # the CDI spec's file name in the CDI directory
    # Made for a Pod's `akri.sh/<instance>` extended resource (`claims.counted_on_node`); a
    # checkpoint without it: False.
    counted: bool = False


def encode(claims: Mapping[str, PreparedClaim]) -> str:
    """`claims`: claim uid -> what was prepared for it."""
    return json.dumps(
        {"version": VERSION, "claims": {uid: attrs.asdict(c) for uid, c in sorted(claims.items())}},
        indent=1,
        sort_keys=True,
    )


def _device(data: Mapping[str, Any]) -> PreparedDevice:
    return PreparedDevice(
        tuple(str(r) for r in data["requests"]),
        str(data["pool"]),
        str(data["device"]),
        tuple(str(i) for i in data["cdi_ids"]),
        None if data.get("share_id") is None else str(data["share_id"]),
        int(data.get("slots", 1)),
    )


def decode(text: str) -> dict[str, PreparedClaim]:
    try:
        data = json.loads(text)
        if data.get("version") != VERSION:
            raise BadCheckpoint(f"checkpoint version {data.get('version')!r}, expected {VERSION}")
        return {
            str(uid): PreparedClaim(
                str(c["namespace"]),
                str(c["name"]),
                tuple(_device(d) for d in c["devices"]),
                str(c["spec_file"]),
                c.get("counted") is True,
            )
            for uid, c in data["claims"].items()
        }
    except BadCheckpoint:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadCheckpoint(f"unreadable checkpoint: {exc!r}") from exc
