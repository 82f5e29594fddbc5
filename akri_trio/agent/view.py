"""What this node's agent knows right now: the cluster's Instances and its own devices.

Two sources feed it — the Instance watch (what the cluster says) and this node's discovery (which
devices it can reach) — and every device plugin reads from it. The Instances are the agent's one
typed cache of them (`store`, a `Store[Instance]`: each version decoded once, on the way in),
with a small overlay in front: what this agent last wrote (claims, joins, departures), folded in
from the API server's answer at once, so the kubelet hears about a claim without waiting for the
watch. An overlay entry ends when the watch delivers the version written (or the written
incarnation's deletion, or relists); resourceVersions are compared only for equality
(kube.store.Overlay). Version counters tell readers "something you read changed": per key (an
Instance, a Configuration) for the plugins' ListAndWatch streams, which recompute their answer
and send it only when it differs, and `membership` for the plugin manager, which ticks only when
the set of plugins to run may change — not on the claims that make up most of the traffic.

While a reconcile's batch of Instance writes is in flight (`writing`) the plugin manager holds
back the plugins it would start (`batches_writing`; the end of the last batch ticks
`membership`) but stops plugins (within its HELD_LOOK_S): on a 2-core board the plugins'
sockets, registrations and the kubelet's dial-backs took half the agent's CPU while a discovery
of 200 devices was being written, and so doubled the time until the cluster saw its Instances
(bench/RESULTS.md, 2026-11-26 afternoon). The Instances are what the controller and the other
nodes wait on; the batch's plugins then start in one pass of the manager instead of one pass
per answer, and the kubelet sees the last of them no later than before.

An Instance's `capacity` is clamped to the agent's `--max-capacity` on the way in: the Instance
CRD bounds it as the Configuration's, but anyone who may write Instances (or a CRD installed
without the bound) could otherwise make every plugin build a slot list millions long. The clamp
is logged once per Instance and capacity.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import attrs

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.slots import poisoned_keys
from akri_trio.kube.store import Change, Overlay, Store, Written, drop_managed_fields
from akri_trio.model.convert import structure
from akri_trio.model.device import Device
from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.model.resources import JSON, Instance
from akri_trio.runtime import Changed

log = logging.getLogger(__name__)

# What was reported of an Instance (deviceUsage keys that are "not a slot", a capacity over the
# maximum), remembered so each is logged once; forgotten wholesale past this many, so a flood
# of junk keys cannot grow the agent's memory.
MAX_REPORTED_KEYS: Final = 10_000


def with_capacity_at_most(inst: Instance, most: int) -> Instance:
    """`inst`, its capacity cut to `most` (the agent's --max-capacity) when over it."""
    if inst.spec.capacity <= most:
        return inst
    return attrs.evolve(inst, spec=attrs.evolve(inst.spec, capacity=most))


def config_key(inst: Instance) -> ObjectKey:
    """The key of the Configuration an Instance belongs to."""
    return ObjectKey(inst.metadata.namespace, inst.spec.configuration_name)


def removed(inst: Instance) -> bool:
    """Being deleted with no finalizer left: the API server removes such an Instance at once
    (e.g. the answer to our own write that released the last finalizer), so it is gone."""
    return inst.metadata.deletion_timestamp is not None and not inst.metadata.finalizers


def _membership(inst: Instance) -> tuple[object, ...]:
    """What of an Instance decides which plugins run (see PluginManager)."""
    return inst.spec.nodes, inst.metadata.deletion_timestamp, inst.spec.configuration_name


class InstanceDecoder:
    """The agent's Instance store's decoder: the model, its capacity clamped to `max_capacity`,
    and what is wrong with it (a capacity over the maximum, deviceUsage keys that are not
    slots) logged once per Instance and value."""

    def __init__(self, max_capacity: int = MAX_CAPACITY) -> None:
        self.max_capacity = max_capacity
        self._reported: set[tuple[ObjectKey, str, str]] = set()  # (key, kind, what)

    def __call__(self, obj: JSON) -> Instance:
        inst = structure(obj, Instance)
        self._report_poisoned(inst)
        return self._clamped(inst)

    def _clamped(self, inst: Instance) -> Instance:
        """`inst` with its capacity cut to `max_capacity` (logged once per capacity)."""
        capacity = inst.spec.capacity
        if capacity <= self.max_capacity:
            return inst
        if self._first_report(inst.metadata.key, "capacity", str(capacity)):
            log.warning(
                "Instance %s: capacity %d is over this agent's maximum %d (--max-capacity); "
                "serving %d slots",
                inst.metadata.key,
                capacity,
                self.max_capacity,
                self.max_capacity,
            )
        return with_capacity_at_most(inst, self.max_capacity)

    def _first_report(self, key: ObjectKey, kind: str, what: str) -> bool:
        """True the first time `what` of `kind` is reported of `key` (the memory of reports
        is forgotten wholesale past MAX_REPORTED_KEYS)."""
        if (key, kind, what) in self._reported:
            return False
        if len(self._reported) >= MAX_REPORTED_KEYS:
            self._reported.clear()
        self._reported.add((key, kind, what))
        return True

    def _report_poisoned(self, inst: Instance) -> None:
        key = inst.metadata.key
        for usage_key in poisoned_keys(key.name, inst.spec.device_usage):
            if not self._first_report(key, "deviceUsage", usage_key):
                continue
            shown = (
                usage_key
                if len(usage_key) <= 80
                else f"{usage_key[:80]}... ({len(usage_key)} chars)"
            )
            log.warning("Instance %s: deviceUsage key %r is not a slot; ignored", key, shown)


def instance_store(max_capacity: int = MAX_CAPACITY) -> Store[Instance]:
    """The agent's cache of Instances (what `reflect` keeps and the NodeView reads)."""
    return Store(transform=drop_managed_fields, decode=InstanceDecoder(max_capacity))


class NodeView:
    """`membership` ticks when an Instance appears, goes, or changes its nodes, deletion or
    Configuration, when a device appears or goes, and when the last batch of this node's
    Instance writes ends; `changes_of(key)` on every change that concerns `key`: an Instance's
    key or a Configuration's key (ticked when any of its Instances or its devices change). A
    plugin waits on its own key, so a write to one Instance wakes the plugins of that Instance
    and its Configuration, not every plugin on the node. The watch's changes reach it through
    `watched` (the agent's Instance mapper calls it)."""

    def __init__(self, node: str, *, max_capacity: int = MAX_CAPACITY) -> None:
        self.node = node
        self.max_capacity = max_capacity
        self.store = instance_store(max_capacity)
        self.written: Overlay[Instance] = Overlay(self.store)
        self.membership = Changed()
        self._writing = 0  # batches of Instance writes in flight (`writing`)
        self._keyed: dict[ObjectKey, Changed] = {}
        self._devices: dict[ObjectKey, Device] = {}  # instance key -> device this node discovered
        self._devices_by_config: dict[ObjectKey, dict[ObjectKey, Device]] = {}

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Around a batch of this node's Instance writes (module docstring). The end of the
        last batch in flight ticks `membership`: the plugins held back may start now."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
            if not self._writing:
                self.membership.bump()

    @property
    def batches_writing(self) -> int:
        """How many batches of Instance writes are in flight."""
        return self._writing

    def changes_of(self, key: ObjectKey) -> Changed:
        changes = self._keyed.get(key)
        if changes is None:
            changes = self._keyed[key] = Changed()
        return changes

    def forget(self, key: ObjectKey) -> None:
        """Drop the keyed counter of a key nobody waits on any more (a stopped plugin)."""
        self._keyed.pop(key, None)

    def touch(self, *keys: ObjectKey) -> None:
        """Tell the waiters on `keys` to look again (something they read besides the view
        changed, e.g. which Instances a configuration plugin serves)."""
        self._notify(*keys, membership=False)

    def _notify(self, *keys: ObjectKey, membership: bool = True) -> None:
        if membership:
            self.membership.bump()
        for key in keys:
            changes = self._keyed.get(key)
            if changes is not None:
                changes.bump()

    def _changed(self, key: ObjectKey, before: Instance | None, after: Instance | None) -> None:
        if before == after:
            return
        configs = {config_key(i) for i in (before, after) if i is not None}
        membership = before is None or after is None or _membership(before) != _membership(after)
        self._notify(key, *configs, membership=membership)

    # --- Instances (from the watch, and from our own writes) ---------------------------------

    def instance(self, key: ObjectKey) -> Instance | None:
        written = self.written.get(key)
        inst = self.store.get(key) if written is None else written.value
        return None if inst is None or removed(inst) else inst

    def instances(self) -> list[Instance]:
        if not self.written:
            return [inst for inst in self.store.values() if not removed(inst)]
        shown = self.store.snapshot()
        for key, written in self.written.items():
            if written.value is None:
                shown.pop(key, None)
            else:
                shown[key] = written.value
        return [inst for inst in shown.values() if not removed(inst)]

    @property
    def position(self) -> int:
        """Take it before sending a write whose answer goes to `put_instance`/`drop_instance`."""
        return self.written.position

    def put_instance(self, obj: JSON, *, since: int | None = None) -> Instance:
        """Fold in an Instance as the API server returned it (to a write or a read sent at
        position `since`; None: now); returns it decoded. Shown until the watch brings that
        version; not at all when the watch already has."""
        inst = self.store.decode(obj)
        meta = inst.metadata
        before = self.instance(meta.key)
        value = None if removed(inst) else inst
        self.written.put(meta.key, Written(meta.uid, meta.resource_version, value), since=since)
        self._changed(meta.key, before, self.instance(meta.key))
        return inst

    def drop_instance(self, key: ObjectKey, *, since: int | None = None) -> None:
        """The API server said `key` does not exist (to a request sent at position `since`)."""
        before = self.instance(key)
        if before is None:
            return  # nothing shown: nothing to hide
        self.written.put(key, Written(None, None, None), since=since)
        self._changed(key, before, self.instance(key))

    def watched(self, change: Change[Instance]) -> tuple[Instance | None, Instance | None]:
        """The watch changed `change.key`: tell the waiters when what the view shows changed.
        Returns what it showed before and shows now."""
        written = self.written.watched(change.key)
        before = change.old if written is None else written.value
        if before is not None and removed(before):
            before = None
        after = self.instance(change.key)
        self._changed(change.key, before, after)
        return before, after

    # --- devices this node discovered --------------------------------------------------------

    def device(self, key: ObjectKey) -> Device | None:
        return self._devices.get(key)

    def set_devices(self, config_key: ObjectKey, devices: Mapping[ObjectKey, Device]) -> None:
        """Replace what discovery found for one Configuration (instance key -> device)."""
        old = self._devices_by_config.get(config_key, {})
        if old == devices:
            return
        for key in old:
            self._devices.pop(key, None)
        if devices:
            self._devices_by_config[config_key] = dict(devices)
        else:
            self._devices_by_config.pop(config_key, None)
        self._devices.update(devices)
        self._notify(config_key, *old.keys(), *devices.keys())
