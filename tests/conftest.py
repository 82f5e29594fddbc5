"""Shared fixtures: the real local cluster, started once per test session.

Tests that need Kubernetes take `cluster` (control plane), `node_cluster` (plus kubelet and
containerd) or `multi_node_cluster` (three real nodes), and are marked `k8s` (and `node`) for it
at collection (tests/support/tiers.py), so `pytest -m "not k8s"` runs the pure and local tests
without starting Kubernetes.

These fixtures run `python -m akri_trio_dev cluster up` (which builds the binaries on a new
machine) and never skip: a cluster that cannot start fails the tests that need it. A cluster that
was already running (a developer's) is left running; one this session started is stopped at its
end, so a CI run leaves no processes, mounts or bridges behind — unless AKRI_TRIO_KEEP_CLUSTER is
set, for machines where several test sessions share one cluster. A session that owns the
cluster waits until no other session uses it (tests/support/session_lock.py).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator, Iterator

import pytest
from hypothesis import settings

from akri_trio.kube.client import Client
from akri_trio.kube.config import load_config
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster.exports import parse_exports
from akri_trio_dev.cluster.layout import Layout
from tests.support.releases import (
    mark_compat,
    marked_features,
    restore_skip_reason,
    skip_without,
)
from tests.support.session_lock import session_lock
from tests.support.tiers import mark_tiers

# Property tests assert behaviour, not speed (bench/ measures that): on two cores shared with the
# cluster, one slow example must not fail a test on hypothesis's default 200 ms deadline.
settings.register_profile("akri-trio", deadline=None)
settings.load_profile("akri-trio")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by `-m`
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tiers(items)
    mark_compat(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Skip reasons that pytest-trio drops are put back (tests/support/releases.py)."""
    report = yield
    restore_skip_reason(report)
    return report


def _cli(*args: str) -> str:
    proc = run_cluster_command(*args, capture_output=True)
    if proc.returncode != 0:
        pytest.fail(
            f"python -m akri_trio_dev cluster {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}",
            pytrace=False,
        )
    return proc.stdout


def _env() -> dict[str, str]:
    """`python -m akri_trio_dev cluster env` prints `export KEY='value'` lines (KUBECONFIG, ...)."""
    return parse_exports(_cli("env"))


def _running() -> bool:
    return run_cluster_command("status", capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    """The control plane (etcd, apiserver, controller-manager, scheduler); its `env` as a dict.
    Held under the cluster home's session lock (tests/support/session_lock.py): exclusive,
    unless AKRI_TRIO_KEEP_CLUSTER says this session shares the cluster."""
    keep = bool(os.environ.get("AKRI_TRIO_KEEP_CLUSTER"))
    with session_lock(Layout.default().home, exclusive=not keep):
        was_running = _running()
        _cli("up")
        env = _env()
        os.environ.setdefault("KUBECONFIG", env["KUBECONFIG"])
        yield env
        if not was_running and not keep:
            _cli("down")


@pytest.fixture(autouse=True)
def _k8s_features(request: pytest.FixtureRequest) -> None:
    """A test marked `k8s_feature(GATE, ...)` skips on a release without GATE on by default
    (tests/support/releases.py); unmarked tests never look at the cluster here."""
    gates = marked_features(request.node)
    if gates:
        skip_without(request.getfixturevalue("cluster"), *gates)


@pytest.fixture
async def api(cluster: dict[str, str]) -> AsyncIterator[Client]:
    """A kube Client on the local cluster, for one test."""
    async with Client.open(load_config(cluster["KUBECONFIG"])) as client:
        yield client


@pytest.fixture(scope="session")
def node_cluster(cluster: dict[str, str]) -> Iterator[dict[str, str]]:
    """The control plane plus a Ready node (containerd, kubelet, CNI, local images)."""
    _cli("up", "--node")
    yield _env()


MULTI_NODE_COUNT = 3


@pytest.fixture(scope="session")
def multi_node_cluster(node_cluster: dict[str, str]) -> Iterator[list[dict[str, str]]]:
    """Three real nodes (`up --nodes 3` only adds what is missing): each node's `env --node`,
    node 1 first. Nodes 2 and 3 carry the extra-node taint: a Pod meant for them tolerates it
    (`akri_trio_dev.cluster.layout.EXTRA_NODE_TOLERATION`)."""
    _cli("up", "--nodes", str(MULTI_NODE_COUNT))
    names = _env()["AKRI_TRIO_NODES"].split()
    assert len(names) >= MULTI_NODE_COUNT, names
    yield [parse_exports(_cli("env", "--node", name)) for name in names[:MULTI_NODE_COUNT]]
