"""`akri-trio` command line: one entry point, one module per subcommand.

Each subcommand lives in the package that owns it and is imported only when chosen, so
`akri-trio cluster status` never pays for importing purerpc or zeep.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> "module:function"; the function takes argv (list[str]) and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": (
        "akri_trio.agent.cli:main",
        "the node agent (DaemonSet): discovery, Instances, plugins",
    ),
    "cluster": ("akri_trio.cluster.cli:main", "a real local Kubernetes: up | down | status | env"),
    "discovery-handler": ("akri_trio.discovery.cli:main", "run a discovery handler standalone"),
    "teardown": (
        "akri_trio.teardown:main",
        "delete every Configuration and wait for its Instances to go (before an uninstall)",
    ),
    "webhook": (
        "akri_trio.webhook.cli:main",
        "the Configuration admission webhook (HTTPS); `webhook certs` makes its TLS files",
    ),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        width = max(map(len, SUBCOMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in sorted(SUBCOMMANDS.items())]
        print("usage: akri-trio <command> [args]\n\ncommands:\n" + "\n".join(lines))
        return 0 if args and args[0] in ("-h", "--help") else 2
    target, _ = SUBCOMMANDS[args[0]]
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
