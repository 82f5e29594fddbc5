"""Claiming and freeing slots in `Instance.spec.deviceUsage`: read, decide, write, remember.

The decision is pure (slots.py, vdevs.py); this shell does the I/O around it, in the only order
that cannot leave a phantom claim: read the Instance (from the node's view, i.e. the watch cache
plus our own latest writes), compute the new map, write it, and only when the write holds fold
the server's answer into the view.

A write is one merge patch (field manager USAGE_FIELD_MANAGER) whose body names the Instance's
resourceVersion — the version the decision was made on — which the API server takes as the
write's precondition, and frees (`null`) and claims this node's keys. So a write holds only on
exactly what was decided on (0 double claims), and a lost race costs the API server at most one
attempt: once the precondition fails (on the version it holds, or on the one it re-reads when the
object changed under the attempt) the request ends with 409. (A server-side
apply per key needs no version, but the API server retries each apply that lost the race for the
object inside the request, a full apply of an object that grows with the nodes sharing it: N
nodes claiming one Instance at once cost it ~N²/2 applies.) A lost race (409) is
retried by this node for up to CLAIM_BUDGET_S: at once when the race was with a write of other
fields; when other claims won it, after a pause with full jitter over a window sized to the
nodes that may still be claiming (so the nodes that lost to one winner take turns instead of
meeting again), on the Instance read as it is then. A slot that is really taken ends in
SlotTaken, which the plugin turns into a clear gRPC error.
Claims on one Instance are serialized inside the agent (a lock per Instance, with group commit),
so two Allocates on this node never race each other; different Instances go in parallel.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack

import attrs
import httpx
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins import slots, vdevs
from akri_trio.agent.plugins.slots import InstanceSlots
from akri_trio.agent.view import NodeView
from akri_trio.kube.client import Client
from akri_trio.kube.errors import ApiError, Conflict, Invalid, NotFound
from akri_trio.model import naming
from akri_trio.model.resources import INSTANCES, JSON, Instance

log = logging.getLogger(__name__)

# How long one claim may retry races it lost to other nodes before it gives up (the kubelet
# puts no deadline on Allocate: the Pod waits in admission meanwhile).
CLAIM_BUDGET_S = 20.0
# The pause after a lost race is uniform in [0, SLOT * the nodes that may be claiming too),
# at most CAP: about one write of a shared Instance per SLOT (what one takes the API server).
RETRY_SLOT_S = 0.025
RETRY_CAP_S = 2.0
# How long a failed or cancelled configuration-level Allocate may spend giving back the claims
# it made: shielded, so it survives the cancellation, but bounded, so an API server that is
# down cannot hold up the agent's shutdown past a Pod's grace period (the reclaimer frees
# whatever is left).
RELEASE_BOUND_S = 5.0


class ClaimFailed(Exception):
    """The API server could not be written (outage, RBAC, ...): nothing was claimed."""


class InstanceGone(Exception):
    """The Instance does not exist (any more)."""


# One field manager for every node's claims: a claim's value names its node already, and a
# manager per node would grow a shared Instance (and every write and watch event of it) by ~200 B
# per claiming node.
USAGE_FIELD_MANAGER = "akri-claims"


def held_by(usage: Mapping[str, str], node: str, instance: str) -> dict[str, str]:
    """The part of a deviceUsage map this node's field manager owns: its claims, all three
    kinds (the DRA claims it records after a switch back from DRA mode), on slots of
    `instance`. A key that is no slot is never ours, whatever its value: anyone may write one
    (and a key of thousands of characters would make every write of ours fail)."""
    out: dict[str, str] = {}
    for key, value in usage.items():
        if slots.slot_index(instance, key) is None:
            continue
        match naming.parse_usage(value):
            case naming.NodeClaim(holder) if holder == node:
                out[key] = value
            case naming.ConfigClaim(_, holder) | naming.DraClaim(_, holder) if holder == node:
                out[key] = value
    return out


def usage_patch(inst: Instance, old: Mapping[str, str], new: Mapping[str, str]) -> JSON:
    """One merge patch taking this node's keys from `old` to `new` on exactly the version of
    `inst` (its resourceVersion in the body is the API server's precondition: any other version
    answers 409): frees what it gives up (`None` deletes a key), claims the rest, and leaves
    every other key alone. A merge patch costs the API server less than the equivalent JSON
    patch with a `test` of the resourceVersion (bench/RESULTS.md: about 1.5 ms of an Allocate's
    write on an Instance of 420 slots)."""
    usage: dict[str, str | None] = {key: None for key in sorted(old.keys() - new.keys())}
    for key, value in sorted(new.items()):
        if old.get(key) != value:
            usage[key] = value
    return {
        "metadata": {"resourceVersion": inst.metadata.resource_version},
        "spec": {"deviceUsage": usage},
    }


def retry_pause(inst: Instance, node: str) -> float:
    """How long to wait before trying again after losing a race on `inst`: full jitter over a
    window sized to the other nodes that may be claiming it now (those sharing it that hold
    none of its slots), so that the nodes that lost to one winner take turns instead of
    meeting again. (With 50 nodes claiming one Instance at once, this cost the API server
    half the work, and the median claim less than half the wait, of a window doubling from
    10 ms per try; see bench/storm.py.)"""
    holders = set()
    for value in inst.spec.device_usage.values():
        match naming.parse_usage(value):
            case (
                naming.NodeClaim(holder)
                | naming.ConfigClaim(_, holder)
                | naming.DraClaim(_, holder)
            ):
                holders.add(holder)
    others = len(set(inst.spec.nodes) - holders - {node})
    return random.uniform(0, min(RETRY_CAP_S, RETRY_SLOT_S * max(1, others)))


@attrs.define(eq=False)
class _Request:
    decide: Callable[[Instance], Mapping[str, str]]
    done: bool = False
    result: Instance | None = None
    error: BaseException | None = None


def _decide_all(inst: Instance, batch: list[_Request]) -> tuple[dict[str, str], list[_Request]]:
    """Run each request's decision on the usage left by the ones before it."""
    usage = dict(inst.spec.device_usage)
    accepted: list[_Request] = []
    for request in batch:
        request.error = None
        current = attrs.evolve(inst, spec=attrs.evolve(inst.spec, device_usage=usage))
        try:
            usage = dict(request.decide(current))
        except (slots.SlotError, vdevs.VdevError, ValueError) as exc:
            request.error = exc
            continue
        accepted.append(request)
    return usage, accepted


class Claims:
    def __init__(self, api: Client, view: NodeView) -> None:
        self.api = api
        self.view = view
        self.node = view.node
        self._locks: defaultdict[ObjectKey, trio.Lock] = defaultdict(trio.Lock)
        self._queues: defaultdict[ObjectKey, list[_Request]] = defaultdict(list)

    async def _fresh(self, key: ObjectKey) -> Instance:
        since = self.view.position
        try:
            obj = await self.api.get(INSTANCES, key.name, namespace=key.namespace)
        except NotFound:
            self.view.drop_instance(key, since=since)
            raise InstanceGone(key) from None
        except (ApiError, httpx.HTTPError) as exc:
            raise ClaimFailed(f"reading Instance {key}: {exc}") from exc
        return self.view.put_instance(obj, since=since)

    def _cached(self, key: ObjectKey) -> Instance | None:
        return self.view.instance(key)

    async def _write(self, inst: Instance, usage: Mapping[str, str]) -> Instance:
        """Write this node's part of `usage` (nothing when it does not change) on the version
        of `inst`. A lost race raises Conflict (or Invalid) to the caller's retry loop."""
        name = inst.metadata.name
        old = held_by(inst.spec.device_usage, self.node, name)
        new = held_by(usage, self.node, name)
        if old == new:
            return inst
        key = inst.metadata.key
        since = self.view.position
        try:
            obj = await self.api.merge_patch(
                INSTANCES,
                key.name,
                usage_patch(inst, old, new),
                field_manager=USAGE_FIELD_MANAGER,
                namespace=key.namespace,
            )
        except NotFound:
            raise InstanceGone(key) from None
        except (Conflict, Invalid):
            raise
        except (ApiError, httpx.HTTPError) as exc:
            raise ClaimFailed(f"writing deviceUsage of {key.name}: {exc}") from exc
        return self.view.put_instance(obj, since=since)

    async def _after_lost_race(
        self, tried: Instance, refusal: ApiError, deadline: float
    ) -> Instance:
        """The version to decide on next, after a write on `tried` was refused. When other
        claims changed meanwhile (nodes contend for this Instance): a pause sized to the nodes
        that may still be claiming, then the Instance read as it is (under a fleet's load the
        watch may be versions behind, and each of those would lose again). When only other
        fields changed: at once. Raises ClaimFailed when the budget is spent, or when nothing
        changed (the refusal was no lost race)."""
        key, usage = tried.metadata.key, tried.spec.device_usage
        current = self._cached(key) or tried
        if current.spec.device_usage == usage:
            current = await self._fresh(key)
            if current.metadata.resource_version == tried.metadata.resource_version:
                raise ClaimFailed(f"writing deviceUsage of {key.name} refused: {refusal}")
        contended = current.spec.device_usage != usage
        pause = retry_pause(current, self.node) if contended else 0.0
        if trio.current_time() + pause > deadline:
            raise ClaimFailed(f"deviceUsage of {key} kept changing for {CLAIM_BUDGET_S:.0f} s")
        if not contended:
            return current
        log.debug("deviceUsage of %s changed under us; again in %.0f ms", key, pause * 1000)
        await trio.sleep(pause)
        return await self._fresh(key)

    async def update_instance(
        self, key: ObjectKey, decide: Callable[[Instance], Mapping[str, str]]
    ) -> Instance:
        """Apply `decide(instance) -> new deviceUsage` to one Instance, with retries on 409.

        `decide` may raise (SlotTaken, BadSlot...): that refuses this caller only, with nothing
        of its own written. Concurrent callers on one Instance are committed together (group
        commit): whoever holds the Instance's lock decides every queued request in arrival
        order against one read and writes them as one compare-and-swap, so fifty Allocates
        on one device cost a few writes, not fifty serialized ones.
        """
        request = _Request(decide)
        queue = self._queues[key]
        queue.append(request)
        try:
            async with self._locks[key]:
                if not request.done:
                    await self._commit(key)
        except BaseException:
            if request in queue:  # never decided: nothing of ours can have been written
                queue.remove(request)
            raise
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    async def _commit(self, key: ObjectKey) -> None:
        """Decide and write every queued request on `key` (the caller holds its lock)."""
        batch, self._queues[key] = self._queues[key], []
        deadline = trio.current_time() + CLAIM_BUDGET_S
        try:
            inst = self._cached(key) or await self._fresh(key)
            while True:
                usage, accepted = _decide_all(inst, batch)
                try:
                    inst = await self._write(inst, usage)
                except (Conflict, Invalid) as refusal:
                    inst = await self._after_lost_race(inst, refusal, deadline)
                    continue
                for request in accepted:
                    request.result = inst
                return
        except (ClaimFailed, InstanceGone) as exc:
            for request in batch:
                if request.error is None:
                    request.error = exc
        except BaseException:
            # Cancelled (or a bug) mid-commit: hand the undecided requests back to the queue;
            # the next lock holder decides them afresh (claims are idempotent, so a write that
            # did land meanwhile is simply found already done).
            for request in batch:
                request.error = request.result = None
            self._queues[key][:0] = batch
            raise
        finally:
            for request in batch:
                request.done = request.error is not None or request.result is not None

    # --- instance level ------------------------------------------------------------------------

    async def claim_slots(self, key: ObjectKey, slot_ids: Sequence[str]) -> Instance:
        return await self.update_instance(
            key,
            lambda inst: slots.claim(
                inst.spec.device_usage,
                slot_ids,
                self.node,
                instance=key.name,
                capacity=inst.spec.capacity,
            ),
        )

    async def free_slots(self, key: ObjectKey, slot_ids: Iterable[str]) -> Instance:
        ids = list(slot_ids)
        return await self.update_instance(
            key, lambda inst: slots.free(inst.spec.device_usage, ids, self.node)
        )

    # --- configuration level -------------------------------------------------------------------

    async def claim_vdevs(
        self,
        config: str,
        keys: Sequence[ObjectKey],
        container_requests: Sequence[Sequence[str]],
    ) -> vdevs.AllocationPlan:
        """Map and claim the vdevs of one Allocate over the Instances `keys` (this node's
        Instances of `config`). All touched Instances are written; if one write fails for good,
        the claims this call made on the others are released again."""
        namespace = keys[0].namespace if keys else "default"
        async with AsyncExitStack() as stack:
            for key in sorted(keys):  # a fixed order: no deadlock between concurrent Allocates
                await stack.enter_async_context(self._locks[key])
            instances = {k: self._cached(k) or await self._fresh(k) for k in keys}
            before = {k: dict(v.spec.device_usage) for k, v in instances.items()}
            written: list[ObjectKey] = []
            deadline = trio.current_time() + CLAIM_BUDGET_S
            try:
                while True:
                    slots_by_name = {
                        inst.metadata.name: InstanceSlots(
                            inst.spec.capacity, inst.spec.device_usage
                        )
                        for inst in instances.values()
                    }
                    plan = vdevs.allocate(slots_by_name, container_requests, self.node, config)
                    try:
                        for name, usage in sorted(plan.usage.items()):
                            key = ObjectKey(namespace, name)
                            instances[key] = await self._write(instances[key], usage)
                            written.append(key)
                        return plan
                    except (Conflict, Invalid) as refusal:
                        instances[key] = await self._after_lost_race(
                            instances[key], refusal, deadline
                        )
            except BaseException:
                with trio.move_on_after(RELEASE_BOUND_S, shield=True) as bounded:
                    await self._release(instances, before, written)
                if bounded.cancelled_caught:
                    log.warning("gave up releasing the claims of a failed Allocate on %s", config)
                raise

    async def _release(
        self,
        instances: dict[ObjectKey, Instance],
        before: Mapping[ObjectKey, Mapping[str, str]],
        keys: list[ObjectKey],
    ) -> None:
        """Undo claims of a failed configuration-level Allocate: restore our part of each
        written Instance's map to what it was before the call (best effort, logged)."""
        for key in dict.fromkeys(keys):
            try:
                inst = await self._fresh(key)
                restored = {**inst.spec.device_usage}
                for k in held_by(inst.spec.device_usage, self.node, key.name):
                    restored.pop(k)
                restored.update(held_by(before[key], self.node, key.name))
                await self._write(inst, restored)
            except Exception as exc:  # the reclaimer frees what is left
                log.warning("could not release claims on %s after a failed Allocate: %s", key, exc)

    async def free_vdevs(
        self, config: str, keys: Sequence[ObjectKey], vdev_ids: Iterable[str]
    ) -> None:
        ids = list(vdev_ids)
        for key in keys:
            name = key.name
            await self.update_instance(
                key,
                lambda inst, name=name: vdevs.free_vdevs(  # type: ignore[misc]
                    {name: InstanceSlots(inst.spec.capacity, inst.spec.device_usage)},
                    ids,
                    self.node,
                ).get(name, inst.spec.device_usage),
            )
