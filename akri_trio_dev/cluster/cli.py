"""`python -m akri_trio_dev cluster up | down | status | env`: a real single-node Kubernetes on
loopback.

Tests and developers share one cluster: `up` is idempotent (it adopts what already runs), `env`
tells every consumer where the kubeconfigs and endpoints are, and `down` removes only what
`up` made. See layout.py for where state lives.
"""

from __future__ import annotations

import argparse
import os

from akri_trio.flaghelp import Parser
from akri_trio_dev.cluster import runner
from akri_trio_dev.cluster.layout import DEFAULT_NODE_NAME, Layout


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
    sub.add_parser("down", help="stop everything `up` started and clean up")
    sub.add_parser("status", help="show what runs; exit 0 when the control plane is up")
    sub.add_parser(
        "env", help="print `export KEY='value'` lines (KUBECONFIG, ...): eval \"$(... env)\""
    )
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    lay = Layout.default()
    try:
        if args.cmd == "up":
            if args.node and os.geteuid() != 0:
                raise runner.ClusterError(
                    "`up --node` needs root (containerd, kubelet, mounts, CNI)"
                )
            with runner.state_lock(lay):
                runner.up_control_plane(lay)
                if args.node:
                    runner.up_node(lay, args.node_name)
            return 0
        if args.cmd == "down":
            with runner.state_lock(lay):
                runner.down(lay)
            return 0
        if args.cmd == "status":
            return 0 if runner.status(lay) else 1
        if args.cmd == "env":
            for line in runner.env_lines(lay):
                print(line)
            return 0 if lay.kubeconfig("admin").is_file() else 1
    except runner.ClusterError as exc:
        return runner.main_error(exc)
    return 2
