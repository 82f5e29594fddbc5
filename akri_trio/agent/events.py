"""What the agent tells `kubectl describe`: Events on Configurations and Instances.

The Configuration's status says what is wrong *now*; Events say what happened and when: a
handler that went away, details a handler rejected, problems a handler reports, a Secret that
is missing, devices found and lost, an Allocate refused and why, slots the reclaimer took back.
Deciding which Events a change means is pure (`condition_events`, `device_events`);
`AgentEvents` hands them to the recorder, which never blocks (akri_trio.kube.events). Without
a recorder (`AgentEvents()`), nothing is recorded, so callers need no checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from akri_trio.address import ObjectKey
from akri_trio.kube.events import EventRecorder, ObjectRef
from akri_trio.model.resources import Configuration, Instance

# condition type -> the Event reason when it turns False
CONDITION_REASONS = {
    "HandlerAvailable": "HandlerUnavailable",
    "DiscoveryDetailsValid": "DiscoveryDetailsRejected",
    "PropertiesResolved": "PropertiesUnresolved",
    "Accepted": "ConfigurationRefused",
    "DevicesAccepted": "DevicesRefused",
    "BrokerInfoValid": "BrokerInfoSkipped",
    "DiscoveryHealthy": "DiscoveryProblems",
}


def condition_events(
    previous: Mapping[str, Any] | None, entry: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """(reason, message) for each condition of this node's status entry that is False now and
    was not False with the same message before."""
    before = {c["type"]: c for c in (previous or {}).get("conditions") or []}
    out = []
    for cond in entry.get("conditions") or []:
        reason = CONDITION_REASONS.get(cond.get("type", ""))
        if reason is None or cond.get("status") != "False":
            continue
        old = before.get(cond["type"])
        if old and old.get("status") == "False" and old.get("message") == cond.get("message"):
            continue
        out.append((reason, f"{entry.get('node', '')}: {cond.get('message', '')}"))
    return out


def device_events(before: Iterable[str], after: Iterable[str]) -> list[tuple[str, str]]:
    """("DeviceFound" | "DeviceLost", Instance name) for each Instance that came or went."""
    old, new = set(before), set(after)
    return [("DeviceFound", n) for n in sorted(new - old)] + [
        ("DeviceLost", n) for n in sorted(old - new)
    ]


def instance_ref(inst: Instance | None) -> ObjectRef | None:
    """What an Event on this Instance is about (None: not known here)."""
    if inst is None:
        return None
    meta = inst.metadata
    return ObjectRef(inst.api_version, inst.kind, meta.namespace, meta.name, meta.uid)


class AgentEvents:
    def __init__(
        self,
        recorder: EventRecorder | None = None,
        node: str = "",
        *,
        configuration: Callable[[ObjectKey], Configuration | None] = lambda _: None,
        instance: Callable[[ObjectKey], ObjectRef | None] = lambda _: None,
    ) -> None:
        self.recorder = recorder
        self.node = node
        self._configuration = configuration
        self._instance = instance
        self._devices: dict[ObjectKey, frozenset[str]] = {}

    def _config_ref(self, key: ObjectKey) -> ObjectRef:
        config = self._configuration(key)
        if config is not None:
            meta = config.metadata
            return ObjectRef(config.api_version, config.kind, meta.namespace, meta.name, meta.uid)
        return ObjectRef("akri.sh/v0", "Configuration", key.namespace, key.name)

    def status_changed(
        self, key: ObjectKey, previous: Mapping[str, Any] | None, entry: Mapping[str, Any]
    ) -> None:
        if self.recorder is None:
            return
        for reason, message in condition_events(previous, entry):
            self.recorder.warning(self._config_ref(key), reason, message)

    def devices(self, key: ObjectKey, instances: Iterable[ObjectKey]) -> None:
        """This node's discovery for Configuration `key` now gives these Instances."""
        if self.recorder is None:
            return
        names = frozenset(k.name for k in instances)
        before = self._devices.get(key)
        self._devices[key] = names
        if before is None and not names:
            return
        for reason, name in device_events(before or (), names):
            verb = "found" if reason == "DeviceFound" else "no longer seen"
            self.recorder.normal(
                self._config_ref(key), reason, f"device of Instance {name} {verb} on {self.node}"
            )

    def forget(self, key: ObjectKey) -> None:
        self._devices.pop(key, None)

    def allocate_refused(
        self, key: ObjectKey, kind: str, requests: Sequence[Sequence[str]], why: str
    ) -> None:
        if self.recorder is None:
            return
        ref = self._instance(key) if kind == "instance" else None
        asked = "; ".join(",".join(ids) for ids in requests)
        self.recorder.warning(
            ref or self._config_ref(key),
            "AllocateRefused",
            f"{self.node}: Allocate of {asked} refused: {why}",
        )

    def slots_reclaimed(self, key: ObjectKey, slots: Sequence[str]) -> None:
        if self.recorder is None:
            return
        ref = self._instance(key) or ObjectRef("akri.sh/v0", "Instance", key.namespace, key.name)
        self.recorder.normal(
            ref,
            "SlotReclaimed",
            f"{self.node}: freed {', '.join(slots)} (no container on the node uses them)",
        )
