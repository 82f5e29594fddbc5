"""`akri-trio controller`: the Deployment process. `--metrics-port` defaults to upstream's
METRICS_PORT; the Lease lives in the controller's own namespace (the in-cluster namespace file)
unless `--lease-namespace` says otherwise. SIGTERM / SIGINT cancel the nursery tree: the leader
hands its Lease back on the way out so a standby takes over at once."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

import trio

from akri_trio.controller.run import ControllerSettings, default_identity, run_controller
from akri_trio.flaghelp import Parser, add_env_argument, add_kubeconfig_argument

log = logging.getLogger("akri_trio.controller")

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_LEASE_NAMESPACE = "akri"


def _own_namespace(path: Path = IN_CLUSTER_NAMESPACE) -> str:
    try:
        return path.read_text().strip() or DEFAULT_LEASE_NAMESPACE
    except OSError:
        return DEFAULT_LEASE_NAMESPACE


def parse_args(argv: list[str], env: Mapping[str, str]) -> ControllerSettings:
    p = Parser(prog="akri-trio controller", description=__doc__)
    add_kubeconfig_argument(p)
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
        help="this replica's holder identity (default: $POD_NAME or the host name, and a "
        "random suffix)",
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
    add_env_argument(p, "--log-level", env=env, var="AKRI_LOG_LEVEL", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per API request is noise
    return ControllerSettings(
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace or _own_namespace(),
        identity=args.identity or default_identity(),
        workers=args.workers,
        allocation=args.allocation,
    )


async def _main(settings: ControllerSettings) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_controller, settings)
            async for signum in signals:
                log.info("%s: shutting down", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return


def main(argv: list[str]) -> int:
    settings = parse_args(argv, os.environ)
    trio.run(_main, settings)
    log.info("controller stopped")
    return 0
