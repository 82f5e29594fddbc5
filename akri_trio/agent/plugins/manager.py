"""Which device plugins run on this node, kept in step with the node's view.

A plugin is desired for an Instance when this node is in its `nodes`, it is not being deleted,
and this node's discovery currently reaches the device (without the device we could not answer
Allocate with its mounts and device nodes). A configuration-level plugin is desired while at
least one of its Instances has one. `desired_plugins` decides that as a pure function; the
manager runs each plugin as a task of a `TaskSet` keyed by plugin and drops it when it stops being
desired (its socket is removed on the way out, and the kubelet sees the resource go away). Two
plugins never share a kubelet resource (`one_per_resource`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import WorkloadDirs
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.plugins.kubelet import KubeletWatch, serve_registered
from akri_trio.agent.plugins.service import (
    AllocateObserver,
    Behaviour,
    ConfigurationBehaviour,
    DevicePluginService,
    InstanceBehaviour,
    RefusalObserver,
)
from akri_trio.agent.view import NodeView
from akri_trio.model import naming
from akri_trio.model.resources import Instance
from akri_trio.rpc.uds import DEFAULT_LIMITS, ServerLimits
from akri_trio.runtime import TaskSet

log = logging.getLogger(__name__)

# How long the manager holds back the plugins it would start while this node's Instance writes
# are in flight (agent/view.py says why): a batch of 200 takes well under a second, one of a
# thousand on a loaded board a few; a batch waiting on an unreachable API server must not keep
# the kubelet from the devices already written.
START_HOLD_S = 5.0
# While it holds starts back, the manager looks again (for plugins to stop) at most this often:
# a batch's answers tick membership one by one, and a pass over 200 Instances costs ~0.5 ms.
HELD_LOOK_S = 0.025


@attrs.frozen
class InstancePlugin:
    key: ObjectKey  # the Instance's
    config: str  # its Configuration's name


@attrs.frozen
class ConfigPlugin:
    namespace: str
    config: str


Plugin = InstancePlugin | ConfigPlugin


def desired_plugins(
    node: str, instances: Iterable[Instance], has_device: Callable[[ObjectKey], bool]
) -> set[Plugin]:
    out: set[Plugin] = set()
    for inst in instances:
        key = inst.metadata.key
        if node in inst.spec.nodes and inst.metadata.deletion_timestamp is None and has_device(key):
            out.add(InstancePlugin(key, inst.spec.configuration_name))
            out.add(ConfigPlugin(inst.metadata.namespace, inst.spec.configuration_name))
    return out


def resource_of(plugin: Plugin) -> str:
    """The kubelet resource a plugin registers: one namespace for every Configuration's."""
    name = plugin.key.name if isinstance(plugin, InstancePlugin) else plugin.config
    return naming.resource_name(name)


def one_per_resource(
    desired: set[Plugin], running: Iterable[Plugin]
) -> tuple[set[Plugin], list[str]]:
    """At most one plugin per kubelet resource, and a line for each one left out.

    Names can meet at the kubelet across namespaces or kinds (a Configuration named like
    another's Instance, `cam-8120fe`): the kubelet keeps one registration per resource, so
    two plugins would silently serve each other's Pods. The one already running keeps it,
    else the first in (namespace, kind) order."""
    running_now = set(running)
    by_resource: dict[str, list[Plugin]] = {}
    for plugin in desired:
        by_resource.setdefault(resource_of(plugin), []).append(plugin)
    kept: set[Plugin] = set()
    dropped: list[str] = []
    for resource, plugins in sorted(by_resource.items()):
        plugins.sort(key=lambda p: (p not in running_now, _start_order(p)))
        kept.add(plugins[0])
        for other in plugins[1:]:
            dropped.append(f"{resource}: {other} not served, {plugins[0]} has that resource")
    return kept, dropped


class PluginManager:
    def __init__(
        self,
        view: NodeView,
        claims: Claims,
        watch: KubeletWatch,
        observe: AllocateObserver | None = None,
        on_registered: Callable[[], None] | None = None,
        on_refused: RefusalObserver | None = None,
        workloads: WorkloadDirs | None = None,
        grpc: ServerLimits = DEFAULT_LIMITS,
    ) -> None:
        self.workloads = workloads  # brokerInfo directories, when the agent has them
        self.grpc = grpc  # what each plugin's socket allows a connection
        self.on_registered = on_registered
        self.on_refused = on_refused
        self.view = view
        self.claims = claims
        self.watch = watch
        self.observe = observe
        self._tasks: TaskSet[Plugin] | None = None  # while `run` runs
        self.registered: set[Plugin] = set()
        self._dropped: list[str] = []

    def _desired(self) -> set[Plugin]:
        desired = desired_plugins(
            self.view.node, self.view.instances(), lambda k: self.view.device(k) is not None
        )
        kept, dropped = one_per_resource(desired, self.running)
        if dropped != self._dropped:
            for line in dropped:
                log.warning("kubelet resource collision: %s", line)
            self._dropped = dropped
        return kept

    def _members(self, plugin: ConfigPlugin) -> Callable[[], list[ObjectKey]]:
        def members() -> list[ObjectKey]:
            # Sorted by plain tuples: ObjectKey's generated ordering builds two tuples per
            # comparison, and this runs on every change of any member (n log n each time).
            return sorted(
                (
                    p.key
                    for p in self.running
                    if isinstance(p, InstancePlugin)
                    and p.config == plugin.config
                    and p.key.namespace == plugin.namespace
                ),
                key=lambda k: (k.namespace, k.name),
            )

        return members

    def _behaviour(self, plugin: Plugin) -> Behaviour:
        if isinstance(plugin, InstancePlugin):
            return InstanceBehaviour(plugin.key, self.view, self.claims, self.workloads)
        return ConfigurationBehaviour(
            plugin.namespace,
            plugin.config,
            self.view,
            self.claims,
            self._members(plugin),
            self.workloads,
        )

    @property
    def running(self) -> frozenset[Plugin]:
        """The plugins running now (a plugin being stopped is no longer one)."""
        return frozenset(() if self._tasks is None else self._tasks)

    async def _run_plugin(self, plugin: Plugin, *, task_status: trio.TaskStatus[Path]) -> None:
        behaviour = self._behaviour(plugin)
        service = DevicePluginService(behaviour, self.view, self.observe, self.on_refused)
        name = behaviour.resource.split("/", 1)[1]
        try:
            await serve_registered(
                service,
                name,
                behaviour.resource,
                service.options(),
                self.watch,
                on_registered=lambda: self._registered(plugin),
                limits=self.grpc,
                task_status=task_status,
            )
        finally:
            self.registered.discard(plugin)

    def _registered(self, plugin: Plugin) -> None:
        self.registered.add(plugin)
        if self.on_registered is not None:
            self.on_registered()

    @staticmethod
    def _config_key(plugin: Plugin) -> ObjectKey:
        if isinstance(plugin, ConfigPlugin):
            return ObjectKey(plugin.namespace, plugin.config)
        return ObjectKey(plugin.key.namespace, plugin.config)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            tasks = self._tasks = TaskSet[Plugin](nursery)
            started = False
            held_until: float | None = None  # while starts wait for the node's writes
            while True:
                version = self.view.membership.version
                desired = self._desired()
                stop = [plugin for plugin in tasks if plugin not in desired]
                for plugin in stop:
                    log.info("stopping plugin %s", plugin)
                await tasks.drop(*stop)  # all at once; each removes its socket first
                touched = {self._config_key(plugin) for plugin in stop}
                starts = desired.difference(tasks)
                held_until = self._hold(held_until, bool(starts) and started)
                if held_until is None:
                    # Instance plugins first: a configuration plugin's members are running ones.
                    for plugin in sorted(starts, key=_start_order):
                        log.info("starting plugin %s", plugin)
                        await tasks.start(plugin, self._run_plugin, plugin)
                        touched.add(self._config_key(plugin))
                if touched:  # a configuration plugin's members changed: it must look again
                    self.view.touch(*touched)
                if not started:
                    task_status.started()
                    started = True
                # Membership also ticks when the node's writes settle (NodeView.writing), so
                # held starts and any stop wake this one wait.
                with trio.move_on_at(math.inf if held_until is None else held_until):
                    await self.view.membership.wait_past(version)
                    if held_until is not None and self.view.batches_writing:
                        await trio.sleep(HELD_LOOK_S)

    def _hold(self, held_until: float | None, would_start: bool) -> float | None:
        """Until when the plugins to start wait for this node's batch of Instance writes
        (NodeView.writing), None to start them now: at most START_HOLD_S, so a batch that
        hangs on the API server keeps no plugin from the kubelet longer. Stops do not wait for
        the batch (`run` looks again within HELD_LOOK_S)."""
        if not (would_start and self.view.batches_writing):
            return None
        now = trio.current_time()
        if held_until is None:
            return now + START_HOLD_S
        return held_until if now < held_until else None


def _start_order(plugin: Plugin) -> tuple[int, ObjectKey]:
    if isinstance(plugin, InstancePlugin):
        return 0, plugin.key
    return 1, ObjectKey(plugin.namespace, plugin.config)
