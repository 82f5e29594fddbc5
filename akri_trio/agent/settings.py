"""The agent's settings: what `akri-trio agent`'s flags (agent/cli.py) decide, and the
handlers they embed in the agent's process."""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from akri_trio.agent.brokerinfo import DEFAULT_PERIOD_S as BROKER_INFO_PERIOD_S
from akri_trio.agent.brokerinfo import Limits
from akri_trio.agent.configurations import ConfigurationLimits
from akri_trio.agent.plugins.kubelet import POLL_S as KUBELET_POLL_S
from akri_trio.agent.reclaimer import DEFAULT_PERIOD_S
from akri_trio.discovery.handlers import load_handler
from akri_trio.discovery.handlers.debug_echo import DEFAULT_POLL_S as DEBUG_ECHO_POLL_S
from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.discovery.interface import AnyHandler
from akri_trio.observe.lag import LAG_THRESHOLD_S, SAMPLE_PERIOD_S
from akri_trio.rpc.uds import DEFAULT_LIMITS, ServerLimits
from akri_trio.runtime.http import DEFAULT_MAX_CONNECTIONS

__all__ = ["REGISTRATION_SOCKET", "AgentSettings", "embedded_handlers"]

# The discovery handlers' registration socket, in `discovery_handlers_directory`.
REGISTRATION_SOCKET = "agent-registration.sock"


@attrs.frozen
class AgentSettings:
    node: str
    discovery_handlers_directory: Path = Path("/var/lib/akri")
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    kubeconfig: Path | None = None
    namespace: str | None = None  # watch Configurations/Instances in this namespace only
    configuration_selector: str | None = None  # watch only the Configurations it selects
    handler_group: int | None = None  # discovery handlers of this group may register (non-root)
    embedded_handlers: tuple[str, ...] = ()  # built-in handlers to run in-process, by name
    # Handler objects to run in-process (programmatic embedding: custom handlers, tests).
    handlers: tuple[AnyHandler, ...] = ()
    enable_debug_echo: bool = False
    debug_echo_shared: bool = False
    debug_echo_availability: Path | None = None
    debug_echo_poll_period: float = DEBUG_ECHO_POLL_S
    # Seconds between two looks for a kubelet restart (akri_trio.agent.plugins.kubelet).
    kubelet_poll_period: float = KUBELET_POLL_S
    metrics_port: int | None = 8080
    metrics_host: str = "0.0.0.0"
    metrics_max_connections: int = DEFAULT_MAX_CONNECTIONS
    # /healthz fails while the event loop runs this many seconds late (akri_trio.observe.lag).
    lag_threshold: float = LAG_THRESHOLD_S
    lag_period: float = SAMPLE_PERIOD_S
    reclaim_period: float = DEFAULT_PERIOD_S
    reclaim_grace: float | None = None
    # What one Configuration may cost this node.
    limits: ConfigurationLimits = attrs.field(factory=ConfigurationLimits)
    broker_info_dir: Path | None = None  # brokerInfo off when None
    broker_info_limits: Limits = attrs.field(factory=Limits)
    broker_info_period: float = BROKER_INFO_PERIOD_S
    allocation: str = "device-plugin"  # or "dra": ResourceSlices + a DRA kubelet plugin
    kubelet_root_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    # DRA capacity: None asks the API server (consumable capacity where it is served); False
    # publishes slot devices anyway (tests of slot mode on a cluster that has both).
    dra_consumable_capacity: bool | None = None
    # What each connection to the agent's gRPC sockets may do (--grpc-idle-timeout,
    # --grpc-max-streams): the registration socket's and the device plugins'.
    grpc: ServerLimits = DEFAULT_LIMITS


def embedded_handlers(settings: AgentSettings) -> list[AnyHandler]:
    """The handlers this agent runs in-process. A built-in handler's module, and so its
    libraries, is imported here, only when the settings enable it."""
    handlers: list[AnyHandler] = []
    if settings.enable_debug_echo:
        echo = DebugEcho(
            shared=settings.debug_echo_shared, poll_interval=settings.debug_echo_poll_period
        )
        if settings.debug_echo_availability is not None:
            echo = attrs.evolve(echo, availability_path=settings.debug_echo_availability)
        handlers.append(echo)
    handlers.extend(load_handler(name, os.environ) for name in settings.embedded_handlers)
    handlers.extend(settings.handlers)
    return handlers
