"""Claiming and freeing slots in `Instance.spec.deviceUsage`: read, decide, write, remember.

The decision is pure (slots.py, vdevs.py); this shell does the I/O around it, in the only order
that cannot leave a phantom claim: read the Instance (from the node's view, i.e. the watch cache
plus our own latest writes), compute the new map, write it with server-side apply carrying the
read `resourceVersion` as a precondition, and only when the write holds fold the server's answer
into the view. A 409 (someone wrote in between, or another node's field manager owns the key)
re-reads from the API server and decides again — the slot may still be free — up to a bound; a
slot that is really taken ends in SlotTaken, which the plugin turns into a clear gRPC error.

Field manager `dp-<node>` (as upstream) owns exactly the keys this node holds; the applied map
is always "every slot this node holds in this Instance", so omitting a key frees it.
Claims on one Instance are serialized inside the agent (a lock per Instance) so that two
Allocates on this node never race each other into 409s; different Instances go in parallel.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack

import httpx
import trio

from akri_trio.agent.plugins import slots, vdevs
from akri_trio.agent.plugins.slots import InstanceSlots
from akri_trio.agent.view import NodeView, instance_key
from akri_trio.kube.client import Client, Resource
from akri_trio.kube.errors import ApiError, Conflict, NotFound
from akri_trio.model import naming
from akri_trio.model.resources import JSON, Instance

log = logging.getLogger(__name__)

INSTANCES = Resource("akri.sh", "v0", "instances", "Instance")
MAX_ATTEMPTS = 5


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


def usage_body(inst: Instance, usage: Mapping[str, str], node: str) -> JSON:
    return {
        "apiVersion": naming.API_VERSION,
        "kind": "Instance",
        "metadata": {
            "name": inst.metadata.name,
            "namespace": inst.metadata.namespace,
            "resourceVersion": inst.metadata.resource_version,
        },
        "spec": {"deviceUsage": held_by(usage, node)},
    }


class Claims:
    def __init__(self, api: Client, view: NodeView) -> None:
        self.api = api
        self.view = view
        self.node = view.node
        self._locks: defaultdict[str, trio.Lock] = defaultdict(trio.Lock)

    async def _fresh(self, key: str) -> Instance:
        namespace, name = key.split("/", 1)
        try:
            obj = await self.api.get(INSTANCES, name, namespace=namespace)
        except NotFound:
            self.view.drop_instance(key)
            raise InstanceGone(key) from None
        except (ApiError, httpx.HTTPError) as exc:
            raise ClaimFailed(f"reading Instance {key}: {exc}") from exc
        return self.view.put_instance(obj)

    def _cached(self, key: str) -> Instance | None:
        return self.view.instance(key)

    async def _write(self, inst: Instance, usage: Mapping[str, str]) -> Instance:
        """One apply; Conflict propagates to the caller's retry loop."""
        try:
            obj = await self.api.apply(
                INSTANCES,
                usage_body(inst, usage, self.node),
                field_manager=usage_field_manager(self.node),
                namespace=inst.metadata.namespace,
            )
        except Conflict:
            raise
        except NotFound:
            raise InstanceGone(instance_key(inst.metadata.namespace, inst.metadata.name)) from None
        except (ApiError, httpx.HTTPError) as exc:
            raise ClaimFailed(f"writing deviceUsage of {inst.metadata.name}: {exc}") from exc
        return self.view.put_instance(obj)

    async def update_instance(
        self, key: str, decide: Callable[[Instance], Mapping[str, str]]
    ) -> Instance:
        """Apply `decide(instance) -> new deviceUsage` to one Instance with retries on 409.

        `decide` may raise (SlotTaken, BadSlot...): that ends the attempt with nothing written.
        Returns the Instance as written (or unchanged when `decide` changed nothing of ours).
        """
        async with self._locks[key]:
            inst = self._cached(key) or await self._fresh(key)
            for attempt in range(MAX_ATTEMPTS):
                new = decide(inst)
                if held_by(new, self.node) == held_by(inst.spec.device_usage, self.node):
                    return inst
                try:
                    return await self._write(inst, new)
                except Conflict:
                    log.debug("deviceUsage of %s changed under us (attempt %d)", key, attempt + 1)
                    inst = await self._fresh(key)
            raise ClaimFailed(f"deviceUsage of {key} kept changing; gave up after {MAX_ATTEMPTS}")

    # --- instance level ------------------------------------------------------------------------

    async def claim_slots(self, key: str, slot_ids: Sequence[str]) -> Instance:
        name = key.split("/", 1)[1]
        return await self.update_instance(
            key,
            lambda inst: slots.claim(
                inst.spec.device_usage,
                slot_ids,
                self.node,
                instance=name,
                capacity=inst.spec.capacity,
            ),
        )

    async def free_slots(self, key: str, slot_ids: Iterable[str]) -> Instance:
        ids = list(slot_ids)
        return await self.update_instance(
            key, lambda inst: slots.free(inst.spec.device_usage, ids, self.node)
        )

    # --- configuration level -------------------------------------------------------------------

    async def claim_vdevs(
        self, config: str, keys: Sequence[str], container_requests: Sequence[Sequence[str]]
    ) -> vdevs.AllocationPlan:
        """Map and claim the vdevs of one Allocate over the Instances `keys` (this node's
        Instances of `config`). All touched Instances are written; if one write fails for good,
        the claims this call made on the others are released again."""
        namespace = keys[0].split("/", 1)[0] if keys else "default"
        async with AsyncExitStack() as stack:
            for key in sorted(keys):  # a fixed order: no deadlock between concurrent Allocates
                await stack.enter_async_context(self._locks[key])
            instances = {k: self._cached(k) or await self._fresh(k) for k in keys}
            before = {k: dict(v.spec.device_usage) for k, v in instances.items()}
            written: list[str] = []
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
                            key = instance_key(namespace, name)
                            instances[key] = await self._write(instances[key], usage)
                            written.append(key)
                        return plan
                    except Conflict:
                        log.debug("vdev claim on %s raced (attempt %d)", config, attempt + 1)
                        instances = {k: await self._fresh(k) for k in keys}
                raise ClaimFailed(f"deviceUsage of {config}'s Instances kept changing")
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self._release(instances, before, written)
                raise

    async def _release(
        self,
        instances: dict[str, Instance],
        before: Mapping[str, Mapping[str, str]],
        keys: list[str],
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

    async def free_vdevs(self, config: str, keys: Sequence[str], vdev_ids: Iterable[str]) -> None:
        ids = list(vdev_ids)
        for key in keys:
            name = key.split("/", 1)[1]
            await self.update_instance(
                key,
                lambda inst, name=name: vdevs.free_vdevs(  # type: ignore[misc]
                    {name: InstanceSlots(inst.spec.capacity, inst.spec.device_usage)},
                    ids,
                    self.node,
                ).get(name, inst.spec.device_usage),
            )
