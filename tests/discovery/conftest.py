"""Fixtures for discovery tests: short socket directories (AF_UNIX paths max out at 108 bytes,
which pytest's tmp_path can exceed) and a check that nothing is left behind."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="akd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
