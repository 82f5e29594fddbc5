"""The per-Configuration reconcile: discovery in, Instances and status out.

For each Configuration in the cluster this node runs one discovery task (keyed in a `TaskSet`
in the discovery nursery; when the handler, details or resolved properties change it is replaced,
the new one starting after the old one has closed its streams) and
reconciles on every discovery result and every change to the Configuration or its Instances:
the devices go into the node's view (the plugins need them), `instance_plan.plan` says which writes
to make, and this node's entry in the Configuration's status is rewritten when it changed. A
deleted Configuration stops its discovery and this node leaves its Instances (which the garbage
collector is deleting) so our finalizer never holds them up.

Everything is level-triggered and idempotent, so a reconcile cancelled half-way (shutdown, a
newer event) is simply done again: the queue guarantees one reconcile per key at a time.

Every part of the agent reads Configurations from one typed cache (`configuration_store`),
decoded once per version. Without the webhook a Configuration can be one the CRD accepts and the
model cannot read (its `spec` removed): an update like that must not look like a deletion (which
would stop discovery and delete the Instances of a Configuration someone only broke), so the
cache keeps the last version that decoded and the agent goes on serving it; one first seen that
way (no version to keep, e.g. after a restart) is not acted on at all, neither served nor
cleaned up after; both are logged once per version. Only a deletion stops its discovery.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import httpx
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent import instance_plan, tenants
from akri_trio.agent.discovery_streams import (
    DiscoveryRequest,
    DiscoveryResult,
    run_configuration_discovery,
)
from akri_trio.agent.events import AgentEvents
from akri_trio.agent.metrics import AgentMetrics
from akri_trio.agent.status import node_entry, node_entry_of
from akri_trio.agent.view import NodeView
from akri_trio.discovery.device_rules import DeviceRules
from akri_trio.discovery.properties import (
    UnsolvableProperty,
    referenced_objects,
    resolve,
)
from akri_trio.discovery.registry import OFFLINE_GRACE_S, Registry
from akri_trio.kube.client import Client
from akri_trio.kube.errors import ApiError, Conflict, Forbidden, Invalid, NotFound
from akri_trio.kube.queue import Requeue
from akri_trio.kube.store import Overlay, Store, Written, by_field, drop_managed_fields
from akri_trio.model.convert import structure
from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.model.resources import (
    CONFIG_MAPS,
    CONFIGURATIONS,
    INSTANCES,
    JSON,
    SECRETS,
    Configuration,
    Instance,
)
from akri_trio.runtime import TaskSet, run_all
from akri_trio.runtime.logs import fields

log = logging.getLogger(__name__)


def _about(namespace: str, instance: str) -> dict[str, str]:
    """The log fields of a line about one Instance."""
    return fields(instance=ObjectKey(namespace, instance))


# The Configuration store's index by name: which Configurations share a kubelet resource name.
BY_NAME = "name"
CONFIG_INDEXES = {BY_NAME: by_field(lambda obj: (obj.get("metadata") or {}).get("name"))}


def configuration_store() -> Store[Configuration]:
    """The agent's one cache of Configurations: decoded to the model, indexed by name, and
    keeping the last version that decoded through an update that does not (module docstring)."""
    return Store(
        decode=functools.partial(structure, cls=Configuration),
        transform=drop_managed_fields,
        indexes=CONFIG_INDEXES,
        keep_last_good=True,
    )


RETRY_UNSOLVABLE_S = 30.0
MAX_DEPART_ATTEMPTS = 5
# How long a (re)started discovery waits for its handlers to answer before "no list" counts as
# "no devices": upstream's grace for an unresponsive handler.
HANDLER_GRACE_S = OFFLINE_GRACE_S
# Parallel Instance writes per reconcile, so a big discovery lands fast: each is one HTTP/1.1
# connection, and 16 stays within the connections the client keeps alive (httpx's 20, with the
# two watches), so a burst opens no TLS connection it then throws away.
WRITE_CONCURRENCY = 16
# ... but one at a time on shared Instances: every node of the fleet writes those too, and the
# API server retries a write that lost the race on one object internally (each retry a full
# server-side apply), so k writes in flight on one object cost it about k*k/2 applies.
SHARED_WRITE_CONCURRENCY = 1


def _departs(op: instance_plan.Operation) -> bool:
    """Would `op` take this node off a live Instance (or delete it)?"""
    return isinstance(op, instance_plan.Leave) or (
        isinstance(op, instance_plan.Guarded) and op.delete
    )


def _iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.frozen
class ConfigurationLimits:
    """What one Configuration may make this node do (the agent's flags)."""

    max_capacity: int = MAX_CAPACITY
    devices: DeviceRules = attrs.field(factory=DeviceRules)


class OtherNamespace(UnsolvableProperty):
    """A discoveryProperty refers to a Secret or ConfigMap outside the Configuration's
    namespace: the agent reads none of it (the webhook refuses such a Configuration)."""

    reason = "OtherNamespace"


@attrs.define
class _Running:
    request: DiscoveryRequest
    result: DiscoveryResult | None = None
    started_at: float = attrs.field(factory=trio.current_time)


class ConfigurationReconciler:
    def __init__(
        self,
        api: Client,
        view: NodeView,
        registry: Registry,
        configs: Store[Configuration],
        discovery_nursery: trio.Nursery,
        enqueue: Callable[[ObjectKey], None],
        metrics: AgentMetrics | None = None,
        limits: ConfigurationLimits | None = None,
        *,
        events: AgentEvents | None = None,
        broker_info_problems: Callable[[ObjectKey], Sequence[str]] | None = None,
    ) -> None:
        self.events = events or AgentEvents()  # the default records nothing
        # What brokerInfo skipped, per Configuration (None: brokerInfo is off).
        self.broker_info_problems = broker_info_problems
        self.limits = limits or ConfigurationLimits()
        # Configurations refused on this node because another namespace owns their name ->
        # that owner, as last decided (a sibling whose decision changes is reconciled again).
        self.name_refused: dict[ObjectKey, ObjectKey] = {}
        self.collisions: dict[ObjectKey, tuple[str, ...]] = {}
        self.api = api
        self.view = view
        self.node = view.node
        self.registry = registry
        self.configs = configs
        self.discoveries = TaskSet[ObjectKey](discovery_nursery)
        self.enqueue = enqueue
        self.metrics = metrics
        self.running: dict[ObjectKey, _Running] = {}
        # The status entry this node last wrote per Configuration, until the watch brings the
        # version written. The watched copy lags our own writes, most under a fleet's load; an
        # entry already written is not written again because the watch has not caught up.
        self.status_written: Overlay[JSON] = Overlay(configs)

    # --- discovery tasks -----------------------------------------------------------------------

    async def _stop(self, key: ObjectKey) -> None:
        """Forget the Configuration's devices at once (its plugins stop now, not after the
        streams have closed; a late result of the old discovery is ignored), then stop its
        discovery and wait until its streams are closed."""
        self.running.pop(key, None)
        self.view.set_devices(key, {})
        await self.discoveries.drop(key)

    async def _discover(self, key: ObjectKey, running: _Running) -> None:
        async def send(result: DiscoveryResult) -> None:
            if self.running.get(key) is running:
                if self.metrics is not None:
                    self._observe(key, running, result)
                running.result = result
                self.enqueue(key)

        await run_configuration_discovery(
            self.registry, running.request, send, rules=self.limits.devices
        )

    def _observe(self, key: ObjectKey, running: _Running, result: DiscoveryResult) -> None:
        assert self.metrics is not None
        if running.result is None:
            self.metrics.first_response(key, trio.current_time() - running.started_at)
        self.metrics.discovery_result(running.request.handler, not result.problems)

    async def _ensure(self, key: ObjectKey, request: DiscoveryRequest) -> _Running:
        running = self.running.get(key)
        if running is not None and running.request == request:
            return running
        self.running.pop(key, None)  # its results are stale from here on
        running = _Running(request)
        # Once the old discovery has closed its streams (and only if this is not cancelled
        # meanwhile) the new one is started and recorded.
        await self.discoveries.start_soon(key, self._discover, key, running)
        self.running[key] = running
        return running

    async def _properties(self, config: Configuration) -> dict[str, bytes | None]:
        props = config.spec.discovery_handler.discovery_properties or ()
        secrets: dict[tuple[str, str], Mapping[str, Any]] = {}
        config_maps: dict[tuple[str, str], Mapping[str, Any]] = {}
        refs = referenced_objects(props)
        namespace = config.metadata.namespace
        elsewhere = sorted(
            f"{r.kind} {r.namespace}/{r.name}" for r in refs if r.namespace != namespace
        )
        if elsewhere:
            # Checked before any read: the agent's own rights must not lend a tenant another
            # namespace's credentials.
            names = [
                p.name
                for p in props
                if p.value is None
                and p.value_from is not None
                and any(
                    ref is not None and ref.namespace != namespace
                    for ref in (p.value_from.secret_key_ref, p.value_from.config_map_key_ref)
                )
            ]
            raise OtherNamespace(
                ", ".join(names),
                ", ".join(elsewhere),
                f"not in the Configuration's namespace {namespace!r}; a Configuration may only "
                "read Secrets and ConfigMaps of its own namespace (an omitted namespace is its "
                "own)",
            )
        for ref in refs:
            res, into = (SECRETS, secrets) if ref.kind == "Secret" else (CONFIG_MAPS, config_maps)
            try:
                into[(ref.namespace, ref.name)] = await self.api.get(
                    res, ref.name, namespace=ref.namespace
                )
            except NotFound:
                pass
            except ApiError as exc:
                raise UnsolvableProperty(
                    "*", f"{ref.kind} {ref.namespace}/{ref.name}", str(exc)
                ) from exc
        return resolve(props, config_maps, secrets)

    # --- the reconcile -------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, name = key.namespace, key.name
        config = self.configs.get(key)
        if config is None and self.configs.holds(key):
            return None  # first seen undecodable (logged by the store): not acted on
        if config is None or config.metadata.deletion_timestamp is not None:
            await self._stop(key)
            await self._leave_all(namespace, name)
            if self.metrics is not None:
                self.metrics.forget_configuration(key)
            self.events.forget(key)
            self.collisions.pop(key, None)
            self.status_written.pop(key)
            if config is None:
                # Its name may now belong to a Configuration of another namespace.
                self.name_refused.pop(key, None)
                for sibling in tenants.siblings(self._same_name(name), key):
                    self.enqueue(sibling)
            return None
        refused = self._refusal(key, config)
        if refused is not None:
            log.warning(
                "Configuration %s refused on this node: %s",
                key,
                refused[1],
                extra=fields(configuration=key),
            )
            await self._stop(key)
            await self._leave_all(namespace, name)
            await self._write_status(config, None, None, refused=refused)
            return None
        unsolvable: str | None = None
        try:
            properties = await self._properties(config)
        except UnsolvableProperty as exc:
            unsolvable = str(exc)
            reason = exc.reason if isinstance(exc, OtherNamespace) else "UnsolvableProperty"
            if isinstance(exc, OtherNamespace):
                log.warning(
                    "Configuration %s: %s", key, unsolvable, extra=fields(configuration=key)
                )
            await self._stop(key)
            await self._write_status(config, None, unsolvable, unsolvable_reason=reason)
            return None if isinstance(exc, OtherNamespace) else Requeue(RETRY_UNSOLVABLE_S)
        handler = config.spec.discovery_handler
        request = DiscoveryRequest(str(key), handler.name, handler.discovery_details, properties)
        running = await self._ensure(key, request)
        result = running.result
        if result is None:
            return None  # the discovery task enqueues us with its first result
        existing = self._instances_of(namespace, name)
        # One device per Instance name, the same one the plan writes into the Instance.
        assignment = instance_plan.assign(self.node, config, result.devices, existing)
        if assignment.collisions != self.collisions.get(key, ()):
            self.collisions[key] = assignment.collisions
            for line in assignment.collisions:
                log.warning("Configuration %s: %s", key, line, extra=fields(configuration=key))
        devices = {
            ObjectKey(namespace, instance): found.device
            for instance, found in assignment.devices.items()
        }
        self.view.set_devices(key, devices)
        self.events.devices(key, devices)
        ops = instance_plan.plan(self.node, config, result.devices, existing)
        requeue = None
        waited = trio.current_time() - running.started_at
        if (not result.handlers or result.pending) and waited < HANDLER_GRACE_S:
            # Right after a (re)start the handlers have not all answered (or re-registered)
            # yet: "no list" is not "no devices". Hold departures — they would delete Instances
            # and the claims of running Pods — until every handler answered or the grace ends.
            ops = [op for op in ops if not _departs(op)]
            requeue = Requeue(HANDLER_GRACE_S - waited)
        await self._execute_all(key, config.metadata.uid, namespace, ops)
        await self._write_status(
            config, result, unsolvable, refused_devices=[*result.refused, *assignment.collisions]
        )
        if self.metrics is not None:
            self._count_instances(key, namespace, name)
        return requeue

    def _same_name(self, name: str) -> dict[ObjectKey, str | None]:
        """The Configurations of `name` this node sees, by key, with their creationTimestamps:
        those that do not decode too (they own their name as if they did)."""
        try:
            same = self.configs.select(BY_NAME, name)
        except KeyError:  # a store built without the index
            same = {k: c for k, c in self.configs.snapshot().items() if k.name == name}
        created = {k: c.metadata.creation_timestamp for k, c in same.items()}
        for k, raw in self.configs.refused().items():
            if k.name == name and k not in created:
                created[k] = (raw.get("metadata") or {}).get("creationTimestamp")
        return created

    def _refusal(self, key: ObjectKey, config: Configuration) -> tuple[str, str] | None:
        """(reason, message) when this node must serve nothing of `config`."""
        same_name = self._same_name(key.name)
        owner = tenants.name_owner(same_name) or key
        # Siblings whose last decision this one changes are decided again.
        for sibling in tenants.siblings(same_name, key):
            if self.name_refused.get(sibling) != (owner if sibling != owner else None):
                self.enqueue(sibling)
        if owner != key:
            self.name_refused[key] = owner
            return tenants.REASON, tenants.refusal(key, owner)
        self.name_refused.pop(key, None)
        capacity = config.spec.capacity
        if capacity > self.limits.max_capacity:
            return (
                "CapacityTooLarge",
                f"capacity {capacity} is over this agent's maximum {self.limits.max_capacity} "
                "(--max-capacity): each slot is a kubelet device and a deviceUsage entry",
            )
        return None

    def _count_instances(self, key: ObjectKey, namespace: str, name: str) -> None:
        assert self.metrics is not None
        served = [
            i for i in self._instances_of(namespace, name).values() if self.node in i.spec.nodes
        ]
        for shared in (True, False):
            self.metrics.set_instance_count(
                key, shared, sum(i.spec.shared == shared for i in served)
            )

    def _instances_of(self, namespace: str, config: str) -> dict[str, Instance]:
        return {
            inst.metadata.name: inst
            for inst in self.view.instances()
            if inst.metadata.namespace == namespace and inst.spec.configuration_name == config
        }

    async def _execute_all(
        self, key: ObjectKey, uid: str, namespace: str, ops: list[instance_plan.Operation]
    ) -> None:
        """Run the plan's writes, a few at a time; stop as soon as the Configuration is gone or
        replaced (its reconcile then leaves what was made), so a deleted Configuration with
        a thousand devices does not go on getting Instances for tens of seconds."""
        limit = trio.Semaphore(WRITE_CONCURRENCY)
        shared_limit = trio.Semaphore(SHARED_WRITE_CONCURRENCY)

        def current() -> bool:
            config = self.configs.get(key)
            return (
                config is not None
                and config.metadata.uid == uid
                and config.metadata.deletion_timestamp is None
            )

        async def one(op: instance_plan.Operation) -> None:
            # the shared turn first: a write waiting for it holds none of the general slots
            async with shared_limit if self._shared(namespace, op) else _NO_LIMIT, limit:
                if current():
                    await self._execute(namespace, op)

        with self.view.writing():  # the plugins of what it makes start after it (NodeView)
            await run_all(
                [functools.partial(one, op) for op in instance_plan.in_node_order(ops, self.node)]
            )

    def _shared(self, namespace: str, op: instance_plan.Operation) -> bool:
        if isinstance(op, instance_plan.Apply):
            return bool(op.body["spec"].get("shared"))
        known = self.view.instance(ObjectKey(namespace, op.name))
        return known is not None and known.spec.shared

    async def _apply(self, namespace: str, body: JSON, *, force: bool = True) -> Instance:
        since = self.view.position
        try:
            written = await self.api.apply(
                INSTANCES, body, field_manager=self.node, force=force, namespace=namespace
            )
        except NotFound:
            self.view.drop_instance(ObjectKey(namespace, body["metadata"]["name"]), since=since)
            raise
        return self.view.put_instance(written, since=since)

    async def _execute(self, namespace: str, op: instance_plan.Operation) -> None:
        match op:
            case instance_plan.Apply(name, body):
                await self._apply(namespace, body)
                log.info("applied Instance %s/%s", namespace, name, extra=_about(namespace, name))
            case instance_plan.Leave() | instance_plan.Guarded():
                await self._depart(namespace, op)

    async def _depart(
        self, namespace: str, op: instance_plan.Leave | instance_plan.Guarded
    ) -> None:
        """Leave an Instance with one apply (see instances.Leave); the node whose leave empties
        it deletes it. Decide again from a fresh read when the leave is refused."""
        if isinstance(op, instance_plan.Leave):
            try:
                # Without force: a required field that changed since the read is a 409, not
                # our stale value written back.
                inst = await self._apply(namespace, op.body, force=False)
            except NotFound:
                return
            except (Conflict, Invalid):
                pass  # gone or replaced (the uid), or a required field changed: re-read
            else:
                if self.node not in inst.spec.nodes and self.node not in inst.metadata.finalizers:
                    log.info(
                        "left Instance %s/%s", namespace, op.name, extra=_about(namespace, op.name)
                    )
                    if not inst.spec.nodes and inst.metadata.deletion_timestamp is None:
                        await self._delete_unchanged(inst)
                    return
            await self._depart_guarded(namespace, op.name)
            return
        await self._depart_guarded(namespace, op.name, op)

    async def _depart_guarded(
        self, namespace: str, name: str, op: instance_plan.Guarded | None = None
    ) -> None:
        """The rare path (the last node, or a refused Leave): every write is a JSON patch that
        tests the read resourceVersion; on 409 or 422, re-read and decide again."""
        key = ObjectKey(namespace, name)
        for _ in range(MAX_DEPART_ATTEMPTS):
            if op is None:
                since = self.view.position
                try:
                    obj = await self.api.get(INSTANCES, name, namespace=namespace)
                except NotFound:
                    self.view.drop_instance(key, since=since)
                    return
                fresh = self.view.put_instance(obj, since=since)
                if self.node not in fresh.spec.nodes and self.node not in fresh.metadata.finalizers:
                    return
                op = instance_plan.guarded_departure(fresh, self.node)
            inst = op.read
            since = self.view.position
            try:
                if op.ops:
                    obj = await self.api.json_patch(
                        INSTANCES, name, op.ops, field_manager=self.node, namespace=namespace
                    )
                    inst = self.view.put_instance(obj, since=since)
            except NotFound:
                self.view.drop_instance(key, since=since)
                return
            except (Conflict, Invalid, Forbidden):
                # 403 too: a write to a namespace being deleted, where the Instance may be gone
                op = None
                continue
            if op.delete:
                await self._delete_unchanged(inst)
            else:
                log.info("left Instance %s/%s", namespace, name, extra=_about(namespace, name))
            return
        raise RuntimeError(f"Instance {namespace}/{name} kept changing while leaving it")

    async def _delete_unchanged(self, inst: Instance) -> None:
        """Delete an Instance no node serves any more. uid and resourceVersion are
        preconditions, so a node that joins meanwhile keeps it; a write that changed nothing
        of that (a node freeing its slots) only makes this re-read and try again."""
        for _ in range(MAX_DEPART_ATTEMPTS):
            meta = inst.metadata
            try:
                await self.api.delete(
                    INSTANCES,
                    meta.name,
                    namespace=meta.namespace,
                    uid=meta.uid,
                    resource_version=meta.resource_version,
                )
                log.info(
                    "deleted Instance %s/%s (no node left)",
                    meta.namespace,
                    meta.name,
                    extra=_about(meta.namespace, meta.name),
                )
                return
            except NotFound:
                return
            except Conflict:
                since = self.view.position
                try:
                    obj = await self.api.get(INSTANCES, meta.name, namespace=meta.namespace)
                except NotFound:
                    return
                fresh = self.view.put_instance(obj, since=since)
                if (
                    fresh.metadata.uid != meta.uid
                    or fresh.metadata.deletion_timestamp is not None
                    or set(fresh.spec.nodes) - {self.node}
                ):
                    return  # replaced, being deleted, or served again
                inst = fresh
        log.warning(
            "Instance %s/%s kept changing; not deleted", inst.metadata.namespace, inst.metadata.name
        )

    async def _leave_all(self, namespace: str, config: str) -> None:
        for inst in self._instances_of(namespace, config).values():
            if self.node in inst.spec.nodes or self.node in inst.metadata.finalizers:
                await self._depart(namespace, instance_plan.departure(inst, self.node))

    async def _write_status(
        self,
        config: Configuration,
        result: DiscoveryResult | None,
        unsolvable: str | None,
        *,
        unsolvable_reason: str = "UnsolvableProperty",
        refused_devices: list[str] | None = None,
        refused: tuple[str, str] | None = None,
    ) -> None:
        namespace, name = config.metadata.namespace, config.metadata.name
        previous = node_entry_of(config.status, self.node)
        written = self.status_written.get(config.metadata.key)
        if written is not None and written.uid == config.metadata.uid:
            previous = written.value  # the watch has not brought our last write yet
        served = sum(
            1
            for inst in self._instances_of(namespace, name).values()
            if self.node in inst.spec.nodes
        )
        problems = list(result.problems) if result else []
        invalid = list(result.invalid) if result else []
        wall_minus_trio = time.time() - trio.current_time()
        entry = node_entry(
            node=self.node,
            handler=config.spec.discovery_handler.name,
            handlers=dict(result.handlers) if result else {},
            invalid_details=invalid,
            unsolvable=unsolvable,
            other_problems=[p for p in problems if p not in invalid],
            instances=served,
            previous=previous,
            now=_iso(time.time()),
            to_wall=lambda t: _iso(t + wall_minus_trio),
            unsolvable_reason=unsolvable_reason,
            refused_devices=refused_devices or [],
            refused=refused,
            handler_problems=result.handler_problems if result else (),
            broker_info_problems=(
                None
                if self.broker_info_problems is None
                else self.broker_info_problems(config.metadata.key)
            ),
        )
        if previous == entry:
            return
        self.events.status_changed(config.metadata.key, previous, entry)
        body = {
            "apiVersion": config.api_version,
            "kind": config.kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": {"nodes": [entry]},
        }
        since = self.status_written.position
        try:
            answer = await self.api.apply(
                CONFIGURATIONS,
                body,
                field_manager=f"{self.node}-status",
                force=True,
                namespace=namespace,
                subresource="status",
            )
            version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
            self.status_written.put(
                config.metadata.key, Written(config.metadata.uid, version, entry), since=since
            )
        except NotFound:
            pass
        except (ApiError, httpx.HTTPError) as exc:
            log.warning(
                "could not write status of Configuration %s/%s: %s",
                namespace,
                name,
                exc,
                extra=fields(configuration=ObjectKey(namespace, name)),
            )


_NO_LIMIT = contextlib.nullcontext()
