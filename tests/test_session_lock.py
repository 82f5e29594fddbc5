"""tests/support/session_lock.py: an owning session excludes every other; sharing sessions
coexist; a killed holder's lock is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.session_lock import session_lock

HOLD = """
import sys, time
from pathlib import Path
from tests.support.session_lock import session_lock
with session_lock(Path(sys.argv[1]), exclusive=sys.argv[2] == "ex"):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(home: Path, kind: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home), kind], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_an_owning_session_waits_for_a_sharing_one_and_times_out(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "sh")
    try:
        with (
            pytest.raises(TimeoutError, match=r"test-session\.lock"),
            session_lock(tmp_path, exclusive=True, wait_s=0),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_sharing_sessions_hold_the_lock_together(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "sh")
    try:
        with session_lock(tmp_path, exclusive=False, wait_s=0):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_owner_leaves_the_lock_free(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "ex")
    with pytest.raises(TimeoutError), session_lock(tmp_path, exclusive=False, wait_s=0):
        pass
    holder.kill()
    holder.wait()
    with session_lock(tmp_path, exclusive=True, wait_s=0):
        pass
