"""Which device plugins run on this node, kept in step with the node's view.

A plugin is desired for an Instance when this node is in its `nodes`, it is not being deleted,
and this node's discovery currently reaches the device (without the device we could not answer
Allocate with its mounts and device nodes). A configuration-level plugin is desired while at
least one of its Instances has one. `desired_plugins` decides that as a pure function; the
manager starts each plugin in its own cancel scope under the plugin nursery and cancels it when
it stops being desired (its socket is removed on the way out, and the kubelet sees the resource
go away).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.plugins.kubelet import KubeletWatch, serve_registered
from akri_trio.agent.plugins.service import (
    AllocateObserver,
    Behaviour,
    ConfigurationBehaviour,
    DevicePluginService,
    InstanceBehaviour,
    RefusalObserver,
    WorkloadMounts,
)
from akri_trio.agent.view import NodeView
from akri_trio.model.resources import Instance

log = logging.getLogger(__name__)


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


class PluginManager:
    workloads: WorkloadMounts | None = None  # brokerInfo directories, when the agent has them

    def __init__(
        self,
        view: NodeView,
        claims: Claims,
        watch: KubeletWatch,
        observe: AllocateObserver | None = None,
        on_registered: Callable[[], None] | None = None,
        on_refused: RefusalObserver | None = None,
    ) -> None:
        self.on_registered = on_registered
        self.on_refused = on_refused
        self.view = view
        self.claims = claims
        self.watch = watch
        self.observe = observe
        self.running: dict[Plugin, trio.CancelScope] = {}
        self.registered: set[Plugin] = set()

    def _desired(self) -> set[Plugin]:
        return desired_plugins(
            self.view.node, self.view.instances(), lambda k: self.view.device(k) is not None
        )

    def _members(self, plugin: ConfigPlugin) -> Callable[[], list[ObjectKey]]:
        def members() -> list[ObjectKey]:
            return sorted(
                p.key
                for p in self.running
                if isinstance(p, InstancePlugin)
                and p.config == plugin.config
                and p.key.namespace == plugin.namespace
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

    async def _run_plugin(
        self, plugin: Plugin, scope: trio.CancelScope, *, task_status: trio.TaskStatus[Path]
    ) -> None:
        behaviour = self._behaviour(plugin)
        service = DevicePluginService(behaviour, self.view, self.observe, self.on_refused)
        name = behaviour.resource.split("/", 1)[1]
        with scope:
            try:
                await serve_registered(
                    service,
                    name,
                    behaviour.resource,
                    service.options(),
                    self.watch,
                    on_registered=lambda: self._registered(plugin),
                    task_status=task_status,
                )
            finally:
                self.registered.discard(plugin)
                if self.running.get(plugin) is scope:
                    del self.running[plugin]

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
            started = False
            version = -1
            while True:
                version = self.view.membership.version
                desired = self._desired()
                touched: set[ObjectKey] = set()
                for plugin in list(self.running):
                    if plugin not in desired:
                        log.info("stopping plugin %s", plugin)
                        self.running.pop(plugin).cancel()
                        touched.add(self._config_key(plugin))
                # Instance plugins first: a configuration plugin's members are running ones.
                for plugin in sorted(desired - self.running.keys(), key=_start_order):
                    scope = trio.CancelScope()
                    self.running[plugin] = scope
                    log.info("starting plugin %s", plugin)
                    await nursery.start(self._run_plugin, plugin, scope)
                    touched.add(self._config_key(plugin))
                if touched:  # a configuration plugin's members changed: it must look again
                    self.view.touch(*touched)
                if not started:
                    task_status.started()
                    started = True
                await self.view.membership.wait_past(version)


def _start_order(plugin: Plugin) -> tuple[int, ObjectKey]:
    if isinstance(plugin, InstancePlugin):
        return 0, plugin.key
    return 1, ObjectKey(plugin.namespace, plugin.config)
