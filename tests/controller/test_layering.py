"""The controller, webhook, DRA and model cores import no I/O library and nothing of kube/ or
agent/; the controller's edges (the modules that watch, write, elect and parse flags) may use
kube/ and trio but never the agent, and the agent never imports the controller. DRA's one edge
(`dra/edge.py`, the pool writer both sides share) is no core's either. The agent's pure cores
import no I/O library. runtime/, the bottom layer, imports only trio, h11 (its HTTP server) and
the standard library; the rest of the code uses its mechanisms through the package
(`akri_trio.runtime`) and never a private `_module`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import akri_trio

PACKAGES = ("controller", "webhook", "dra", "model")
IO = (
    "trio",
    "httpx",
    "purerpc",
    "akri_trio.runtime",
    "akri_trio.kube",
    "akri_trio.rpc",
    "akri_trio.dra.edge",
)
FORBIDDEN = (*IO, "akri_trio.agent", "akri_trio_dev")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


ROOT = Path(akri_trio.__file__).parent
# I/O edges, by path in their package: everything they decide comes from the pure modules.
EDGES = {
    "controller": {
        "run.py",
        "reconcilers.py",
        "dra/reconcilers.py",
        "leader_elector.py",
        "cli.py",
        "triggers.py",
        "settings.py",
    },
    "webhook": {"server.py", "cli.py", "rotation.py"},
    "dra": {"edge.py"},
    "model": set(),
}
MODULES = sorted(
    path
    for package in PACKAGES
    for path in (ROOT / package).rglob("*.py")
    if path.relative_to(ROOT / package).as_posix() not in EDGES[package]
)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pure_core_imports_no_io(path: Path) -> None:
    bad = {
        name
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad, f"{path.name} imports {sorted(bad)}"


AGENT_CORES = (
    "dra/holdings_plan.py",
    "dra/plan.py",
    "instance_plan.py",
    "reclaim_plan.py",
    "tenants.py",
    "plugins/slots.py",
    "plugins/vdevs.py",
)


@pytest.mark.parametrize("name", AGENT_CORES)
def test_agent_pure_core_imports_no_io(name: str) -> None:
    path = ROOT / "agent" / name
    bad = {n for n in _imports(path) if any(n == f or n.startswith(f + ".") for f in IO)}
    assert not bad, f"agent/{name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((ROOT / "runtime").glob("*.py")), ids=lambda p: p.name)
def test_runtime_imports_only_trio_h11_and_the_standard_library(path: Path) -> None:
    bad = {
        name
        for name in _imports(path)
        if not name.startswith("akri_trio.runtime")
        and name.split(".")[0] not in {"trio", "h11", *sys.stdlib_module_names}
    }
    assert not bad, f"runtime/{path.name} imports {sorted(bad)}"


def test_runtime_is_used_through_its_package() -> None:
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "runtime":
            continue
        private = {n for n in _imports(path) if n.startswith("akri_trio.runtime._")}
        assert not private, f"{path.relative_to(ROOT)} imports {sorted(private)}"


@pytest.mark.parametrize(
    ("package", "other"), [("controller", "akri_trio.agent"), ("agent", "akri_trio.controller")]
)
def test_agent_and_controller_never_import_each_other(package: str, other: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        bad = {n for n in _imports(path) if n == other or n.startswith(other + ".")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_edges_exist() -> None:
    """The edge list names real modules (a renamed edge must not silently become 'pure')."""
    for package, edges in EDGES.items():
        assert all((ROOT / package / name).is_file() for name in edges), package
