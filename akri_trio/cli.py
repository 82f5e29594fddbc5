"""`akri-trio` command line: one entry point, one module per subcommand.

Each subcommand lives in the package that owns it and is imported only when chosen, so
`akri-trio status` never pays for importing purerpc or zeep.

A problem the user must fix is not a crash: a bad kubeconfig (`ConfigError`), the akri.sh CRDs
not installed (a 404 for the resource type itself), RBAC refusing a request (403), bad
credentials (401) or an API server that cannot be reached. Whichever subcommand met it, and
however deep in a nursery, it ends the process with exit code 1 and one line on stderr with a
hint, like kubectl's, instead of a traceback.
"""

from __future__ import annotations

import importlib
import sys

import akri_trio

# subcommand -> "module:function"; the function takes argv (list[str]) and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": (
        "akri_trio.agent.cli:main",
        "the node agent (DaemonSet): discovery, Instances, plugins",
    ),
    "controller": (
        "akri_trio.controller.cli:main",
        "the controller (Deployment): broker Pods, Jobs and Services; lost nodes",
    ),
    "dashboard": (
        "akri_trio.observe.dashboard:dashboard_main",
        "a live web page of the same picture as status (--host 127.0.0.1 --port 8090)",
    ),
    "discovery-handler": ("akri_trio.discovery.cli:main", "run a discovery handler standalone"),
    "status": (
        "akri_trio.observe.cli:status_main",
        "Configurations, nodes, Instances, slots and who holds them, brokers (-o json, --watch)",
    ),
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
    if args[:1] in (["--version"], ["-V"]):
        print(f"akri-trio {akri_trio.__version__}")
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
        problem = _user_problem(exc)
        if problem is None:
            raise
        print(f"akri-trio {args[0]}: error: {problem}", file=sys.stderr)
        return 1


def _user_problem(exc: BaseException) -> str | None:
    """One line for a failure the user fixes, also one that nurseries wrapped in exception
    groups (and only when nothing else failed alongside it); None for any other failure."""
    import httpx  # imported only on the failure path

    from akri_trio.kube import ConfigError, Forbidden, NotFound, Unauthorized

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ConfigError):
        return text
    if isinstance(exc, Forbidden):
        return (
            f"{exc.message} (hint: RBAC forbids it: grant the verb to this user or "
            "ServiceAccount, as k8s/agent.yaml's ClusterRole does (in DRA mode with "
            "k8s/dra.yaml's); `kubectl auth can-i` checks)"
        )
    if isinstance(exc, NotFound) and not exc.reason and not exc.details.get("name"):
        # An object that is missing comes with a reason and its name; a type that is not
        # served is the API server's plain "404 page not found".
        return (
            f"{exc.message} (hint: the akri.sh CRDs are not installed: kubectl apply -f k8s/crds/)"
        )
    if isinstance(exc, Unauthorized):
        return f"{text} (hint: the kubeconfig's credentials were refused: renew them)"
    if isinstance(exc, httpx.TransportError):
        return f"cannot reach the API server: {text} (hint: is the cluster up? --kubeconfig?)"
    return None


if __name__ == "__main__":
    sys.exit(main())
