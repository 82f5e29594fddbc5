"""The slot reclaimer's shell: ask the kubelet what is in use, free what no container uses.

The decision is `reclaim_plan.ReclaimState.step` (pure); this module feeds it every `period`
seconds with the slots and virtual devices this node holds (from the node's view) and the
kubelet's PodResources report, and frees what it returns through `Claims` — the same
read-decide-write path as Allocate, so a free can never clobber a concurrent claim. A pass whose
PodResources call fails is skipped ("the kubelet did not answer" is not "nothing is in use").

`claimed_at` is when this process first saw a claim: after an agent restart every claim looks
fresh, which only delays reclaiming by one grace period — never frees early.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.claims import ClaimFailed, Claims, InstanceGone
from akri_trio.agent.plugins.slots import slot_index
from akri_trio.agent.reclaim_plan import DeviceKey, ReclaimState, device_key
from akri_trio.agent.view import NodeView
from akri_trio.model import naming
from akri_trio.rpc.gen import podresources_v1_grpc as pr_grpc
from akri_trio.rpc.gen import podresources_v1_pb2 as pr
from akri_trio.rpc.uds import UnixChannel
from akri_trio.runtime import sleep_to_tick

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 10.0
PASS_STARTS = "reclaiming unused slots - start"


async def list_in_use(socket: Path) -> list[tuple[str, list[str]]]:
    """(resource name, device ids) for every container the kubelet knows (akri.sh/* only)."""
    async with UnixChannel(socket) as channel:
        response = await pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest())
    return [
        (devices.resource_name, list(devices.device_ids))
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        if devices.resource_name.startswith(naming.AKRI_PREFIX + "/")
    ]


class Holding(NamedTuple):
    instance: ObjectKey
    slot: str  # the deviceUsage key
    config: str | None  # set for a configuration-level claim (the key is then a vdev)


def held_devices(view: NodeView) -> dict[DeviceKey, Holding]:
    """Every slot / vdev this node holds, and where."""
    held: dict[DeviceKey, Holding] = {}
    for inst in view.instances():
        key = inst.metadata.key
        for slot, value in inst.spec.device_usage.items():
            if slot_index(inst.metadata.name, slot) is None:
                continue  # not a slot (see slots.poisoned_keys): never ours to free
            match naming.parse_usage(value):
                case naming.NodeClaim(node) if node == view.node:
                    held[device_key(inst.metadata.name, slot)] = Holding(key, slot, None)
                case naming.ConfigClaim(vdev, node) if node == view.node:
                    config = inst.spec.configuration_name
                    held[device_key(config, vdev)] = Holding(key, slot, config)
    return held


class Reclaimer:
    def __init__(
        self,
        view: NodeView,
        claims: Claims,
        pod_resources_socket: Path,
        *,
        period: float = DEFAULT_PERIOD_S,
        grace: float | None = None,
        on_freed: Callable[[int], None] | None = None,
        on_slots_freed: Callable[[ObjectKey, list[str]], None] | None = None,
    ) -> None:
        self.on_slots_freed = on_slots_freed
        self.view = view
        self.claims = claims
        self.socket = pod_resources_socket
        self.period = period
        self.state = ReclaimState() if grace is None else ReclaimState(grace=grace)
        self.first_seen: dict[DeviceKey, float] = {}
        self.on_freed = on_freed

    async def run(self) -> None:
        while True:
            await self.pass_once()
            await sleep_to_tick(self.period)

    async def pass_once(self) -> int:
        """One pass; returns how many slots/vdevs it freed."""
        # Upstream's words at the start of each pass, at a level logged by default as upstream's
        # image logs them: its e2e suite reads the agent's log for this line.
        log.info(PASS_STARTS)
        now = trio.current_time()
        held = held_devices(self.view)
        self.first_seen = {k: self.first_seen.get(k, now) for k in held}
        if not held:  # nothing to free, so no need to ask (a DRA-mode agent, most of the time)
            self.state = self.state.step(now, {}, []).state
            return 0
        in_use = await self._in_use()
        if in_use is None:
            return 0
        step = self.state.step(now, dict(self.first_seen), in_use)
        self.state = step.state
        return await self._free(step.to_free, held)

    async def _in_use(self) -> list[tuple[str, list[str]]] | None:
        in_use = None
        try:
            with trio.fail_after(5):
                in_use = await list_in_use(self.socket)
        except* Exception as group:
            log.info("PodResources List failed, skipping this pass: %r", group.exceptions[0])
        return in_use

    async def _free(self, keys: frozenset[DeviceKey], held: dict[DeviceKey, Holding]) -> int:
        slots_by_instance: defaultdict[ObjectKey, list[str]] = defaultdict(list)
        vdevs_by_config: defaultdict[tuple[str, str], list[str]] = defaultdict(list)
        instances_by_config: defaultdict[tuple[str, str], set[ObjectKey]] = defaultdict(set)
        for key in keys:
            where = held[key]
            if where.config is None:
                slots_by_instance[where.instance].append(where.slot)
            else:
                group = (where.instance.namespace, where.config)
                vdevs_by_config[group].append(key.device)
                instances_by_config[group].add(where.instance)
        freed = 0
        for inst_key, slot_ids in sorted(slots_by_instance.items()):
            try:
                await self.claims.free_slots(inst_key, slot_ids)
                freed += len(slot_ids)
                log.info("reclaimed %s of %s (no container uses them)", slot_ids, inst_key)
                if self.on_slots_freed is not None:
                    self.on_slots_freed(inst_key, sorted(slot_ids))
            except (ClaimFailed, InstanceGone) as exc:
                log.info("reclaiming %s of %s: %s (will retry)", slot_ids, inst_key, exc)
        for (namespace, config), vdev_ids in sorted(vdevs_by_config.items()):
            group_keys = sorted(instances_by_config[(namespace, config)])
            try:
                await self.claims.free_vdevs(config, group_keys, vdev_ids)
                freed += len(vdev_ids)
                log.info("reclaimed %s of %s (no container uses them)", vdev_ids, config)
            except (ClaimFailed, InstanceGone) as exc:
                log.info("reclaiming %s of %s: %s (will retry)", vdev_ids, config, exc)
        if freed and self.on_freed is not None:
            self.on_freed(freed)
        return freed
