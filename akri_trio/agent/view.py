"""What this node's agent knows right now: the cluster's Instances and its own devices.

Two sources feed it — the Instance watch (what the cluster says) and this node's discovery (which
devices it can reach) — and every device plugin reads from it. Version counters tell readers
"something you read changed": per key (an Instance, a Configuration) for the plugins' ListAndWatch
streams, which recompute their answer and send it only when it differs, and `membership` for the
plugin manager, which ticks only when the set of plugins to run may change — not on the claims
that make up most of the traffic. Writes that this agent makes (claims) are folded in from the
API server's answer at once, so the kubelet hears about a claim without waiting for the watch.

An Instance's `capacity` is clamped to the agent's `--max-capacity` on the way in: the Instance
CRD bounds it as the Configuration's, but anyone who may write Instances (or a CRD installed
without the bound) could otherwise make every plugin build a slot list millions long. The clamp
is logged once per Instance and capacity.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.slots import poisoned_keys
from akri_trio.kube.store import drop_managed_fields
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


def version_number(resource_version: object) -> int:
    """A resourceVersion as a number to compare (0 when missing or not a number)."""
    try:
        return int(str(resource_version or 0))
    except ValueError:
        return 0


def _resource_version(obj: Mapping[str, Any]) -> int:
    return version_number((obj.get("metadata") or {}).get("resourceVersion"))


def _membership(inst: Instance) -> tuple[object, ...]:
    """What of an Instance decides which plugins run (see PluginManager)."""
    return inst.spec.nodes, inst.metadata.deletion_timestamp, inst.spec.configuration_name


class NodeView:
    """`membership` ticks when an Instance appears, goes, or changes its nodes, deletion or
    Configuration, and when a device appears or goes; `changes_of(key)` on every change that
    concerns `key`:
    an Instance's key or a Configuration's key (ticked when any of its Instances or its devices
    change). A plugin waits on its own key, so a write to one Instance
    wakes the plugins of that Instance and its Configuration, not every plugin on the node."""

    def __init__(self, node: str, *, max_capacity: int = MAX_CAPACITY) -> None:
        self.node = node
        self.max_capacity = max_capacity
        self.membership = Changed()
        self._keyed: dict[ObjectKey, Changed] = {}
        self._instances: dict[ObjectKey, Instance] = {}
        # key -> uid of the incarnation seen deleted: any later news of that uid is stale (a
        # uid is never reused; an Instance made again under the key has a new one).
        self._gone: dict[ObjectKey, str] = {}
        self._devices: dict[ObjectKey, Device] = {}  # instance key -> device this node discovered
        self._devices_by_config: dict[ObjectKey, dict[ObjectKey, Device]] = {}
        self._reported: set[tuple[ObjectKey, str, str]] = set()  # (key, kind, what)

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

    # --- Instances (from the watch, and from our own writes) ---------------------------------

    def instance(self, key: ObjectKey) -> Instance | None:
        return self._instances.get(key)

    def instances(self) -> Iterator[Instance]:
        return iter(self._instances.values())

    def put_instance(self, obj: JSON) -> Instance:
        """Fold in an Instance as the API server returned it. An older resourceVersion than
        the one held (a watch event racing our own write's answer) is ignored."""
        obj = drop_managed_fields(obj)
        meta = obj.get("metadata") or {}
        key = ObjectKey(meta.get("namespace") or "default", meta.get("name") or "")
        version = _resource_version(obj)
        held = self._instances.get(key)
        if held is not None:
            held_version = version_number(held.metadata.resource_version)
            # Older, or the watch's echo of a write we already folded in: nothing new.
            if version < held_version or (version == held_version and version):
                return held
        uid = str(meta.get("uid") or "")
        if uid and self._gone.get(key) == uid:
            return structure(obj, Instance)  # news from before its deletion: stays deleted
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # The API server removes such an object at once: e.g. the answer to our own write
            # that released the last finalizer, which may arrive after the watch's DELETE.
            # Folding it in would resurrect a deleted Instance in the view for good.
            self._gone[key] = uid
            self.drop_instance(key)
            return structure(obj, Instance)
        self._gone.pop(key, None)
        inst = self._clamped(structure(obj, Instance))
        if held != inst:
            if held is None or held.spec.device_usage != inst.spec.device_usage:
                self._report_poisoned(inst)
            self._instances[key] = inst
            configs = {config_key(inst)} | ({config_key(held)} if held else set())
            self._notify(
                key, *configs, membership=held is None or _membership(held) != _membership(inst)
            )
        return inst

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

    def drop_instance(self, key: ObjectKey) -> None:
        held = self._instances.pop(key, None)
        if held is not None:
            self._notify(key, config_key(held))

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
