"""Claiming and freeing slots in `Instance.spec.deviceUsage`: read, decide, write, remember.

The decision is pure (slots.py, vdevs.py); this shell does the I/O around it, in the only order
that cannot leave a phantom claim: read the Instance (from the node's view, i.e. the watch cache
plus our own latest writes), compute the new map, write it, and only when the write holds fold
the server's answer into the view.

Every key is its own compare-and-swap, so claims on different slots of one Instance (many nodes
sharing a camera) never contend, and two claims on one slot end with exactly one winner:
- claiming is a server-side apply, field manager `dp-<node>` (as upstream), of every key this
  node holds, without `force`: a key another node's manager owns with its own value is a 409
  conflict, so the slot is taken; keys nobody owns are simply written;
- freeing is a JSON patch that `test`s each key still holds this node's value and removes it.
Neither carries a resourceVersion. A refused write (409, or 422 for a failed `test`) means the
slot changed hands: re-read it and decide again, up to a bound; a slot that is really taken ends
in SlotTaken, which the plugin turns into a clear gRPC error.
Claims on one Instance are serialized inside the agent (a lock per Instance, with group commit),
so two Allocates on this node never race each other; different Instances go in parallel.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

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
from akri_trio.model.jsonpatch import pointer, remove_if_unchanged
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


def held_by(usage: Mapping[str, str], node: str, instance: str) -> dict[str, str]:
    """The part of a deviceUsage map this node's field manager owns: its claims, both kinds,
    on slots of `instance`. A key that is no slot is never ours, whatever its value: anyone may
    write one (and a key of thousands of characters would make every write of ours fail)."""
    out: dict[str, str] = {}
    for key, value in usage.items():
        if slots.slot_index(instance, key) is None:
            continue
        match naming.parse_usage(value):
            case naming.NodeClaim(holder) if holder == node:
                out[key] = value
            case naming.ConfigClaim(_, holder) if holder == node:
                out[key] = value
    return out


def release_ops(old: Mapping[str, str], new: Mapping[str, str]) -> list[Mapping[str, Any]]:
    """JSON patch freeing the keys this node holds in `old` but not (or no more so) in `new`,
    each guarded by a `test` that it still holds it."""
    ops: list[Mapping[str, Any]] = []
    for key, value in sorted(old.items()):
        if new.get(key) != value:
            ops += remove_if_unchanged(pointer("spec", "deviceUsage", key), value)
    return ops


def claim_body(inst: Instance, held: Mapping[str, str]) -> JSON:
    """Server-side apply of every key this node holds: its field manager's whole intent."""
    return {
        "apiVersion": naming.API_VERSION,
        "kind": "Instance",
        "metadata": {"name": inst.metadata.name, "namespace": inst.metadata.namespace},
        "spec": {"deviceUsage": dict(held)},
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
        """Write this node's part of `usage` (nothing when it does not change): release what it
        gives up, then claim what it takes. A slot that changed hands raises Conflict or
        Invalid to the caller's retry loop."""
        name = inst.metadata.name
        old = held_by(inst.spec.device_usage, self.node, name)
        new = held_by(usage, self.node, name)
        if old == new:
            return inst
        manager = usage_field_manager(self.node)
        key = inst.metadata.key
        try:
            if ops := release_ops(old, new):
                obj = await self.api.json_patch(
                    INSTANCES, key.name, ops, field_manager=manager, namespace=key.namespace
                )
                inst = self.view.put_instance(obj)
            if any(old.get(k) != v for k, v in new.items()):
                obj = await self.api.apply(
                    INSTANCES, claim_body(inst, new), field_manager=manager, force=False
                )
                inst = self.view.put_instance(obj)
        except NotFound:
            raise InstanceGone(key) from None
        except (Conflict, Invalid):
            # 409: another node's manager owns a key we claim. 422: a failed `test` (the key is
            # no longer ours), or a claim on an Instance that is gone (the body lacks its
            # required fields, so it cannot create one). The caller re-reads and decides again.
            raise
        except (ApiError, httpx.HTTPError) as exc:
            raise ClaimFailed(f"writing deviceUsage of {key.name}: {exc}") from exc
        return inst

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
                except (Conflict, Invalid):
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
                    except (Conflict, Invalid):
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
