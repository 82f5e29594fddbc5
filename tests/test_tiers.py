"""Tier markers come from the fixtures a test uses (tests/support/tiers.py): `-m "not k8s"`
leaves out every test that would start Kubernetes, also one that reaches `cluster` through
another fixture, and `-m node` picks the tests that need the node."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.tiers import tier_markers

ROOT = Path(__file__).resolve().parent.parent


def test_the_markers_of_a_fixture_closure() -> None:
    assert tier_markers(["tmp_path", "autojump_clock"]) == set()
    assert tier_markers(["api", "cluster"]) == {"k8s"}
    assert tier_markers(["node_cluster", "cluster"]) == {"k8s", "node"}


CONFTEST = """
import pytest
from tests.support.tiers import mark_tiers

def pytest_configure(config):
    config.addinivalue_line("markers", "k8s: the control plane")
    config.addinivalue_line("markers", "node: the node")

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    mark_tiers(items)

@pytest.fixture
def cluster():
    return {}

@pytest.fixture
def node_cluster(cluster):
    return cluster

@pytest.fixture
def api(cluster):
    return cluster
"""

TESTS = """
import pytest

def test_pure(): pass
def test_control_plane(cluster): pass
def test_through_another_fixture(api): pass
def test_node(node_cluster): pass
@pytest.mark.k8s
def test_marked_by_hand(tmp_path): pass
"""


def _selected(tmp_path: Path, expression: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", expression],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line.split()[0] for line in proc.stdout.splitlines() if " PASSED" in line}


def test_not_k8s_runs_only_what_needs_no_cluster_and_node_picks_the_node(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_tiered.py").write_text(textwrap.dedent(TESTS))
    assert _selected(tmp_path, "not k8s") == {"test_tiered.py::test_pure"}
    assert _selected(tmp_path, "node") == {"test_tiered.py::test_node"}
    assert _selected(tmp_path, "k8s and not node") == {
        "test_tiered.py::test_control_plane",
        "test_tiered.py::test_through_another_fixture",
        "test_tiered.py::test_marked_by_hand",
    }
