"""The controller's reconcile functions: read the caches, ask the pure cores, write the result.

Three reconcilers, each keyed by the object it is about:

- `instance(key)`: the broker Pods (lifecycle.plan_pods, with the per-broker Retry state kept
  here) and the Job (lifecycle.plan_job) of one Instance;
- `services(key)`: the instance and configuration Services of one Configuration
  (services.plan_services), applied only when their fingerprint differs;
- `node(key)`: a Node's Ready transitions (nodeloss.node_transition); on a loss, the guarded
  JSON patches of nodeloss.plan_node_loss, then the Instances left with no node are deleted.

In DRA mode (`self.dra`, dra_reconcilers.py) `instance` also makes the Instance's broker claim
template before the Pods that use it, and the brokers claim their device instead of asking for
`akri.sh/<instance>`.

Reads come only from the caches (no GET on the steady path), so a reconcile with nothing to
change makes no request. Writes are idempotent: AlreadyExists on a create and NotFound or a
failed uid precondition on a delete mean someone (a previous run of ours, the garbage
collector) got there first. A reconcile that raises is retried by the queue with backoff.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Protocol, TypeVar

import attrs
import trio

from akri_trio.controller import (
    Delete,
    InstanceRelease,
    NodeState,
    ObservedPod,
    Retry,
    StatusRelease,
    broker_job,
    broker_pods,
    fingerprinted,
    label_value,
    left_without_nodes,
    node_ready,
    node_transition,
    plan_job,
    plan_node_loss,
    plan_pods,
    plan_services,
    release_instance,
    release_status,
    up_to_date,
)
from akri_trio.controller.dra import claim_broker_job, claim_broker_pod
from akri_trio.controller.dra_reconcilers import DraReconcilers
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.kube import (
    JSON,
    AlreadyExists,
    Backoff,
    Client,
    Conflict,
    Invalid,
    NotFound,
    ObjectKey,
    Requeue,
    Resource,
    Store,
)
from akri_trio.model.convert import error_messages, structure
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES, Configuration, Instance

log = logging.getLogger(__name__)

PODS = Resource.core("pods", "Pod")
SERVICES = Resource.core("services", "Service")
NODES = Resource.core("nodes", "Node", namespaced=False)
JOBS = Resource("batch", "v1", "jobs", "Job")

FIELD_MANAGER: Final = "akri-controller"
# Seconds before a broker may be created again after its k-th create: 1, 2, 4, ... 300.
BROKER_BACKOFF = Backoff(base=1.0, cap=300.0)
WRITE_CONCURRENCY: Final = 8
RELEASE_TRIES: Final = 5

T = TypeVar("T")


class Release(Protocol):
    """A guarded removal (nodeloss.InstanceRelease, nodeloss.StatusRelease)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    def json_patch(self) -> list[JSON]: ...


R = TypeVar("R", bound=Release)


@attrs.frozen
class Caches:
    """The stores the reconcilers read (run.py keeps them filled)."""

    instances: Store
    configurations: Store
    pods: Store
    jobs: Store
    services: Store
    nodes: Store


def label_key(namespace: str, name: str) -> ObjectKey:
    """The index key of objects labelled with `name` (as names.label_value writes it)."""
    return ObjectKey(namespace, label_value(name))


def owned_by_instance(obj: Mapping[str, Any]) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(ref.get("kind") == "Instance" for ref in refs)


def _model(obj: Mapping[str, Any] | None, cls: type[T]) -> T | None:
    if obj is None:
        return None
    try:
        return structure(obj, cls)
    except Exception as exc:  # the CRD schema should prevent this; never crash on it
        key = ObjectKey.of(obj)
        log.error("%s %s is malformed: %s", cls.__name__, key, "; ".join(error_messages(exc)))
        return None


async def _each(items: Iterable[T], fn: Callable[[T], Awaitable[None]]) -> None:
    """`fn` on every item, a few at a time; the first failure cancels the rest and raises."""
    limit = trio.Semaphore(WRITE_CONCURRENCY)

    async def one(item: T) -> None:
        async with limit:
            await fn(item)

    async with trio.open_nursery() as nursery:
        for item in items:
            nursery.start_soon(one, item)


class Reconcilers:
    def __init__(
        self,
        api: Client,
        caches: Caches,
        metrics: ControllerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.api = api
        self.c = caches
        self.metrics = metrics
        self.clock = clock  # wall clock: Pod timestamps are compared with it
        self.rand = rand
        self.retries: dict[ObjectKey, Mapping[str, Retry]] = {}
        # (kind, key) -> (resourceVersion, model): each version is structured once, not on
        # every reconcile that reads it (a Configuration's Services read all its Instances).
        self._models: dict[tuple[type, ObjectKey], tuple[str, Any]] = {}
        self.launched: dict[ObjectKey, str] = {}
        self.node_states: dict[str, NodeState] = {}
        self.dra: DraReconcilers | None = None  # DRA mode: brokers claim their device

    def read_instance(self, key: ObjectKey) -> Instance | None:
        return self._read(self.c.instances, key, Instance)

    def _read(self, store: Store, key: ObjectKey, cls: type[T]) -> T | None:
        obj = store.get(key)
        if obj is None:
            self._models.pop((cls, key), None)
            return None
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        hit = self._models.get((cls, key))
        if hit is not None and version and hit[0] == version:
            model: T = hit[1]
            return model
        made = _model(obj, cls)
        if made is not None and version:
            self._models[(cls, key)] = (version, made)
        return made

    # --- writes ----------------------------------------------------------------------------

    async def _create(self, res: Resource, body: JSON) -> None:
        meta = body["metadata"]
        try:
            await self.api.create(res, body, field_manager=FIELD_MANAGER)
            log.info("created %s %s/%s", res.kind, meta["namespace"], meta["name"])
        except AlreadyExists:
            pass
        self.metrics.writes.labels(kind=res.kind, verb="create").inc()

    async def _delete(self, res: Resource, d: Delete, resource_version: str | None = None) -> None:
        try:
            await self.api.delete(
                res,
                d.name,
                namespace=d.namespace,
                uid=d.uid or None,
                resource_version=resource_version,
                propagation_policy=d.propagation,
            )
            log.info("deleted %s %s/%s (%s)", res.kind, d.namespace, d.name, d.reason)
        except (NotFound, Conflict):
            pass  # gone already, or another object now has the name: not what we decided on
        self.metrics.writes.labels(kind=res.kind, verb="delete").inc()

    # --- brokers of one Instance -------------------------------------------------------------

    def _delay(self, creates: int) -> float:
        return BROKER_BACKOFF.delay(creates - 1, self.rand)

    async def instance(self, key: ObjectKey) -> Requeue | None:
        instance = self._read(self.c.instances, key, Instance)
        config = None
        if instance is not None:
            config_key = ObjectKey(key.namespace, instance.spec.configuration_name)
            config = self._read(self.c.configurations, config_key, Configuration)
        wanted = instance is not None and config is not None
        pods = broker_pods(config, instance) if config and instance else {}
        job = broker_job(config, instance) if config and instance else None
        if self.dra is not None and instance is not None:
            pods = {name: claim_broker_pod(body, instance) for name, body in pods.items()}
            job = None if job is None else claim_broker_job(job, instance)

        by_label = label_key(key.namespace, key.name)
        observed = [
            ObservedPod.of(p)
            for p in self.c.pods.select("instance", by_label).values()
            if owned_by_instance(p)
        ]
        now = self.clock()
        plan = plan_pods(pods, observed, self.retries.get(key, {}), now, self._delay)
        if plan.retries and instance is not None:
            self.retries[key] = plan.retries
        else:
            self.retries.pop(key, None)

        jobs = self.c.jobs.select("instance", by_label).values()
        job_plan = plan_job(job, jobs, self.launched.get(key))

        if self.dra is not None and instance is not None and (plan.create or job_plan.create):
            await self.dra.ensure_claim_template(instance)  # before the Pods that use it
        async with trio.open_nursery() as nursery:
            for d in plan.delete:
                nursery.start_soon(self._delete, PODS, d)
            for d in job_plan.delete:
                nursery.start_soon(self._delete, JOBS, d)
            for body in plan.create:
                nursery.start_soon(self._create, PODS, body)
            if job_plan.create is not None:
                nursery.start_soon(self._create, JOBS, job_plan.create)
        if job_plan.launched is not None and wanted:
            self.launched[key] = job_plan.launched
        else:
            self.launched.pop(key, None)
        if plan.wake_at is None:
            return None
        return Requeue(max(0.0, plan.wake_at - now))

    # --- Services of one Configuration -------------------------------------------------------

    async def services(self, key: ObjectKey) -> Requeue | None:
        config = self._read(self.c.configurations, key, Configuration)
        if config is None:
            return None  # its Services go with it (ownerReferences)
        instances = [
            i
            for i in (
                self._read(self.c.instances, k, Instance)
                for k in self.c.instances.keys_for("config", key)
            )
            if i is not None
        ]
        by_label = label_key(key.namespace, key.name)
        pods = [ObservedPod.of(p) for p in self.c.pods.select("config", by_label).values()]
        services = dict(self.c.services.select("config", by_label))
        for inst in instances:
            services.update(
                self.c.services.select("instance", label_key(key.namespace, inst.metadata.name))
            )
        plan = plan_services(config, instances, pods, services.values())

        async def apply(body: JSON) -> None:
            existing = self.c.services.get(ObjectKey.of(body))
            if up_to_date(existing, body):
                return
            await self.api.apply(
                SERVICES, fingerprinted(body), field_manager=FIELD_MANAGER, force=True
            )
            self.metrics.writes.labels(kind="Service", verb="apply").inc()
            log.info("applied Service %s", ObjectKey.of(body))

        async with trio.open_nursery() as nursery:
            for body in plan.apply:
                nursery.start_soon(apply, body)
            for d in plan.delete:
                nursery.start_soon(self._delete, SERVICES, d)
        return None

    # --- lost nodes --------------------------------------------------------------------------

    async def node(self, key: ObjectKey) -> Requeue | None:
        obj = self.c.nodes.get(key)
        ready = None if obj is None else node_ready(obj)
        previous = self.node_states.get(key.name)
        state, clean = node_transition(previous, ready)
        if clean:
            log.warning("node %s is lost: removing its entries", key.name)
            await self._release_node(key.name)
        if state is None:
            self.node_states.pop(key.name, None)
        else:
            self.node_states[key.name] = state
        return None

    async def _release_node(self, node: str) -> None:
        instances = [self._read(self.c.instances, k, Instance) for k in self.c.instances.snapshot()]
        configs = [
            self._read(self.c.configurations, k, Configuration)
            for k in self.c.configurations.snapshot()
        ]
        plan = plan_node_loss(
            node, (i for i in instances if i), (c for c in configs if c is not None)
        )
        await _each(plan.instances, self._release_instance)
        await _each(plan.statuses, self._release_status)

    async def _release_instance(self, release: InstanceRelease) -> None:
        """Apply one Instance's removals, then delete it if no node is left on it."""

        def again(obj: JSON) -> InstanceRelease | None:
            fresh = _model(obj, Instance)
            return None if fresh is None else release_instance(fresh, release.node)

        written = await self._guarded(INSTANCES, release, again)
        if written is None or not release.node_indexes:
            return
        after = _model(written, Instance)
        doomed = None if after is None else left_without_nodes(after)
        if doomed is not None:
            rv = str(written["metadata"].get("resourceVersion") or "") or None
            await self._delete(INSTANCES, doomed, resource_version=rv)

    async def _release_status(self, release: StatusRelease) -> None:
        def again(obj: JSON) -> StatusRelease | None:
            fresh = _model(obj, Configuration)
            return None if fresh is None else release_status(fresh, release.node)

        await self._guarded(CONFIGURATIONS, release, again, subresource="status")

    async def _guarded(
        self,
        res: Resource,
        release: R,
        again: Callable[[JSON], R | None],
        subresource: str | None = None,
    ) -> JSON | None:
        """Send `release`'s guarded JSON patch. A failed `test` means the object moved on:
        read it and send `again(fresh)` instead. Returns the object as last written (or read,
        when nothing was left to remove); None when it is gone or another object has its name
        (the uid test)."""
        ns, name = release.namespace, release.name
        current = release
        for _ in range(RELEASE_TRIES):
            try:
                written = await self.api.json_patch(
                    res, name, list(current.json_patch()), namespace=ns, subresource=subresource
                )
                self.metrics.writes.labels(kind=res.kind, verb="patch").inc()
                return written
            except NotFound:
                return None
            except Invalid:
                try:
                    fresh = await self.api.get(res, name, namespace=ns)
                except NotFound:
                    return None
                if fresh["metadata"].get("uid") != release.uid:
                    return None
                following = again(fresh)
                if following is None:
                    return fresh
                current = following
        raise RuntimeError(f"{res.kind} {ns}/{name} kept changing under node removal")
