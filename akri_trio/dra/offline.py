"""The offline grace of DRA devices: a device that vanishes stays published, tainted, for a while.

Device-plugin mode gives a handler that stops answering five minutes before its devices count
as gone (`OFFLINE_GRACE_S`, upstream's grace). In DRA mode a device that leaves its pool at
once would be a device no claim can name any more, so a flicker would cost every Pod on it.
Instead, a device that was published and is no longer wanted is kept in its pool with the
taint `akri.sh/offline` (effect NoSchedule: the scheduler allocates it to no new claim, and
Pods already running keep it), and leaves the pool when the grace ends; one that comes back
within the grace is published as it is wanted again, untainted, under the same name, so the
claims allocated to it stay valid. A device that cannot come back (its Configuration was
deleted) gets no grace: it leaves at once. Where the API server keeps no device taints
(1.34/1.35 without DRADeviceTaints, which drop the field) the device is held untainted: a
taint the server drops would be a write that never takes, so it stays allocatable in its grace.

Pure: the caller keeps the `Vanished` map between rounds and passes the clock's time in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

import attrs

from akri_trio.dra.attributes import CONFIGURATION, NAMESPACE, qualified
from akri_trio.model.resources import JSON

OFFLINE_TAINT_KEY: Final = "akri.sh/offline"
OFFLINE_TAINT: Final = {"key": OFFLINE_TAINT_KEY, "effect": "NoSchedule"}
OFFLINE_GRACE_S: Final = 300.0  # the discovery registry's grace for an Offline handler


@attrs.frozen
class Vanished:
    """A device as last published untainted, and when it stopped being wanted."""

    device: JSON
    since: float


@attrs.frozen
class GraceStep:
    """What to publish now, what to remember, and when to look again (None: nothing pending)."""

    devices: tuple[JSON, ...]
    vanished: Mapping[str, Vanished]
    next_deadline: float | None


def tainted(device: JSON) -> JSON:
    """`device` with the offline taint added to its own taints."""
    taints = [t for t in device.get("taints") or [] if t.get("key") != OFFLINE_TAINT_KEY]
    return {**device, "taints": [*taints, dict(OFFLINE_TAINT)]}


def hold_vanished(
    wanted: Sequence[JSON],
    previous: Sequence[JSON],
    vanished: Mapping[str, Vanished],
    *,
    now: float,
    grace: float = OFFLINE_GRACE_S,
    may_return: Callable[[JSON], bool] = lambda device: True,
    taint: bool = True,
) -> GraceStep:
    """One round: `wanted` the devices the pool should hold now, `previous` those the last
    round wanted (untainted), `vanished` the last round's memory.

    A device of `previous` missing from `wanted` vanishes now; a vanished device wanted again
    is forgotten (published as wanted); one vanished for `grace` or more is forgotten too (it
    leaves the pool), and so is one for which `may_return` says no. Every device still vanished
    is published beside `wanted`: tainted, or as it was last wanted where `taint` is False (the
    API server keeps no device taints).
    """
    names = {str(d["name"]) for d in wanted}
    held = {name: v for name, v in vanished.items() if name not in names}
    for device in previous:
        name = str(device["name"])
        if name not in names and name not in held:
            held[name] = Vanished(device, now)
    held = {name: v for name, v in held.items() if now - v.since < grace and may_return(v.device)}
    devices = [*wanted, *(tainted(v.device) if taint else v.device for v in held.values())]
    devices.sort(key=lambda d: str(d["name"]))
    deadline = min((v.since + grace for v in held.values()), default=None)
    return GraceStep(tuple(devices), held, deadline)


def configuration_of(device: JSON) -> tuple[str, str] | None:
    """The (namespace, Configuration) a device's identity attributes name, if they do."""
    attrs_ = device.get("attributes") or {}
    ns = (attrs_.get(qualified(NAMESPACE)) or {}).get("string")
    name = (attrs_.get(qualified(CONFIGURATION)) or {}).get("string")
    return (str(ns), str(name)) if ns and name else None
