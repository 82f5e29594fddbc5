"""`akri-trio agent`: the DaemonSet process. Flags default to upstream's environment variables
(AGENT_NODE_NAME, DISCOVERY_HANDLERS_DIRECTORY, ENABLE_DEBUG_ECHO, DEBUG_ECHO_INSTANCES_SHARED,
METRICS_PORT), so upstream's manifests work unchanged. SIGTERM / SIGINT cancel the nursery tree:
sockets are removed and no write is left half-done."""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio

from akri_trio.agent.brokerinfo import DEFAULT_PERIOD_S as BROKER_INFO_PERIOD_S
from akri_trio.agent.brokerinfo import Limits
from akri_trio.agent.configurations import ConfigurationLimits
from akri_trio.agent.plugins.kubelet import POLL_S as KUBELET_POLL_S
from akri_trio.agent.run import run_agent
from akri_trio.agent.settings import AgentSettings
from akri_trio.discovery.device_rules import DeviceRules, host_path_problem
from akri_trio.discovery.handlers import BUILTIN
from akri_trio.discovery.handlers.debug_echo import DEFAULT_POLL_S as DEBUG_ECHO_POLL_S
from akri_trio.discovery.handlers.debug_echo import POLL_ENV as DEBUG_ECHO_POLL_ENV
from akri_trio.discovery.host_critical import parse_allowances
from akri_trio.flaghelp import (
    Parser,
    add_env_argument,
    add_kubeconfig_argument,
    add_log_arguments,
    comma_list,
    truthy,
)
from akri_trio.kube.client import Client
from akri_trio.kube.config import KubeConfig, load_config
from akri_trio.model import limits as model_limits
from akri_trio.observe.endpoints import add_metrics_max_connections
from akri_trio.observe.lag import LAG_THRESHOLD_S, SAMPLE_PERIOD_S
from akri_trio.rpc import uds
from akri_trio.runtime.logs import log_startup, setup_logging
from akri_trio.shutdown import run_until_signalled

log = logging.getLogger("akri_trio.agent")


def parse_args(argv: list[str], env: Mapping[str, str]) -> AgentSettings:
    return _parse(argv, env)[0]


def _parse(argv: list[str], env: Mapping[str, str]) -> tuple[AgentSettings, argparse.Namespace]:
    p = Parser(prog="akri-trio agent", description=__doc__)
    add_env_argument(
        p,
        "--node-name",
        env=env,
        var="AGENT_NODE_NAME",
        help="this node's name (required)",
    )
    add_env_argument(
        p,
        "--discovery-handlers-directory",
        env=env,
        var="DISCOVERY_HANDLERS_DIRECTORY",
        type=Path,
        default=Path("/var/lib/akri"),
        help="where discovery handlers register and serve their sockets",
    )
    add_kubeconfig_argument(p, env)
    add_env_argument(
        p,
        "--namespace",
        env=env,
        var="AKRI_NAMESPACE",
        help="watch Configurations and Instances in this namespace only "
        "(default: all namespaces, as upstream)",
    )
    p.add_argument(
        "--device-plugin-dir", type=Path, default=Path("/var/lib/kubelet/device-plugins")
    )
    p.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    )
    add_env_argument(
        p,
        "--metrics-port",
        env=env,
        var="METRICS_PORT",
        type=int,
        default=8080,
        help="health and Prometheus metrics port; 0 picks one, -1 disables",
    )
    add_env_argument(
        p,
        "--embedded-handler",
        env=env,
        var="AKRI_EMBEDDED_HANDLERS",
        from_env=comma_list,
        action="append",
        dest="embedded_handlers",
        default=[],
        metavar="NAME",
        help="run this built-in discovery handler in-process (repeatable; the env var takes "
        "a list: udev,opcua,...)",
    )
    for flag, var, what in (
        ("--enable-debug-echo", "ENABLE_DEBUG_ECHO", "run the debugEcho test handler in-process"),
        ("--debug-echo-shared", "DEBUG_ECHO_INSTANCES_SHARED", "debugEcho's devices are shared"),
    ):
        add_env_argument(
            p,
            flag,
            env=env,
            var=var,
            from_env=truthy,
            action="store_true",
            default=False,
            help=what,
        )
    add_env_argument(
        p,
        "--debug-echo-availability",
        env=env,
        var="DEBUG_ECHO_AVAILABILITY_PATH",
        type=Path,
        help="debugEcho availability file, as the standalone handler's "
        "(default /tmp/debug-echo-availability.txt)",
    )
    add_env_argument(
        p,
        "--debug-echo-poll-period",
        env=env,
        var=DEBUG_ECHO_POLL_ENV,
        type=float,
        default=DEBUG_ECHO_POLL_S,
        metavar="SECONDS",
        help="how often debugEcho looks at its availability file, as the standalone handler's",
    )
    add_env_argument(
        p,
        "--kubelet-poll-period",
        env=env,
        var="AKRI_KUBELET_POLL_PERIOD",
        type=float,
        default=KUBELET_POLL_S,
        metavar="SECONDS",
        help="how often the device-plugin directory and kubelet.sock are looked at for a "
        "kubelet restart (the plugins then register again)",
    )
    add_env_argument(
        p,
        "--metrics-host",
        env=env,
        var="METRICS_HOST",
        default="0.0.0.0",
        help="address the health and metrics server binds",
    )
    add_env_argument(
        p,
        "--event-loop-lag-threshold",
        env=env,
        var="AKRI_EVENT_LOOP_LAG_THRESHOLD",
        type=float,
        default=LAG_THRESHOLD_S,
        metavar="SECONDS",
        help="/healthz fails while the event loop runs this late (akri_event_loop_lag_seconds "
        "has each sample)",
    )
    add_env_argument(
        p,
        "--event-loop-lag-period",
        env=env,
        var="AKRI_EVENT_LOOP_LAG_PERIOD",
        type=float,
        default=SAMPLE_PERIOD_S,
        metavar="SECONDS",
        help="how often the lag sampler wakes (one akri_event_loop_lag_seconds sample each): "
        "a stall longer than this is always sampled",
    )
    add_metrics_max_connections(p, env)
    add_env_argument(
        p,
        "--handler-group",
        env=env,
        var="AKRI_HANDLER_GROUP",
        type=int,
        metavar="GID",
        help="let discovery handlers of this group register and serve, as non-root (the agent "
        "must be a member): the handlers directory becomes group GID, mode 3770, the "
        "registration socket 0660 (default: none, root's handlers only)",
    )
    add_env_argument(
        p,
        "--handler-mount-dir",
        env=env,
        var="AKRI_HANDLER_MOUNT_DIRS",
        from_env=comma_list,
        action="append",
        dest="handler_mount_dirs",
        default=[],
        metavar="DIR",
        help="a node directory whose contents discovery handlers may mount into brokers "
        "(repeatable; the env var takes a list; default: none, handlers' mounts are refused)",
    )
    add_env_argument(
        p,
        "--allow-host-devices",
        env=env,
        var="AKRI_ALLOW_HOST_DEVICES",
        from_env=comma_list,
        action="append",
        default=[],
        metavar="NAMESPACE:CLASS",
        help="let Configurations in NAMESPACE (* for all) be handed the node's own devices of "
        "CLASS: block (mounted disks, swap, LVM/RAID members), kernel (/dev/mem, kmem, port, "
        "kmsg), console (consoles and ttys) or all (repeatable; the env var takes a list; "
        "default: none, such devices are dropped with their reason)",
    )
    add_env_argument(
        p,
        "--configuration-selector",
        env=env,
        var="AKRI_CONFIGURATION_SELECTOR",
        metavar="LABELS",
        help="serve only the Configurations this label selector matches (default: all)",
    )
    for flag, cap, what in (
        (
            "--max-capacity",
            model_limits.MAX_CAPACITY,
            "refuse Configurations with a larger capacity; serve at most this many slots of "
            "any Instance",
        ),
        (
            "--max-devices-per-handler",
            model_limits.MAX_DEVICES_PER_HANDLER,
            "devices taken from one handler endpoint's list, lowest ids first",
        ),
        (
            "--max-devices-per-configuration",
            model_limits.MAX_DEVICES_PER_CONFIGURATION,
            "devices (Instances) per Configuration on this node, lowest ids first",
        ),
        (
            "--max-properties-per-device",
            model_limits.MAX_PROPERTIES_PER_DEVICE,
            "properties of one device from a handler; a device with more is dropped",
        ),
        (
            "--max-device-bytes",
            model_limits.MAX_DEVICE_BYTES,
            "bytes of one device from a handler (id, properties, paths); a larger one is dropped",
        ),
    ):
        p.add_argument(flag, type=int, default=cap, help=what)
    p.add_argument(
        "--allocation",
        choices=("device-plugin", "dra"),
        default="device-plugin",
        help="how Pods get devices: device plugins, or DRA (ResourceSlices and a kubelet DRA "
        "plugin; Kubernetes >= 1.34 and a runtime with CDI)",
    )
    p.add_argument(
        "--kubelet-root-dir",
        type=Path,
        default=Path("/var/lib/kubelet"),
        help="DRA: the kubelet's root directory (plugins_registry/ and plugins/akri.sh/ in it; "
        "in device-plugin mode, where the claims DRA mode left are found)",
    )
    p.add_argument(
        "--cdi-dir",
        type=Path,
        default=Path("/var/run/cdi"),
        help="DRA: where the container runtime reads CDI specs (one is written per claim; in "
        "device-plugin mode, those of the claims DRA mode left are removed with them)",
    )
    p.add_argument(
        "--reclaim-period",
        type=float,
        default=10.0,
        help="seconds between two passes of the slot reclaimer (one PodResources List)",
    )
    p.add_argument(
        "--reclaim-grace",
        type=float,
        default=None,
        help="seconds a held slot must be missing from the kubelet's pod resources before it "
        "is freed (default 20, as upstream)",
    )
    add_env_argument(
        p,
        "--broker-info-dir",
        env=env,
        var="BROKER_INFO_DIRECTORY",
        type=Path,
        help="brokerInfo: a directory per workload under this one, mounted into the broker, "
        "its files copied into the Instance's spec.brokerInfo; the same path on the node and "
        "in the agent's container (default: off)",
    )
    limits = Limits()
    for flag, kind, default, what in (
        ("--broker-info-max-files", int, limits.max_files, "files per workload directory"),
        ("--broker-info-max-file-bytes", int, limits.max_file_bytes, "bytes per file (<= 4096)"),
        ("--broker-info-max-total-bytes", int, limits.max_total_bytes, "bytes per directory"),
        (
            "--broker-info-max-node-entries",
            int,
            limits.max_node_entries,
            "this node's entries on one Instance",
        ),
        (
            "--broker-info-max-node-bytes",
            int,
            limits.max_node_bytes,
            "bytes (keys and values) of those entries",
        ),
        ("--broker-info-period", float, BROKER_INFO_PERIOD_S, "seconds between looks"),
    ):
        p.add_argument(flag, type=kind, default=default, help=f"brokerInfo: {what}")
    uds.add_server_arguments(p, env)
    add_log_arguments(p, env)
    args = p.parse_args(argv)
    if not args.node_name:
        p.error("the node name is required: --node-name or AGENT_NODE_NAME")
    for flag in (
        "max_capacity",
        "max_devices_per_handler",
        "max_devices_per_configuration",
        "max_properties_per_device",
        "max_device_bytes",
        "metrics_max_connections",
    ):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    unknown = sorted(set(args.embedded_handlers) - set(BUILTIN))
    if unknown:
        p.error(f"unknown discovery handler(s) {unknown}; built in: {sorted(BUILTIN)}")
    try:
        limits = Limits(
            args.broker_info_max_files,
            args.broker_info_max_file_bytes,
            args.broker_info_max_total_bytes,
            args.broker_info_max_node_entries,
            args.broker_info_max_node_bytes,
        )
    except ValueError as exc:
        p.error(f"brokerInfo limits: {exc}")
    if not args.event_loop_lag_threshold > 0:
        p.error("--event-loop-lag-threshold must be a positive number of seconds")
    for flag in ("event_loop_lag_period", "debug_echo_poll_period", "kubelet_poll_period"):
        if not getattr(args, flag) > 0:
            p.error(f"--{flag.replace('_', '-')} must be a positive number of seconds")
    if not args.broker_info_period > 0:
        p.error("--broker-info-period must be a positive number of seconds")
    # No handler may hand a container a path the agent was given: they are the node's keys.
    given = (
        args.kubelet_root_dir,
        args.device_plugin_dir,
        args.pod_resources_socket,
        args.cdi_dir,
        args.discovery_handlers_directory,
        args.broker_info_dir,
    )
    refused = tuple(dict.fromkeys(os.path.normpath(path) for path in given if path is not None))
    for directory in args.handler_mount_dirs:
        problem = host_path_problem(directory, "--handler-mount-dir", refused)
        if problem is not None:
            p.error(problem)
    try:
        host_allowances = parse_allowances(args.allow_host_devices)
    except ValueError as exc:
        p.error(f"--allow-host-devices: {exc}")
    settings = AgentSettings(
        node=args.node_name,
        discovery_handlers_directory=args.discovery_handlers_directory,
        device_plugin_dir=args.device_plugin_dir,
        pod_resources_socket=args.pod_resources_socket,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        embedded_handlers=tuple(dict.fromkeys(args.embedded_handlers)),
        enable_debug_echo=args.enable_debug_echo,
        debug_echo_shared=args.debug_echo_shared,
        debug_echo_availability=args.debug_echo_availability,
        debug_echo_poll_period=args.debug_echo_poll_period,
        kubelet_poll_period=args.kubelet_poll_period,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        metrics_host=args.metrics_host,
        metrics_max_connections=args.metrics_max_connections,
        lag_threshold=args.event_loop_lag_threshold,
        lag_period=args.event_loop_lag_period,
        configuration_selector=args.configuration_selector,
        handler_group=args.handler_group,
        grpc=uds.ServerLimits.of(args),
        limits=ConfigurationLimits(
            max_capacity=args.max_capacity,
            devices=DeviceRules(
                max_devices=args.max_devices_per_handler,
                max_configuration_devices=args.max_devices_per_configuration,
                refused_host_dirs=refused,
                mount_dirs=tuple(dict.fromkeys(args.handler_mount_dirs)),
                host_allowances=host_allowances,
                max_properties=args.max_properties_per_device,
                max_device_bytes=args.max_device_bytes,
            ),
        ),
        reclaim_period=args.reclaim_period,
        reclaim_grace=args.reclaim_grace,
        broker_info_dir=args.broker_info_dir,
        broker_info_limits=limits,
        broker_info_period=args.broker_info_period,
        allocation=args.allocation,
        kubelet_root_dir=args.kubelet_root_dir,
        cdi_dir=args.cdi_dir,
    )
    return settings, args


async def _main(settings: AgentSettings, config: KubeConfig) -> None:
    async with Client.open(config) as api:
        await run_until_signalled(functools.partial(run_agent, settings, api=api), log)


def main(argv: list[str]) -> int:
    settings, args = _parse(argv, os.environ)
    # A bad kubeconfig is one error line, first.
    config = load_config(settings.kubeconfig, context=args.context)
    # Every line of an agent is about its node: the field lets one query span a DaemonSet.
    setup_logging(args.log_level, args.log_format, defaults={"node": settings.node})
    logs = {"log_level": args.log_level, "log_format": args.log_format}
    log_startup(log, "agent", {**attrs.asdict(settings, recurse=False), **logs})
    # What exists by now (modules, settings, the kube config) lives as long as the process:
    # leave it out of the garbage collector's full passes, whose pause stalls every task (and
    # grows with the heap it walks) while a flood makes short-lived objects.
    gc.freeze()
    trio.run(_main, settings, config)
    log.info("agent stopped")
    return 0
