"""Tests of a feature the oldest supported Kubernetes release lacks skip on it, saying why.

`@pytest.mark.k8s_feature("DRAExtendedResource")` on a test (or module) that needs a feature
gate on by default only in newer releases: on a cluster running an older one, the test is
skipped with a reason naming the gate, the release it arrives in and the release the cluster
runs (`scripts/just test-compat` runs the node, deploy and DRA tests on the oldest). A test that
needs the feature for one part only asks `lacks(cluster, gate)`, runs the rest, and skips at
the end with that reason.
The table is akri_trio_dev/cluster/releases.py's.

`scripts/just test-compat` runs `-m "node or compat"` on the oldest release: every test that
needs the node, plus the modules `COMPAT_MODULES` names (the deploy tier, every DRA module,
the cluster's own live checks), which `mark_compat` marks `compat` at collection.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import NoReturn

import pytest

from akri_trio_dev.cluster.releases import lacks_reason

MARKER = "k8s_feature"
TESTS = PurePath(__file__).parent.parent
# Modules (fnmatch globs under tests/, where `*` crosses directories) the oldest release runs
# beside the node tier.
COMPAT_MODULES = ("deploy/test_*.py", "*test_*dra*.py", "dev/test_cluster_live.py")


def is_compat_module(path: PurePath) -> bool:
    """Whether the test module at `path` (under tests/) runs on the oldest release too."""
    try:
        rel = path.relative_to(TESTS)
    except ValueError:
        return False
    return any(fnmatch.fnmatchcase(str(rel), glob) for glob in COMPAT_MODULES)


def mark_compat(items: Iterable[pytest.Item]) -> None:
    """Mark `compat` the tests of `COMPAT_MODULES` (before `-m` deselects)."""
    for item in items:
        if is_compat_module(item.path):
            item.add_marker("compat")


def marked_features(item: pytest.Item) -> list[str]:
    """The gates the `k8s_feature` markers of `item` (and its module and class) name."""
    return [str(gate) for mark in item.iter_markers(MARKER) for gate in mark.args]


def lacks(cluster: Mapping[str, str], *gates: str) -> str | None:
    """Why the cluster's release (`cluster env`'s AKRI_TRIO_K8S_VERSION) cannot show `gates`;
    None when it has them all."""
    return lacks_reason(cluster["AKRI_TRIO_K8S_VERSION"], gates)


def skip_without(cluster: Mapping[str, str], *gates: str) -> None:
    """Skip the running test when the cluster's release (`cluster env`'s
    AKRI_TRIO_K8S_VERSION) lacks one of `gates`."""
    reason = lacks(cluster, *gates)
    if reason is not None:
        skip(reason)


# pytest-trio 0.8 runs an async test inside a nursery and re-raises a skip from it as a bare
# `pytest.skip()`: the reason is lost. `skip` keeps it here, and `restore_skip_reason` (a
# makereport hook in tests/conftest.py) puts it back into the report.
_pending: list[str] = []


def skip(reason: str) -> NoReturn:
    """`pytest.skip(reason)`, with the reason kept also where an async test loses it."""
    _pending.append(reason)
    pytest.skip(reason)


def restore_skip_reason(report: pytest.TestReport) -> None:
    """A skipped report that says only "Skipped" gets the reason `skip` was given."""
    if _pending and report.skipped and isinstance(report.longrepr, tuple):
        path, line, message = report.longrepr
        if message == "Skipped":
            report.longrepr = (path, line, f"Skipped: {_pending[-1]}")
    if report.when == "teardown":
        _pending.clear()
