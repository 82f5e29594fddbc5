"""`python -m akri_trio_dev cluster up | down | status | env | node`: a real Kubernetes on
loopback, with one node or several.

Tests and developers share one cluster: `up` is idempotent (it adopts what already runs, and
`up --nodes 3` on a running cluster only adds nodes 2 and 3), `up --version 1.34` runs the oldest
supported Kubernetes release instead of the newest (each release's binaries are built once and
kept), `env` tells every consumer where the kubeconfigs, endpoints and each node's sockets are,
`node stop|start|partition|heal` loses and brings back one extra node the way a real one is lost
(`node remove` takes it away), and `down` removes only what `up` made. See layout.py for where
state lives.
"""

from __future__ import annotations

import argparse
import os

import attrs

from akri_trio.flaghelp import Parser
from akri_trio_dev.cluster import runner
from akri_trio_dev.cluster.layout import (
    DEFAULT_NODE_NAME,
    K8S_RELEASES,
    MAX_NODES,
    VERSION_ENV,
    Layout,
    resolve_release,
)

NODE_ACTIONS = {
    "stop": (runner.node_stop, "stop its kubelet, containers and containerd"),
    "start": (runner.node_start, "start them again and wait for Ready"),
    "partition": (runner.node_partition, "cut its link to the API server (both ways)"),
    "heal": (runner.node_heal, "restore that link"),
    "remove": (runner.node_remove, "remove the node and everything of it (`down` for one node)"),
}


def _node_count(text: str) -> int:
    n = int(text)
    if not 1 <= n <= MAX_NODES:
        raise argparse.ArgumentTypeError(f"between 1 and {MAX_NODES}")
    return n


def _release(text: str) -> str:
    try:
        return resolve_release(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m akri_trio_dev cluster", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build if needed, start the control plane (and a node)")
    up.add_argument("--node", action="store_true", help="also containerd + kubelet (root)")
    up.add_argument(
        "--node-name",
        default=DEFAULT_NODE_NAME,
        help=f"node name (default {DEFAULT_NODE_NAME}: kubectl logs works on loopback)",
    )
    up.add_argument(
        "--nodes",
        type=_node_count,
        default=1,
        help="how many nodes (implies --node when above 1); nodes 2..N are named 127.0.0.<n> "
        "and each has its own containerd and kubelet (default 1)",
    )
    minors = " or ".join(r.removeprefix("v").rsplit(".", 1)[0] for r in K8S_RELEASES)
    up.add_argument(
        "--version",
        type=_release,
        help=f"the Kubernetes release to run: {minors} (default ${VERSION_ENV}, else the "
        f"newest, {K8S_RELEASES[-1]}); a cluster running another one must go `down` first",
    )
    sub.add_parser("down", help="stop everything `up` started and clean up")
    sub.add_parser("status", help="show what runs; exit 0 when the control plane is up")
    env = sub.add_parser(
        "env", help="print `export KEY='value'` lines (KUBECONFIG, ...): eval \"$(... env)\""
    )
    env.add_argument("--node", metavar="NAME", help="describe node NAME's sockets (default node 1)")
    node = sub.add_parser("node", help="lose or restore one extra node (2..N)")
    node.add_argument(
        "action",
        choices=list(NODE_ACTIONS),
        help="; ".join(f"{k}: {v[1]}" for k, v in NODE_ACTIONS.items()),
    )
    node.add_argument("name", help="the extra node's name, e.g. 127.0.0.2")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        lay = Layout.default(args.version if args.cmd == "up" else None)
    except ValueError as exc:  # $AKRI_TRIO_K8S_VERSION names no supported release
        return runner.main_error(runner.ClusterError(str(exc)))
    # `up` starts the release asked for; every other command acts on the one that runs (even
    # one versions.env no longer pins: its binaries are still there).
    running = runner.running_version(lay)
    if args.cmd != "up" and running is not None:
        lay = attrs.evolve(lay, k8s_version=running)
    try:
        if args.cmd == "up":
            with_node = args.node or args.nodes > 1
            if with_node and os.geteuid() != 0:
                raise runner.ClusterError(
                    "`up --node` needs root (containerd, kubelet, mounts, CNI)"
                )
            with runner.state_lock(lay):
                runner.up_control_plane(lay)
                if with_node:
                    runner.up_nodes(lay, args.node_name, args.nodes)
            return 0
        if args.cmd == "down":
            with runner.state_lock(lay):
                runner.down(lay)
            return 0
        if args.cmd == "status":
            return 0 if runner.status(lay) else 1
        if args.cmd == "node":
            with runner.state_lock(lay):
                NODE_ACTIONS[args.action][0](lay, args.name)
            return 0
        if args.cmd == "env":
            for line in runner.env_lines(lay, args.node):
                print(line)
            return 0 if lay.kubeconfig("admin").is_file() else 1
    except runner.ClusterError as exc:
        return runner.main_error(exc)
    return 2
