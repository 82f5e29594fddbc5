"""The controller and webhook cores import no I/O library and nothing of kube/ or agent/; only
the named edges do."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import akri_trio

PACKAGES = ("controller", "webhook")
FORBIDDEN = ("trio", "httpx", "purerpc", "akri_trio.kube", "akri_trio.agent", "akri_trio.cluster")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


# The edges, named: they do the I/O (HTTPS, the API server) around the pure cores.
EDGES = ("webhook/server.py", "webhook/cli.py")
MODULES = sorted(
    path
    for package in PACKAGES
    for path in (Path(akri_trio.__file__).parent / package).glob("*.py")
    if f"{package}/{path.name}" not in EDGES
)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_pure_core_imports_no_io(path: Path) -> None:
    bad = {
        name
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad, f"{path.name} imports {sorted(bad)}"
