"""The product ships only the product: the development tools (`akri_trio_dev`: the local
cluster, the image builder, the demo) are not in the wheel, not imported by `akri_trio`, not in
the operator's `akri-trio --help`, and still run from the repository root whatever the caller's
directory."""

from __future__ import annotations

import ast
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

import akri_trio
from akri_trio import cli
from akri_trio_dev import ROOT, run_cluster_command
from akri_trio_dev import cli as dev_cli

PRODUCT = Path(akri_trio.__file__).parent


def _in_wheel(package: str) -> bool:
    """setuptools' `packages.find` rule: a package is in when an `include` pattern matches it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return any(fnmatchcase(package, pattern) for pattern in patterns)


def test_the_wheel_holds_akri_trio_and_not_the_dev_package() -> None:
    assert _in_wheel("akri_trio") and _in_wheel("akri_trio.agent.plugins")
    assert not _in_wheel("akri_trio_dev")
    assert not _in_wheel("akri_trio_dev.cluster")


def _names_the_dev_package(path: Path) -> list[str]:
    """Imports of akri_trio_dev, and strings naming it (an importlib target in a table)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("akri_trio_dev")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("akri_trio_dev"):
            found.append(str(node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [w for w in node.value.split() if w.startswith("akri_trio_dev")]
    return found


def test_the_product_never_imports_the_dev_package() -> None:
    modules = sorted(PRODUCT.rglob("*.py"))
    assert len(modules) > 50  # the walk sees the whole package
    bad = {str(p.relative_to(PRODUCT)): n for p in modules if (n := _names_the_dev_package(p))}
    assert not bad


def test_the_operators_help_has_no_cluster_and_the_dev_help_has(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--help"]) == 0
    assert "cluster" not in capsys.readouterr().out.split()
    assert dev_cli.main(["--help"]) == 0
    assert "cluster" in capsys.readouterr().out.split()
    assert dev_cli.main([]) == 2  # no command is a usage error, as for akri-trio


def test_the_cluster_command_runs_from_the_repository_root_whatever_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # akri_trio_dev is not installed: only the root's path finds it
    proc = run_cluster_command("--help", capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert "{up,down,status,env,node}" in proc.stdout
