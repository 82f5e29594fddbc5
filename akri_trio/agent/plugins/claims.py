"""Claiming and freeing slots in `Instance.spec.deviceUsage`: read, decide, write, remember.

The decision is pure (slots.py, vdevs.py); this shell does the I/O around it, in the only order
that cannot leave a phantom claim: read the Instance (from the node's view, i.e. the watch cache
plus our own latest writes), compute the new map, write it with server-side apply carrying the
read `resourceVersion` as a precondition, and only when the write holds fold the server's answer
into the view. A 409 (someone wrote in between, or another node's field manager owns the key)
re-reads from the API server and decides again — the slot may still be free — up to a bound; a
slot that is really taken ends in SlotTaken, which the plugin turns into a clear gRPC error.

Field manager `dp-<node>` (as upstream) owns exactly the keys this node holds. A write is a JSON
merge patch of only the keys that change (null frees one) plus the read resourceVersion as the
precondition.
Claims on one Instance are serialized inside the agent (a lock per Instance) so that two
Allocates on this node never race each other into 409s; different Instances go in parallel.
"""

from __future__ import annotations

import logging
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
from akri_trio.kube.errors import ApiError, Conflict, NotFound
from akri_trio.model import naming
from akri_trio.model.resources import INSTANCES, JSON, Instance

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
# How long a failed or cancelled configuration-level Allocate may spend giving back the claims
# it made: shielded, so it survives the cancellation, but bounded, so an API server that is
# down cannot hold up the agent's shutdown past a Pod's grace period (the reclaimer frees
# whatever is left).
RELEASE_BOUND_S = 5.0


class ClaimFailed(Exception):
    """The API server could not be written (outage, RBAC, ...): nothing was claimed."""


class InstanceGone(Exception):
    """The Instance does not exist (any more)."""


def usage_field_manager(node: str) -> str:
    return f"dp-{node}"


def held_by(usage: Mapping[str, str], node: str) -> dict[str, str]:
    """The part of a deviceUsage map this node's field manager owns: its claims, both kinds."""
    out: dict[str, str] = {}
    for key, value in usage.items():
        match naming.parse_usage(value):
            case naming.NodeClaim(holder) if holder == node:
                out[key] = value
            case naming.ConfigClaim(_, holder) if holder == node:
                out[key] = value
    return out


def usage_patch(inst: Instance, usage: Mapping[str, str], node: str) -> JSON:
    """A JSON merge patch of just the keys this node's claims change, carrying the
    resourceVersion that was read: the API server refuses it (409) if anyone wrote since, so
    the claim is a compare-and-swap. Sending only the changed keys keeps every write the same
    size however many slots the node holds (an apply would have to restate all of them)."""
    old, new = held_by(inst.spec.device_usage, node), held_by(usage, node)
    return {
        "metadata": {"resourceVersion": inst.metadata.resource_version},
        "spec": {"deviceUsage": slots.merge_patch(old, new)},
    }


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
        try:
            obj = await self.api.get(INSTANCES, key.name, namespace=key.namespace)
        except NotFound:
            self.view.drop_instance(key)
            raise InstanceGone(key) from None
        except (ApiError, httpx.HTTPError) as exc:
            raise ClaimFailed(f"reading Instance {key}: {exc}") from exc
        return self.view.put_instance(obj)

    def _cached(self, key: ObjectKey) -> Instance | None:
        return self.view.instance(key)

    async def _write(self, inst: Instance, usage: Mapping[str, str]) -> Instance:
        """One compare-and-swap write, none when this node's claims do not change; Conflict
        propagates to the caller's retry loop."""
        body = usage_patch(inst, usage, self.node)
        if not body["spec"]["deviceUsage"]:
            return inst
        try:
            obj = await self.api.merge_patch(
                INSTANCES,
                inst.metadata.name,
                body,
                field_manager=usage_field_manager(self.node),
                namespace=inst.metadata.namespace,
            )
        except Conflict:
            raise
        except NotFound:
            raise InstanceGone(inst.metadata.key) from None
        except (ApiError, httpx.HTTPError) as exc:
            raise ClaimFailed(f"writing deviceUsage of {inst.metadata.name}: {exc}") from exc
        return self.view.put_instance(obj)

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
        try:
            inst = self._cached(key) or await self._fresh(key)
            for attempt in range(MAX_ATTEMPTS):
                usage, accepted = _decide_all(inst, batch)
                try:
                    inst = await self._write(inst, usage)
                except Conflict:
                    log.debug("deviceUsage of %s changed under us (try %d)", key, attempt + 1)
                    inst = await self._fresh(key)
                    continue
                for request in accepted:
                    request.result = inst
                return
            raise ClaimFailed(f"deviceUsage of {key} kept changing; gave up after {MAX_ATTEMPTS}")
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
            try:
                for attempt in range(MAX_ATTEMPTS):
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
                    except Conflict:
                        log.debug("vdev claim on %s raced (attempt %d)", config, attempt + 1)
                        instances = {k: await self._fresh(k) for k in keys}
                raise ClaimFailed(f"deviceUsage of {config}'s Instances kept changing")
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
                for k in held_by(inst.spec.device_usage, self.node):
                    restored.pop(k)
                restored.update(held_by(before[key], self.node))
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
