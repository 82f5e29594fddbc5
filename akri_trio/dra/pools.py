"""One round of a pool's publisher, the same decision on both sides: the agent's node pools and
the controller's shared pools.

Each side says what a pool should hold now (`Wanted`: its devices, where, with which labels;
None when nothing should be there) and keeps a `PoolMemory` of the pool between rounds;
`plan_round` puts the offline grace (`offline.hold_vanished`: vanished devices stay, tainted
where the API server keeps device taints)
and the slices (`slices.plan_pool`: what to write so the API holds exactly that pool) together.
With nothing wanted, the devices still in their grace stay where the pool was last wanted (the
memory says where), and the pool goes once the last of them leaves.

The memory is the publisher's run's alone: a restarted publisher, finding a pool with nothing
wanted, deletes it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from akri_trio.address import ObjectKey
from akri_trio.dra.offline import OFFLINE_GRACE_S, Vanished, hold_vanished
from akri_trio.dra.slices import PoolDevices, PoolPlan, plan_pool, pool_name_of
from akri_trio.model.resources import JSON


@attrs.frozen
class Wanted:
    """What a pool should hold now: `devices` (and per Instance the properties left out of
    their attributes), published at `placement` (`slices.node_placement` or
    `slices.shared_placement`) with `labels` (`slices.pool_labels`)."""

    devices: PoolDevices
    placement: Mapping[str, Any]
    labels: Mapping[str, str]


@attrs.frozen
class PoolMemory:
    """A publisher's memory of one pool between rounds: the devices last wanted (untainted),
    the vanished ones in their offline grace, and where and with which labels the pool was last
    wanted."""

    wanted: tuple[JSON, ...]
    vanished: Mapping[str, Vanished]
    placement: Mapping[str, Any]
    labels: Mapping[str, str]


@attrs.frozen
class PoolRound:
    """`plan`: the writes to make; `memory`: what to keep for the next round (None: forget the
    pool); `next_deadline`: when a vanished device's grace ends (None: none pending), a change
    nothing else reports, so the publisher looks again then."""

    plan: PoolPlan
    memory: PoolMemory | None
    next_deadline: float | None


def plan_round(
    pool: str,
    wanted: Wanted | None,
    existing: Sequence[Mapping[str, Any]],
    memory: PoolMemory | None,
    *,
    now: float,
    written: int = 0,
    grace: float = OFFLINE_GRACE_S,
    may_return: Callable[[JSON], bool] = lambda device: True,
    taints: bool = True,
    stored_as: Mapping[str, str] | None = None,
) -> PoolRound:
    """The round of `pool` at `now`: `existing` every slice of it the API holds, `memory` the
    last round's, `written` the highest generation this publisher has written for it (see
    `plan_pool`), `may_return` whether a vanished device may come back (no: no grace), `taints`
    whether the API server keeps device taints (no: vanished devices are held untainted),
    `stored_as` what the server made of slices written before (see `plan_pool`)."""
    devices = () if wanted is None else wanted.devices.devices
    step = hold_vanished(
        devices,
        () if memory is None else memory.wanted,
        {} if memory is None else memory.vanished,
        now=now,
        grace=grace,
        may_return=may_return,
        taint=taints,
    )
    where = wanted if wanted is not None else memory
    placement = {} if where is None else where.placement
    labels = {} if where is None else where.labels
    plan = plan_pool(
        pool,
        step.devices,
        placement,
        existing,
        labels=labels,
        written=written,
        stored_as=stored_as,
    )
    keep = None
    if devices or step.vanished:
        keep = PoolMemory(tuple(devices), dict(step.vanished), placement, labels)
    return PoolRound(plan, keep, step.next_deadline)


def pool_key(obj: Mapping[str, Any]) -> ObjectKey | None:
    """A ResourceSlice's pool, as the (cluster-scoped) key its publisher's reconcile runs
    under."""
    name = pool_name_of(obj)
    return ObjectKey("", name) if name else None
