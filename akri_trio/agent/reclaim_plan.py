"""The slot reclaimer's decision: which held slots and vdevs no container uses any more.

The kubelet never tells a device plugin that a container ended, so slots claimed in
deviceUsage would stay held forever. Every pass the agent asks the kubelet's PodResources API
what is in use and frees what this node holds but the kubelet no longer reports. Freeing too
early hands a device to a second container while the first still uses it, so the rules are
conservative; they live here, sans-IO, so they can be checked over thousands of random
histories with a fake clock.

Rules:
- A held device is freed only after it has been absent from the kubelet's report continuously
  for `grace` seconds (default 20 s, as upstream); any pass that reports it resets that clock.
- Never free a device claimed less than `grace` ago: after Allocate the kubelet may take a while
  to create the container, and until then PodResources does not list it.
- Devices are compared as (resource name, device id) pairs exactly as the kubelet reports them:
  resource `akri.sh/<instance>` or `akri.sh/<config>`, device id WITHOUT the prefix.
  (Upstream compared `akri.sh/`-prefixed slot ids against the kubelet's bare ids, so
  instance-level slots were never reclaimed.) Pairs, not bare ids, because a vdev
  `<config>-<n>` and a slot `<instance>-<i>` of another plugin can spell the same string.
- The shell's `held` is the single source of truth about what is still held. A failed free
  leaves the device in `held`, so the next pass decides to free it again (it is still absent
  and past grace): retries need no separate acknowledgement channel to drift out of sync.
- A pass whose PodResources call failed must be skipped, not fed an empty report: "the kubelet
  did not answer" is not "nothing is in use".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import attrs

from akri_trio.model.naming import resource_name

DEFAULT_GRACE_SECONDS = 20.0


class DeviceKey(NamedTuple):
    """A kubelet device: resource `akri.sh/<plugin>` and the bare device id."""

    resource: str
    device: str


def device_key(plugin: str, device: str) -> DeviceKey:
    """The key of slot `device` of instance `plugin`, or of vdev `device` of config `plugin`."""
    return DeviceKey(resource_name(plugin), device)


def in_use_keys(report: Iterable[tuple[str, Iterable[str]]]) -> frozenset[DeviceKey]:
    """PodResources (resource name, device ids) pairs, repeated per container, as keys."""
    return frozenset(DeviceKey(res, dev) for res, devices in report for dev in devices)


def _check_grace(_: object, __: object, grace: float) -> None:
    if not grace >= 0:
        raise ValueError(f"grace must be a non-negative number of seconds, got {grace!r}")


@attrs.frozen
class ReclaimStep:
    """The result of one pass: the state for the next pass and what to free now."""

    state: ReclaimState
    to_free: frozenset[DeviceKey]


@attrs.frozen
class ReclaimState:
    """What the reclaimer remembers between passes: since when each held device is absent."""

    grace: float = attrs.field(default=DEFAULT_GRACE_SECONDS, validator=_check_grace)
    absent_since: Mapping[DeviceKey, float] = attrs.field(factory=dict)

    def step(
        self,
        now: float,
        held: Mapping[DeviceKey, float | None],
        in_use: Iterable[tuple[str, Iterable[str]]],
    ) -> ReclaimStep:
        """One pass at time `now`.

        `held`: every slot/vdev this node holds -> when it was claimed locally (None when
        unknown, e.g. found in deviceUsage after an agent restart). `in_use`: the kubelet's
        PodResources report as (resource name, device ids) pairs; a dict's `.items()` works.
        """
        reported = in_use_keys(in_use)
        absent_since: dict[DeviceKey, float] = {}
        to_free: set[DeviceKey] = set()
        for key, claimed_at in held.items():
            if key in reported:
                continue
            since = self.absent_since.get(key, now)
            absent_since[key] = since
            absent_long_enough = now - since >= self.grace
            claimed_long_ago = claimed_at is None or now - claimed_at >= self.grace
            if absent_long_enough and claimed_long_ago:
                to_free.add(key)
        return ReclaimStep(attrs.evolve(self, absent_since=absent_since), frozenset(to_free))
