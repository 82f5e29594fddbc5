"""`akri-trio` command line: one entry point, one module per subcommand.

Each subcommand lives in the package that owns it and is imported only when chosen, so
`akri-trio cluster status` never pays for importing purerpc or zeep.

A configuration the process cannot start with (a bad kubeconfig: `ConfigError`) is the user's
to fix, not a crash: whichever subcommand loaded it, and however deep in a nursery, it ends
the process with exit code 1 and one line on stderr, like kubectl's, instead of a traceback.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

# subcommand -> "module:function"; the function takes argv (list[str]) and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": (
        "akri_trio.agent.cli:main",
        "the node agent (DaemonSet): discovery, Instances, plugins",
    ),
    "cluster": ("akri_trio.cluster.cli:main", "a real local Kubernetes: up | down | status | env"),
    "dashboard": (
        "akri_trio.observe.dashboard:dashboard_main",
        "a live web page of the same picture as status (--host 127.0.0.1 --port 8090)",
    ),
    "discovery-handler": ("akri_trio.discovery.cli:main", "run a discovery handler standalone"),
    "status": (
        "akri_trio.observe.cli:status_main",
        "Configurations, nodes, Instances, slots and who holds them, brokers (-o json, --watch)",
    ),
    "webhook": (
        "akri_trio.webhook.cli:main",
        "the Configuration admission webhook (HTTPS); `webhook certs` makes its TLS files",
    ),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["--version"], ["-V"]):
        print(f"akri-trio {importlib.metadata.version('akri-trio')}")
        return 0
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        width = max(map(len, SUBCOMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in sorted(SUBCOMMANDS.items())]
        print("usage: akri-trio [--version] <command> [args]\n\ncommands:\n" + "\n".join(lines))
        return 0 if args and args[0] in ("-h", "--help") else 2
    target, _ = SUBCOMMANDS[args[0]]
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(args[1:]) or 0)
    except Exception as exc:
        problem = _config_problem(exc)
        if problem is None:
            raise
        print(f"akri-trio {args[0]}: error: {problem}", file=sys.stderr)
        return 1


def _config_problem(exc: BaseException) -> str | None:
    """The message of a ConfigError, also one that nurseries wrapped in exception groups
    (and only when nothing else failed alongside it); None for any other failure."""
    from akri_trio.kube.config import ConfigError  # imported only on the failure path

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, ConfigError):
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


if __name__ == "__main__":
    sys.exit(main())
