"""`akri-trio controller`: the Deployment process. `--metrics-port` defaults to upstream's
METRICS_PORT; the Lease lives in the controller's own namespace (the in-cluster namespace file)
unless `--lease-namespace` says otherwise. SIGTERM / SIGINT cancel the nursery tree: the leader
hands its Lease back on the way out so a standby takes over at once."""

from __future__ import annotations

import argparse
import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio

from akri_trio.controller.reconcilers import NODE_LOST_GRACE_S
from akri_trio.controller.run import run_controller
from akri_trio.controller.settings import ControllerSettings, default_identity
from akri_trio.flaghelp import Parser, add_env_argument, add_kubeconfig_argument, add_log_arguments
from akri_trio.kube import Client, KubeConfig, load_config
from akri_trio.observe.endpoints import add_metrics_max_connections
from akri_trio.runtime.logs import log_startup, setup_logging
from akri_trio.shutdown import run_until_signalled

log = logging.getLogger("akri_trio.controller")

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_LEASE_NAMESPACE = "akri"


def _own_namespace(path: Path = IN_CLUSTER_NAMESPACE) -> str:
    try:
        return path.read_text().strip() or DEFAULT_LEASE_NAMESPACE
    except OSError:
        return DEFAULT_LEASE_NAMESPACE


def _parse(
    argv: list[str], env: Mapping[str, str]
) -> tuple[ControllerSettings, argparse.Namespace]:
    p = Parser(prog="akri-trio controller", description=__doc__)
    add_kubeconfig_argument(p, env)
    add_env_argument(
        p,
        "--metrics-port",
        env=env,
        var="METRICS_PORT",
        type=int,
        default=8080,
        help="health and Prometheus metrics port; 0 picks one, -1 disables",
    )
    add_metrics_max_connections(p, env)
    add_env_argument(
        p,
        "--namespace",
        env=env,
        var="AKRI_NAMESPACE",
        help="watch Instances, Configurations and brokers in this namespace only "
        "(default: all namespaces, as upstream)",
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run only while holding the Lease (default on; off for a single replica)",
    )
    p.add_argument("--lease-name", default="akri-controller", help="the Lease's name")
    p.add_argument(
        "--lease-namespace",
        default=None,
        help=f"namespace of the Lease (default: this Pod's, else {DEFAULT_LEASE_NAMESPACE})",
    )
    p.add_argument(
        "--identity",
        default=None,
        help="this replica's holder identity (default: env POD_NAME or the host name, "
        "and a random suffix)",
    )
    p.add_argument("--workers", type=int, default=8, help="Instances reconciled in parallel")
    p.add_argument(
        "--allocation",
        choices=("device-plugin", "dra"),
        default="device-plugin",
        help="how brokers get their device: `akri.sh/<instance>` limits served by the agents' "
        "device plugins (default), or (dra, Kubernetes >= 1.34) ResourceClaims; in dra mode the "
        "controller also keeps one DeviceClass per Configuration and publishes the shared "
        "Instances' ResourceSlices",
    )
    p.add_argument(
        "--node-lost-grace",
        type=float,
        default=NODE_LOST_GRACE_S,
        metavar="SECONDS",
        help="how long a node found NotReady at start, while Instances name it, must have been "
        "NotReady (by its Ready condition's lastTransitionTime, or since this controller first "
        "saw it) before its entries are removed; a node seen going NotReady is cleaned at once",
    )
    add_log_arguments(p, env)
    args = p.parse_args(argv)
    if args.metrics_max_connections < 1:
        p.error("--metrics-max-connections must be at least 1")
    if not args.node_lost_grace >= 0:
        p.error(f"--node-lost-grace must be >= 0 seconds, got {args.node_lost_grace}")
    settings = ControllerSettings(
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        metrics_max_connections=args.metrics_max_connections,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace or _own_namespace(),
        identity=args.identity or default_identity(),
        workers=args.workers,
        allocation=args.allocation,
        node_lost_grace=args.node_lost_grace,
    )
    return settings, args


def parse_args(argv: list[str], env: Mapping[str, str]) -> ControllerSettings:
    return _parse(argv, env)[0]


async def _main(settings: ControllerSettings, config: KubeConfig) -> None:
    async with Client.open(config) as api:
        await run_until_signalled(functools.partial(run_controller, settings, api=api), log)


def main(argv: list[str]) -> int:
    settings, args = _parse(argv, os.environ)
    # A bad kubeconfig is one error line, first.
    config = load_config(settings.kubeconfig, context=args.context)
    setup_logging(args.log_level, args.log_format)
    logs = {"log_level": args.log_level, "log_format": args.log_format}
    log_startup(log, "controller", {**attrs.asdict(settings, recurse=False), **logs})
    trio.run(_main, settings, config)
    log.info("controller stopped")
    return 0
