"""`akri-trio agent`: the DaemonSet process. Flags default to upstream's environment variables
(AGENT_NODE_NAME, DISCOVERY_HANDLERS_DIRECTORY, ENABLE_DEBUG_ECHO, DEBUG_ECHO_INSTANCES_SHARED,
METRICS_PORT), so upstream's manifests work unchanged. SIGTERM / SIGINT cancel the nursery tree:
sockets are removed and no write is left half-done."""

from __future__ import annotations

import argparse
import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio

from akri_trio.agent.run import AgentSettings, run_agent
from akri_trio.discovery.handlers import BUILTIN
from akri_trio.kube.client import Client
from akri_trio.kube.config import KubeConfig, load_config
from akri_trio.observe.logs import add_log_arguments, log_startup, setup_logging
from akri_trio.shutdown import run_until_signalled

log = logging.getLogger("akri_trio.agent")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv: list[str], env: Mapping[str, str]) -> AgentSettings:
    return _parse(argv, env)[0]


def _parse(argv: list[str], env: Mapping[str, str]) -> tuple[AgentSettings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="akri-trio agent", description=__doc__)
    p.add_argument(
        "--node-name",
        default=env.get("AGENT_NODE_NAME"),
        help="this node's name (env AGENT_NODE_NAME)",
    )
    p.add_argument(
        "--discovery-handlers-directory",
        type=Path,
        default=Path(env.get("DISCOVERY_HANDLERS_DIRECTORY", "/var/lib/akri")),
    )
    p.add_argument("--kubeconfig", type=Path, default=None)
    p.add_argument(
        "--namespace",
        default=env.get("AKRI_NAMESPACE") or None,
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
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(env.get("METRICS_PORT", "8080")),
        help="health and Prometheus metrics port; 0 picks one, -1 disables",
    )
    p.add_argument(
        "--embedded-handler",
        action="append",
        dest="embedded_handlers",
        default=[h for h in env.get("AKRI_EMBEDDED_HANDLERS", "").split(",") if h],
        metavar="NAME",
        help="run this built-in discovery handler in-process (repeatable; env "
        "AKRI_EMBEDDED_HANDLERS=udev,opcua,...)",
    )
    p.add_argument(
        "--enable-debug-echo", action="store_true", default=_truthy(env.get("ENABLE_DEBUG_ECHO"))
    )
    p.add_argument(
        "--debug-echo-shared",
        action="store_true",
        default=_truthy(env.get("DEBUG_ECHO_INSTANCES_SHARED")),
    )
    p.add_argument(
        "--debug-echo-availability",
        type=Path,
        default=env.get("DEBUG_ECHO_AVAILABILITY_PATH") or None,
        help="debugEcho availability file (env DEBUG_ECHO_AVAILABILITY_PATH, as the standalone "
        "handler; default /tmp/debug-echo-availability.txt)",
    )
    p.add_argument(
        "--allocation",
        choices=("device-plugin", "dra"),
        default="device-plugin",
        help="how Pods get devices: device plugins (default) or DRA (ResourceSlices + a kubelet "
        "DRA plugin; Kubernetes >= 1.34 and a runtime with CDI)",
    )
    p.add_argument("--kubelet-root-dir", type=Path, default=Path("/var/lib/kubelet"))
    p.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"))
    p.add_argument("--reclaim-period", type=float, default=10.0)
    p.add_argument("--reclaim-grace", type=float, default=None)
    add_log_arguments(p, env)
    args = p.parse_args(argv)
    if not args.node_name:
        p.error("the node name is required: --node-name or AGENT_NODE_NAME")
    unknown = sorted(set(args.embedded_handlers) - set(BUILTIN))
    if unknown:
        p.error(f"unknown discovery handler(s) {unknown}; built in: {sorted(BUILTIN)}")
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
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        reclaim_period=args.reclaim_period,
        reclaim_grace=args.reclaim_grace,
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
    config = load_config(settings.kubeconfig)  # a bad kubeconfig is one error line, first
    # Every line of an agent is about its node: the field lets one query span a DaemonSet.
    setup_logging(args.log_level, args.log_format, defaults={"node": settings.node})
    logs = {"log_level": args.log_level, "log_format": args.log_format}
    log_startup(log, "agent", {**attrs.asdict(settings, recurse=False), **logs})
    trio.run(_main, settings, config)
    log.info("agent stopped")
    return 0
