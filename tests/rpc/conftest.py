"""Fixtures for the purerpc glue tests: a tiny real DevicePlugin servicer, short socket paths,
and a grpcio kubelet stand-in running in its own process (so fd counts here are ours alone)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from tests.rpc.rpc_testing import KUBELET_SCRIPT, Kubelet, Plugin


@pytest.fixture
def plugin() -> Plugin:
    return Plugin()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory: AF_UNIX paths are limited to 107 bytes, pytest's tmp_path is long."""
    path = Path(tempfile.mkdtemp(prefix="rpc-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(sock_dir: Path) -> AsyncIterator[Kubelet]:
    path = sock_dir / "kubelet.sock"
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(KUBELET_SCRIPT), str(path)], stdout=subprocess.PIPE
    )
    try:
        kubelet = Kubelet(proc, path)
        with trio.fail_after(20):
            assert await kubelet.next_line() == "ready"
        yield kubelet
    finally:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
