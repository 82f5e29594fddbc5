"""Pools of devices as ResourceSlices: what to write so the API holds exactly one pool.

A pool is published as one or more slices (at most 128 devices each, 64 when any is tainted),
all at the pool's current `generation` with `resourceSliceCount` = their number; consumers use
only the highest generation they see. `plan_pool` compares what the API holds with what should
be there and answers with the slices to write (all at a bumped generation when anything
changed, none when nothing did) and the slices to delete. The writer applies first and deletes
after, so at every moment the highest generation is a complete pool.

"The same" is judged on what the server keeps: an API server drops the fields of features it
does not serve (device taints on 1.34/1.35, consumable capacity before 1.36, and whatever a
later one adds), and a slice compared as written would never equal the stored one, so it would
be written again at every round. The writer tells `plan_pool` what the server made of each
slice it wrote (`stored_as`: the `essence` of the body -> the `essence` of the server's answer).

Two kinds of pool:
- a node pool (`spec.nodeName`): the non-shared Instances one agent serves on its node;
- a shared pool (`spec.nodeSelector` on the hostname labels of exactly `Instance.spec.nodes`):
  one per shared Instance, written by the controller alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from akri_trio.dra.attributes import Omitted
from akri_trio.dra.devices import API_VERSION, DeviceRef, instance_devices
from akri_trio.dra.names import DRIVER, LABEL_NAMESPACE, slice_name
from akri_trio.model.resources import JSON, Instance

MAX_DEVICES_PER_SLICE: Final = 128
MAX_TAINTED_DEVICES_PER_SLICE: Final = 64  # a slice with any device taint holds at most 64
LABEL_POOL_KIND: Final = "akri.sh/pool-kind"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"


@attrs.frozen
class PoolDevices:
    """The devices of a pool, which Instance each stands for, and per Instance the properties
    left out of its attributes."""

    devices: tuple[JSON, ...]
    refs: Mapping[str, DeviceRef]
    omitted: Mapping[str, tuple[Omitted, ...]]


def pool_devices(instances: Iterable[Instance], *, consumable: bool) -> PoolDevices:
    """All devices of `instances`, ordered by device name. Two devices with one name (a hash
    collision of overlong names) keep the first Instance's, by name."""
    devices: dict[str, JSON] = {}
    refs: dict[str, DeviceRef] = {}
    omitted: dict[str, tuple[Omitted, ...]] = {}
    for inst in sorted(instances, key=lambda i: (i.metadata.namespace, i.metadata.name)):
        built = instance_devices(inst, consumable=consumable)
        if built.attributes.omitted:
            omitted[inst.metadata.name] = built.attributes.omitted
        for device, ref in zip(built.devices, built.refs, strict=True):
            devices.setdefault(device["name"], device)
            refs.setdefault(device["name"], ref)
    return PoolDevices(tuple(devices[n] for n in sorted(devices)), refs, omitted)


def node_placement(node: str) -> JSON:
    return {"nodeName": node}


def shared_placement(hostnames: Iterable[str]) -> JSON:
    """Exactly the nodes with these `kubernetes.io/hostname` labels, as the one node selector
    term a slice may have.

    By label, not by name: the API server refuses a `matchFields` on `metadata.name` with more
    than one value, and a slice may have only one term. The caller passes each node's label
    (normally its name; read it from the Node where it may differ).
    """
    term = {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(set(hostnames))}
    return {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [term]}]}}


def pool_labels(kind: str, namespace: str) -> dict[str, str]:
    """`kind` is "node" or "shared"."""
    return {LABEL_POOL_KIND: kind, LABEL_NAMESPACE: namespace}


@attrs.frozen
class PoolPlan:
    """`apply`: whole ResourceSlice bodies to create or replace by name; `delete`: names of
    slices of the pool to remove after that."""

    generation: int
    apply: tuple[JSON, ...]
    delete: tuple[str, ...]

    @property
    def unchanged(self) -> bool:
        return not self.apply and not self.delete


def pool_name_of(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name", ""))


def generation_of(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation", 0))


def _chunks(devices: Sequence[JSON]) -> list[list[JSON]]:
    size = (
        MAX_TAINTED_DEVICES_PER_SLICE
        if any(d.get("taints") for d in devices)
        else MAX_DEVICES_PER_SLICE
    )
    return [list(devices[i : i + size]) for i in range(0, len(devices), size)]


def _without_time_added(devices: Any) -> Any:
    """Devices with their taints' `timeAdded` left out: the API server sets it."""
    if not isinstance(devices, list):
        return devices
    out = []
    for device in devices:
        if isinstance(device, Mapping) and device.get("taints"):
            taints = [{k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]]
            device = {**device, "taints": taints}
        out.append(device)
    return out


def _slice(
    pool: str,
    index: int,
    count: int,
    generation: int,
    placement: Mapping[str, Any],
    devices: list[JSON],
    labels: Mapping[str, str],
    owner_references: Sequence[JSON],
) -> JSON:
    metadata: JSON = {"name": slice_name(pool, index), "labels": dict(labels)}
    if owner_references:
        metadata["ownerReferences"] = [dict(o) for o in owner_references]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            **placement,
            "devices": devices,
        },
    }


def _pruned(value: Any) -> Any:
    """Empty maps and lists dropped: the API server omits them when it stores an object."""
    if isinstance(value, Mapping):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def essence(obj: Mapping[str, Any]) -> str:
    """What makes two slices of one generation the same slice: everything we write but the
    generation (the API server adds only metadata we do not write and a taint's `timeAdded`,
    and omits empty fields)."""
    meta = obj.get("metadata") or {}
    spec = dict(obj.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    spec["devices"] = _without_time_added(spec.get("devices"))
    kept = {
        "name": meta.get("name"),
        "labels": meta.get("labels") or {},
        "ownerReferences": meta.get("ownerReferences") or [],
        "spec": spec,
    }
    return json.dumps(_pruned(kept), sort_keys=True)


def plan_pool(
    pool: str,
    devices: Sequence[JSON],
    placement: Mapping[str, Any],
    existing: Sequence[Mapping[str, Any]],
    *,
    labels: Mapping[str, str] | None = None,
    owner_references: Sequence[JSON] = (),
    written: int = 0,
    stored_as: Mapping[str, str] | None = None,
) -> PoolPlan:
    """The writes that make the API hold `pool` with exactly `devices` at `placement`.

    `existing`: every slice of this pool the API holds now (any generation). No devices: every
    existing slice goes. Otherwise, when the slices of the highest generation already are the
    wanted ones and no other slice exists, nothing is written; else all wanted slices are
    written at a generation above both that one and `written` (the highest generation this
    writer has used for the pool, so a pool deleted and published again never repeats one that
    a consumer may still hold) and every other existing slice is deleted. `stored_as`: for
    slices written before, the `essence` the server stored for the `essence` written; a wanted
    slice found there is compared as the server stored it.
    """
    labels = labels or {}
    ordered = sorted(devices, key=lambda d: str(d["name"]))
    chunks = _chunks(ordered)
    names_now = [str((s.get("metadata") or {}).get("name")) for s in existing]
    current = max((generation_of(s) for s in existing), default=0)
    if not chunks:
        return PoolPlan(current, (), tuple(sorted(names_now)))
    wanted = [
        _slice(pool, i, len(chunks), current, placement, c, labels, owner_references)
        for i, c in enumerate(chunks)
    ]
    kept = stored_as or {}
    as_stored = sorted(kept.get(e, e) for e in map(essence, wanted))
    if sorted(essence(s) for s in existing) == as_stored and all(
        generation_of(s) == current for s in existing
    ):
        return PoolPlan(current, (), ())
    generation = max(current, written) + 1
    for body in wanted:
        body["spec"]["pool"]["generation"] = generation
    keep = {body["metadata"]["name"] for body in wanted}
    return PoolPlan(generation, tuple(wanted), tuple(sorted(n for n in names_now if n not in keep)))
