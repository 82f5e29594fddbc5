"""One owning test session per cluster home at a time.

A session that owns the local cluster (CI: it may start and stop it, and its tests stop nodes,
partition them and restart the API server) takes the home's lock exclusively; sessions that
share a running cluster on purpose (AKRI_TRIO_KEEP_CLUSTER) take it shared. A CI run started
while another session still uses the cluster therefore waits for it instead of interleaving its
node stops and partitions with the other's; the kernel drops the lock of a killed session, so a
crash never leaves it held.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "test-session.lock"
WAIT_S = 45 * 60  # longer than any session; a CI job's own limit still applies
POLL_S = 1.0


@contextmanager
def session_lock(home: Path, *, exclusive: bool, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold `home`'s test-session lock (exclusive or shared) for the `with` body; wait at most
    `wait_s` for other sessions, then raise TimeoutError naming the lock file."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, path, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, wait_s)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def _acquire(fd: int, path: Path, mode: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"another test session still holds {path} after {wait_s:.0f} s"
                ) from None
            if not told:
                print(f"waiting for another test session using {path.parent}", file=sys.stderr)
                told = True
            time.sleep(POLL_S)
