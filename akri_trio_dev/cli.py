"""The development tools' one command, `cluster`, kept out of the operator's `akri-trio`.

`python -m akri_trio_dev cluster ...` is what `akri-trio cluster ...` was before the local
cluster left the product; the rest of its argv goes to `akri_trio_dev.cluster.cli`.
"""

from __future__ import annotations

import sys

from akri_trio_dev.cluster import cli as cluster_cli

USAGE = """usage: python -m akri_trio_dev <command> [args]

commands:
  cluster  a real local Kubernetes: up | down | status | env | node

also: python -m akri_trio_dev.demo (the README's demo),
      python -m akri_trio_dev.cluster.image (the container image, built offline)"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["cluster"]:
        print(USAGE)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    return cluster_cli.main(args[1:])
