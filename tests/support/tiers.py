"""Tier markers from the fixtures a test uses, so `pytest -m "not k8s"` never starts Kubernetes.

A test that takes the `cluster` fixture (directly or through another fixture) needs the real
control plane: it is marked `k8s`; one that takes `node_cluster` needs the node too: `node` and
`k8s`. Marking by hand missed modules; the fixture closure pytest computes cannot.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

# fixture -> the markers every test using it gets
TIER_MARKERS: dict[str, tuple[str, ...]] = {
    "cluster": ("k8s",),
    "node_cluster": ("k8s", "node"),
}


def tier_markers(fixture_names: Iterable[str]) -> set[str]:
    """The markers a test whose fixture closure is `fixture_names` must carry."""
    return {marker for name in fixture_names for marker in TIER_MARKERS.get(name, ())}


def mark_tiers(items: Iterable[pytest.Item]) -> None:
    """Add the missing tier markers to each collected test (before `-m` deselects)."""
    for item in items:
        have = {mark.name for mark in item.iter_markers()}
        for marker in sorted(tier_markers(getattr(item, "fixturenames", ())) - have):
            item.add_marker(marker)
