"""DRA's one I/O module: what the agent (node pools) and the controller (shared pools) do against
the API server the same way, so the two sides cannot drift apart.

- `PoolWriter.publish` is one round of a pool's reconcile: it reads the pool's slices from the
  caller's cache (`slice_store`, watched by the caller), asks `pools.plan_round` what to write,
  and writes it: every slice by server-side apply (they are whole objects we own), and only then
  the deletions, so at every moment the highest generation is a whole pool. Then it waits (a
  bounded while) until the cache shows its writes, so the reconcile its own writes cause finds
  nothing to do instead of planning from a half-updated cache and bumping the generation again.
  It answers with the `Requeue` of the next offline-grace deadline: a grace ending is a change
  nothing else reports. It keeps what the server made of each slice it wrote (its answer), so a
  field the server drops is no change: without that, a server that strips a field we write
  would be written to at every round, each write bumping the generation and causing the next.
- `probe_consumable_capacity`, `probe_device_taints`: whether the API server keeps the fields
  of consumable capacity, of device taints (the writer asks the latter itself, once, and plans
  no offline taint where the server would drop it).

Both sides run `publish` from a reconcile keyed by pool on the shared runner (kube's
`Controller`), which never runs two reconciles of one pool at once: the memory kept here per
pool (`PoolMemory`, the highest generation written) is only touched by that pool's reconcile.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Final

import httpx
import trio

from akri_trio.dra.attributes import Omitted
from akri_trio.dra.devices import keeps_device_taints, probe_slice, takes_consumable_capacity
from akri_trio.dra.offline import OFFLINE_GRACE_S, configuration_of
from akri_trio.dra.pools import PoolMemory, Wanted, plan_round, pool_key
from akri_trio.dra.resources import RESOURCE_SLICES
from akri_trio.dra.slices import PoolPlan, essence, generation_of
from akri_trio.kube import (
    JSON,
    ApiError,
    Backoff,
    Client,
    ConfigError,
    Forbidden,
    NotFound,
    ObjectKey,
    Requeue,
    Store,
    by_field,
    drop_managed_fields,
)
from akri_trio.model.resources import Configuration
from akri_trio.runtime import run_all

log = logging.getLogger(__name__)

POOL_INDEX: Final = "pool"
CATCH_UP_S: Final = 10.0  # how long a write waits for the cache to show it


def slice_store() -> Store:
    """A cache of ResourceSlices indexed by pool, as `PoolWriter` reads it."""
    return Store(transform=drop_managed_fields, indexes={POOL_INDEX: by_field(pool_key)})


class PoolWriter:
    """Publishes pools of ResourceSlices from `slices` (a `slice_store` the caller keeps
    watched), one `publish` per reconcile of a pool.

    `configurations`: the caller's cache of Configurations, when it holds every Configuration
    the pools' devices may name; a vanished device whose Configuration is gone (not merely
    refused by the cache's decoder: `Store.holds`) cannot come back and leaves at once. None:
    every vanished device gets its grace. `on_write` is told "apply" or "delete" for each slice
    write (the controller counts them). `device_taints`: whether the API server keeps device
    taints (None: ask it, at the first publish)."""

    def __init__(
        self,
        api: Client,
        slices: Store,
        *,
        field_manager: str,
        configurations: Store[Configuration] | None = None,
        offline_grace: float = OFFLINE_GRACE_S,
        on_write: Callable[[str], None] = lambda verb: None,
        device_taints: bool | None = None,
    ) -> None:
        self.api = api
        self.slices = slices
        self.field_manager = field_manager
        self.configurations = configurations
        self.offline_grace = offline_grace
        self.on_write = on_write
        self.device_taints = device_taints
        self._probing = trio.Lock()
        # pool -> the highest generation written by this run: a pool deleted and published
        # again never repeats a generation a consumer may still hold.
        self.written: dict[str, int] = {}
        self.memory: dict[str, PoolMemory] = {}  # pool -> its last round's memory
        self._omitted: dict[str, dict[str, tuple[Omitted, ...]]] = {}  # pool -> last reported
        # pool -> {essence of a slice as written: essence of the server's answer}, of the last
        # write: what plan_pool compares the wanted slices as.
        self.stored_as: dict[str, dict[str, str]] = {}

    async def _taints(self) -> bool:
        async with self._probing:  # the pools' first reconciles all wait for one probe
            if self.device_taints is None:
                self.device_taints = await probe_device_taints(self.api)
                if not self.device_taints:
                    log.warning(
                        "the API server keeps no device taints (DRADeviceTaints off): devices "
                        "in their offline grace stay allocatable"
                    )
            return self.device_taints

    def may_return(self, device: JSON) -> bool:
        """Whether a vanished device may come back: not once its Configuration is gone."""
        if self.configurations is None:
            return True
        named = configuration_of(device)
        return named is None or self.configurations.holds(ObjectKey(*named))

    async def publish(self, pool: str, wanted: Wanted | None) -> Requeue | None:
        """Make the API hold `pool` as `wanted` (None: nothing but the devices still in their
        offline grace); the requeue is for the next grace deadline."""
        taints = self.device_taints
        if taints is None:
            taints = await self._taints()
        existing = list(self.slices.select(POOL_INDEX, ObjectKey("", pool)).values())
        now = trio.current_time()
        step = plan_round(
            pool,
            wanted,
            existing,
            self.memory.get(pool),
            now=now,
            written=self.written.get(pool, 0),
            grace=self.offline_grace,
            may_return=self.may_return,
            taints=taints,
            stored_as=self.stored_as.get(pool),
        )
        if step.memory is None:
            self.memory.pop(pool, None)
        else:
            self.memory[pool] = step.memory
        self._report_omitted(pool, wanted)
        if not step.plan.unchanged:
            await self._write(pool, step.plan)
        return None if step.next_deadline is None else Requeue(step.next_deadline - now)

    def _report_omitted(self, pool: str, wanted: Wanted | None) -> None:
        omitted = {} if wanted is None else dict(wanted.devices.omitted)
        reported = self._omitted.pop(pool, {})
        for instance, properties in omitted.items():
            if reported.get(instance) != properties:
                log.info(
                    "Instance %s: properties left out of its DRA attributes: %s",
                    instance,
                    "; ".join(f"{o.name} ({o.reason})" for o in properties),
                )
        if omitted:
            self._omitted[pool] = omitted

    async def _write(self, pool: str, plan: PoolPlan) -> None:
        stored: dict[str, str] = {}
        await run_all([partial(self._apply, body, stored) for body in plan.apply])
        if plan.apply:
            self.written[pool] = max(self.written.get(pool, 0), plan.generation)
            self.stored_as[pool] = stored
        else:
            self.stored_as.pop(pool, None)
        await run_all([partial(self._delete, name) for name in plan.delete])
        log.info(
            "pool %s: generation %d, %d slice(s) written, %d deleted",
            pool,
            plan.generation,
            len(plan.apply),
            len(plan.delete),
        )
        with trio.move_on_after(CATCH_UP_S):
            for body in plan.apply:
                await self.slices.wait_for(
                    ObjectKey("", body["metadata"]["name"]),
                    lambda o: o is not None and generation_of(o) >= plan.generation,
                )
            for name in plan.delete:
                await self.slices.wait_for(ObjectKey("", name), lambda o: o is None)

    async def _apply(self, body: JSON, stored: dict[str, str]) -> None:
        answer = await self.api.apply(
            RESOURCE_SLICES, body, field_manager=self.field_manager, force=True
        )
        stored[essence(body)] = essence(answer)
        self.on_write("apply")

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.api.delete(RESOURCE_SLICES, name)
        self.on_write("delete")


async def probe_consumable_capacity(api: Client) -> bool:
    """Whether the API server keeps `allowMultipleAllocations` (DRAConsumableCapacity)."""
    return takes_consumable_capacity(await _probe(api, "consumable-capacity"))


async def probe_device_taints(api: Client) -> bool:
    """Whether the API server keeps a device's `taints` (DRADeviceTaints)."""
    return keeps_device_taints(await _probe(api, "device-taint"))


async def _probe(api: Client, what: str) -> JSON:
    """The answer to a server-side dry-run create of `devices.probe_slice()`, retried with
    backoff while the API server cannot answer. An API server that does not serve
    ResourceSlices raises ConfigError, RBAC's refusal Forbidden: neither goes away by
    waiting."""
    backoff = Backoff()
    attempt = 0
    while True:
        try:
            return await api.request(
                "POST", RESOURCE_SLICES.path(), params={"dryRun": "All"}, body=probe_slice()
            )
        except NotFound as exc:
            raise ConfigError(
                "DRA mode needs resource.k8s.io/v1 (Kubernetes >= 1.34), which this API server "
                f"does not serve ({exc.message})"
            ) from exc
        except Forbidden:
            raise
        except (ApiError, httpx.HTTPError, OSError) as exc:
            delay = backoff.delay(attempt)
            attempt += 1
            log.warning("%s probe failed (%s); again in %.1f s", what, exc, delay)
            await trio.sleep(delay)
