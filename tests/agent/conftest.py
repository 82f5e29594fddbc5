"""Fixtures for agent tests against the real control plane."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from akri_trio.kube.client import Client
from tests.support.akri_cluster import install_crds, purge_akri


@pytest.fixture
async def akri(api: Client) -> AsyncIterator[Client]:
    """CRDs installed and no akri objects left over, before and after the test."""
    await install_crds(api)
    await purge_akri(api)
    yield api
    await purge_akri(api)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path is too deep."""
    with tempfile.TemporaryDirectory(prefix="ak", dir="/tmp") as d:
        yield Path(d)
