"""The controller's reconcile functions: read the caches, ask the pure cores, write the result.

Three reconcilers, each keyed by the object it is about:

- `instance(key)`: the broker Pods (lifecycle.plan_pods, with the per-broker Retry state kept
  here) and the Job (lifecycle.plan_job) of one Instance;
- `services(key)`: the instance and configuration Services of one Configuration
  (services.plan_services), applied only when their fingerprint differs;
- `node(key)`: a Node's Ready transitions (nodeloss.node_transition); on a loss, the guarded
  JSON patches of nodeloss.plan_node_loss, then the Instances left with no node are deleted.
  A serving node first seen NotReady within its grace is requeued for when the grace ends.
  `lost_while_away()` names the nodes that Instances or statuses still list but that no longer
  exist, for run.py to reconcile once the caches are first synced. The NodeLost Events say what
  the patch that was applied removed (a re-plan after a failed `test` may differ).

What each write did is also told as an Event on the Instance or Configuration concerned
(controller/events.py decides which; the recorder never blocks), and log lines carry the
`configuration`, `instance` and `node` they are about as fields.

In DRA mode (`self.dra`, dra/reconcilers.py) `instance` also makes the Instance's broker claim
template before the Pods that use it, and the brokers claim their device instead of asking for
`akri.sh/<instance>`.

Reads come only from the caches (no GET on the steady path), so a reconcile with nothing to
change makes no request. Writes are idempotent: AlreadyExists on a create and NotFound or a
failed uid precondition on a delete mean someone (a previous run of ours, the garbage
collector) got there first. The writes of one reconcile run as one batch (runtime.run_all):
every write runs to its end, so a failure never abandons its siblings half-applied; then the
reconcile raises what failed and the queue retries it with backoff.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Final, Protocol, TypeVar

import attrs

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
    freed_resources,
    label_value,
    left_without_nodes,
    node_ready,
    node_transition,
    plan_job,
    plan_node_loss,
    plan_pods,
    plan_services,
    ready_changed_at,
    release_instance,
    release_status,
    served_nodes,
    shared_claim_holders,
    slot_holders,
    up_to_date,
)
from akri_trio.controller import events as ev
from akri_trio.controller.dra.plan import claim_broker_job, claim_broker_pod
from akri_trio.controller.dra.reconcilers import DraReconcilers
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.dra import RESOURCE_CLAIMS
from akri_trio.kube import (
    JSON,
    AlreadyExists,
    ApiError,
    Backoff,
    Client,
    Conflict,
    EventRecorder,
    Invalid,
    NotFound,
    ObjectKey,
    Requeue,
    Resource,
    Store,
)
from akri_trio.model import naming
from akri_trio.model.convert import error_messages, structure
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES, Configuration, Instance
from akri_trio.runtime import run_all
from akri_trio.runtime.logs import fields

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
# The default --node-lost-grace: longer than a kubelet restart during a node upgrade.
NODE_LOST_GRACE_S: Final = 300.0

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
    """The stores the reconcilers read (run.py keeps them filled): Instances and
    Configurations decoded to the model on the way in, the rest slimmed JSON."""

    instances: Store[Instance]
    configurations: Store[Configuration]
    pods: Store
    jobs: Store
    services: Store
    nodes: Store


def label_key(namespace: str, name: str) -> ObjectKey:
    """The index key of objects labelled with `name` (as names.label_value writes it)."""
    return ObjectKey(namespace, label_value(name))


def about(obj: Mapping[str, Any]) -> dict[str, str]:
    """Log fields for an object the controller writes, from its akri labels."""
    meta = obj.get("metadata") or {}
    ns, labels = meta.get("namespace") or "", meta.get("labels") or {}
    config = labels.get(naming.LABEL_CONFIGURATION)
    instance = labels.get(naming.LABEL_INSTANCE)
    return fields(
        configuration=None if config is None else ObjectKey(ns, config),
        instance=None if instance is None else ObjectKey(ns, instance),
        node=labels.get(naming.LABEL_TARGET_NODE),
    )


def about_owner(on: Mapping[str, Any] | None) -> dict[str, str]:
    """Log fields naming the Instance or Configuration an Event subject (events.py) is."""
    if on is None or on.get("kind") not in ("Instance", "Configuration"):
        return {}
    meta = on.get("metadata") or {}
    key = ObjectKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    return fields(**{str(on["kind"]).lower(): key})


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


class Reconcilers:
    def __init__(
        self,
        api: Client,
        caches: Caches,
        metrics: ControllerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        recorder: EventRecorder | None = None,
        node_lost_grace: float = NODE_LOST_GRACE_S,
        namespace: str | None = None,
        dra: DraReconcilers | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace  # the one the controller watches; None: all
        self.recorder = recorder
        self.c = caches
        self.metrics = metrics
        self.clock = clock  # wall clock: Pod timestamps are compared with it
        self.rand = rand
        self.retries: dict[ObjectKey, Mapping[str, Retry]] = {}
        self.launched: dict[ObjectKey, str] = {}
        self.node_states: dict[str, NodeState] = {}
        # A NotReady node found serving at start: cleaned only after this many seconds NotReady.
        self.node_lost_grace = node_lost_grace
        self.not_ready_seen: dict[str, float] = {}  # node -> when first seen so (wall clock)
        self.dra = dra  # DRA mode: brokers claim their device

    def record(self, event: ev.Event | None) -> None:
        if self.recorder is not None and event is not None:
            self.recorder.record(event.obj, event.type, event.reason, event.message)

    # --- writes ----------------------------------------------------------------------------

    async def _create(self, res: Resource, body: JSON) -> bool:
        """Create `body`; False when its name is taken already. A refusal is an Event on the
        owner, then raises (the queue retries with backoff)."""
        meta = body["metadata"]
        try:
            await self.api.create(res, body, field_manager=FIELD_MANAGER)
            log.info(
                "created %s %s/%s", res.kind, meta["namespace"], meta["name"], extra=about(body)
            )
            return True
        except AlreadyExists:
            return False
        except ApiError as exc:
            log.warning(
                "could not create %s %s/%s: %s",
                res.kind,
                meta["namespace"],
                meta["name"],
                exc,
                extra=about(body),
            )
            self.record(ev.refused(body, exc.message or str(exc)))
            raise
        finally:
            self.metrics.writes.labels(kind=res.kind, verb="create").inc()

    async def _delete(
        self,
        res: Resource,
        d: Delete,
        resource_version: str | None = None,
        on: JSON | None = None,
    ) -> bool:
        """Delete what `d` names; False when it was gone (or replaced) already. `on`: the
        owner to tell with an Event."""
        try:
            await self.api.delete(
                res,
                d.name,
                namespace=d.namespace,
                uid=d.uid or None,
                resource_version=resource_version,
                propagation_policy=d.propagation,
                grace_period_seconds=d.grace_period_seconds,
            )
            log.info(
                "deleted %s %s/%s (%s)",
                res.kind,
                d.namespace,
                d.name,
                d.reason,
                extra=about_owner(on),
            )
        except (NotFound, Conflict):
            return False  # gone already, or another object has the name: not what we decided on
        finally:
            self.metrics.writes.labels(kind=res.kind, verb="delete").inc()
        self.record(ev.deleted(res.kind, d, on))
        return True

    # --- brokers of one Instance -------------------------------------------------------------

    def _delay(self, creates: int) -> float:
        return BROKER_BACKOFF.delay(creates - 1, self.rand)

    async def instance(self, key: ObjectKey) -> Requeue | None:
        instance = self.c.instances.get(key)
        config = None
        if instance is not None:
            config_key = ObjectKey(key.namespace, instance.spec.configuration_name)
            config = self.c.configurations.get(config_key)
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

        on = None if instance is None else ev.ref(instance)

        async def create(res: Resource, body: JSON) -> None:
            if await self._create(res, body):
                self.record(ev.created(body, plan.retries.get(body["metadata"]["name"])))

        await run_all(
            [
                *(partial(self._delete, PODS, d, None, on) for d in plan.delete),
                *(partial(self._delete, JOBS, d, None, on) for d in job_plan.delete),
                *(partial(create, PODS, body) for body in plan.create),
                *([] if job_plan.create is None else [partial(create, JOBS, job_plan.create)]),
            ]
        )
        if job_plan.launched is not None and wanted:
            self.launched[key] = job_plan.launched
        else:
            self.launched.pop(key, None)
        if plan.wake_at is None:
            return None
        return Requeue(max(0.0, plan.wake_at - now))

    # --- Services of one Configuration -------------------------------------------------------

    async def services(self, key: ObjectKey) -> Requeue | None:
        config = self.c.configurations.get(key)
        if config is None:
            return None  # its Services go with it (ownerReferences)
        instances = list(self.c.instances.select("config", key).values())
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
            try:
                await self.api.apply(
                    SERVICES, fingerprinted(body), field_manager=FIELD_MANAGER, force=True
                )
            except ApiError as exc:
                if existing is None:
                    self.record(ev.refused(body, exc.message or str(exc)))
                raise
            finally:
                self.metrics.writes.labels(kind="Service", verb="apply").inc()
            log.info("applied Service %s", ObjectKey.of(body), extra=about(body))
            if existing is None:
                self.record(ev.created(body))

        def delete(d: Delete) -> Callable[[], Awaitable[object]]:
            cached = self.c.services.get(ObjectKey(d.namespace, d.name))
            owner = None if cached is None else ev.owner(cached)
            return partial(self._delete, SERVICES, d, None, owner)

        await run_all([*(partial(apply, body) for body in plan.apply), *map(delete, plan.delete)])
        return None

    # --- lost nodes --------------------------------------------------------------------------

    def _instances(self) -> list[Instance]:
        return list(self.c.instances.snapshot().values())

    def _configurations(self) -> list[Configuration]:
        return list(self.c.configurations.snapshot().values())

    def lost_while_away(self) -> list[ObjectKey]:
        """Nodes that Instances or Configuration statuses name but that the node cache does
        not hold: deleted while no controller (or no leader) watched. Read once the caches
        are synced; `node` confirms each with a GET before cleaning."""
        named = served_nodes(self._instances(), self._configurations())
        return [
            ObjectKey("", n) for n in sorted(named) if self.c.nodes.get(ObjectKey("", n)) is None
        ]

    async def _exists(self, node: str) -> bool:
        try:
            await self.api.get(NODES, node)
        except NotFound:
            return False
        return True

    async def node(self, key: ObjectKey) -> Requeue | None:
        obj = self.c.nodes.get(key)
        previous = self.node_states.get(key.name)
        if obj is None and previous is None and await self._exists(key.name):
            return None  # not in the cache yet: its watch event will come
        ready = None if obj is None else node_ready(obj)
        serving = (
            previous is None
            and ready is False
            and key.name in served_nodes(self._instances(), self._configurations())
        )
        not_ready_for = math.inf
        if serving:
            now = self.clock()
            seen = self.not_ready_seen.setdefault(key.name, now)
            changed = None if obj is None else ready_changed_at(obj)
            not_ready_for = now - min(seen, now if changed is None else changed)
        transition = node_transition(
            previous,
            ready,
            serving=serving,
            not_ready_for=not_ready_for,
            grace=self.node_lost_grace,
        )
        state, clean = transition.state, transition.clean
        if transition.recheck_after is not None:
            log.info(
                "node %s serves Instances and is NotReady: removing its entries in %.0f s "
                "unless it is Ready again",
                key.name,
                transition.recheck_after,
                extra=fields(node=key.name),
            )
            return Requeue(transition.recheck_after)
        self.not_ready_seen.pop(key.name, None)
        if clean:
            if obj is None:
                why = "deleted" if previous is not None else "deleted while no controller ran"
            elif previous is None:
                why = "NotReady when this controller started"
            else:
                why = "NotReady"
            log.warning(
                "node %s is lost (%s): removing its entries",
                key.name,
                why,
                extra=fields(node=key.name),
            )
            await self._release_node(key.name, why)
        if state is None:
            self.node_states.pop(key.name, None)
        else:
            self.node_states[key.name] = state
        return None

    async def _release_node(self, node: str, why: str) -> None:
        plan = plan_node_loss(node, self._instances(), self._configurations())

        async def instance(release: InstanceRelease) -> None:
            await self._release_instance(release, why)

        async def status(release: StatusRelease) -> None:
            await self._release_status(release, why)

        await run_all((partial(instance, r) for r in plan.instances), limit=WRITE_CONCURRENCY)
        await run_all((partial(status, r) for r in plan.statuses), limit=WRITE_CONCURRENCY)
        if self.dra is not None:
            await self._release_shared_claims(node)
        else:
            await self._release_slot_holders(node, freed_resources(plan.instances))

    async def _release_slot_holders(self, node: str, resources: set[str]) -> None:
        """Device-plugin mode: end the lost node's Pods that hold the slots just freed, so no
        device has two users once another node's Pod takes the slot (nodeloss.py says why)."""
        if not resources:
            return
        pods = await self.api.list(
            PODS, namespace=self.namespace, field_selector=f"spec.nodeName={node}"
        )
        deletes = slot_holders(node, pods.items, resources)
        await run_all((partial(self._delete, PODS, d) for d in deletes), limit=WRITE_CONCURRENCY)

    async def _release_shared_claims(self, node: str) -> None:
        """DRA mode: end the lost node's Pods that hold a shared device, so the scheduler can
        give its capacity to the nodes that remain (nodeloss.py says why)."""
        pods = await self.api.list(
            PODS, namespace=self.namespace, field_selector=f"spec.nodeName={node}"
        )
        if not pods.items:
            return
        claims = await self.api.list(RESOURCE_CLAIMS, namespace=self.namespace)
        deletes = shared_claim_holders(node, pods.items, claims.items)
        await run_all((partial(self._delete, PODS, d) for d in deletes), limit=WRITE_CONCURRENCY)

    def _configuration_of(self, namespace: str, instance: str) -> JSON | None:
        inst = self.c.instances.get(ObjectKey(namespace, instance))
        if inst is None:
            return None
        key = ObjectKey(namespace, inst.spec.configuration_name)
        config = self.c.configurations.get(key)
        return None if config is None else ev.ref(config)

    async def _release_instance(self, release: InstanceRelease, why: str = "lost") -> None:
        """Apply one Instance's removals, then delete it if no node is left on it."""
        configuration = self._configuration_of(release.namespace, release.name)

        def again(obj: JSON) -> InstanceRelease | None:
            fresh = _model(obj, Instance)
            return None if fresh is None else release_instance(fresh, release.node)

        outcome = await self._guarded(INSTANCES, release, again)
        if outcome is None:
            return
        written, sent = outcome
        if sent is not None:  # told from what was removed, which a re-plan may have changed
            key = ObjectKey(release.namespace, release.name)
            log.info(
                "removed lost node %s from Instance %s",
                release.node,
                key,
                extra=fields(instance=key, node=release.node),
            )
            subject = ev.subject(
                "akri.sh/v0", "Instance", release.namespace, release.name, release.uid
            )
            self.record(
                ev.node_lost(release.node, why, subject, sent.slots, bool(sent.node_indexes))
            )
        if not release.node_indexes:
            return
        after = _model(written, Instance)
        doomed = None if after is None else left_without_nodes(after)
        if doomed is not None:
            rv = str(written["metadata"].get("resourceVersion") or "") or None
            if await self._delete(INSTANCES, doomed, resource_version=rv) and configuration:
                self.record(ev.instance_deleted(release.node, why, configuration, release.name))

    async def _release_status(self, release: StatusRelease, why: str = "lost") -> None:
        def again(obj: JSON) -> StatusRelease | None:
            fresh = _model(obj, Configuration)
            return None if fresh is None else release_status(fresh, release.node)

        outcome = await self._guarded(CONFIGURATIONS, release, again, subresource="status")
        if outcome is not None and outcome[1] is not None:
            subject = ev.subject(
                "akri.sh/v0", "Configuration", release.namespace, release.name, release.uid
            )
            self.record(ev.status_released(release.node, why, subject))

    async def _guarded(
        self,
        res: Resource,
        release: R,
        again: Callable[[JSON], R | None],
        subresource: str | None = None,
    ) -> tuple[JSON, R | None] | None:
        """Send `release`'s guarded JSON patch. A failed `test` means the object moved on:
        read it and send `again(fresh)` instead. Returns the object as last written and the
        release that wrote it (or the object as read and None, when nothing was left to
        remove); None when it is gone or another object has its name (the uid test)."""
        ns, name = release.namespace, release.name
        current = release
        for _ in range(RELEASE_TRIES):
            try:
                written = await self.api.json_patch(
                    res, name, list(current.json_patch()), namespace=ns, subresource=subresource
                )
                self.metrics.writes.labels(kind=res.kind, verb="patch").inc()
                return written, current
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
                    return fresh, None
                current = following
        raise RuntimeError(f"{res.kind} {ns}/{name} kept changing under node removal")
