"""Detached processes tracked by PID file: start, find, stop.

The cluster outlives the `python -m akri_trio_dev cluster up` that started it, so each process runs
in its own session (start_new_session) with output to a log file, and a PID file records it. A PID
file holds "<pid> <start time>" (field 22 of /proc/<pid>/stat): a recycled PID has another start
time, so `down` can never signal a stranger. Zombies count as dead: once the CLI exits, our children
are reparented to an init that may not reap them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs


@attrs.frozen
class ProcRecord:
    pid: int
    start_time: int

    def render(self) -> str:
        return f"{self.pid} {self.start_time}\n"

    @classmethod
    def parse(cls, text: str) -> ProcRecord | None:
        parts = text.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return None
        return cls(int(parts[0]), int(parts[1]))


def parse_stat(text: str) -> tuple[str, int]:
    """(state, start time) from /proc/<pid>/stat; the comm field may contain spaces and ')'."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 (starttime) is rest[19].
    return rest[0], int(rest[19])


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def record_for(pid: int) -> ProcRecord | None:
    st = _stat(pid)
    return None if st is None else ProcRecord(pid, st[1])


def is_alive(rec: ProcRecord) -> bool:
    st = _stat(rec.pid)
    return st is not None and st[1] == rec.start_time and st[0] not in ("Z", "X")


def read_record(pid_file: Path) -> ProcRecord | None:
    try:
        return ProcRecord.parse(pid_file.read_text())
    except OSError:
        return None


def running(pid_file: Path) -> ProcRecord | None:
    """The live process a PID file names, or None (a stale file is left for the caller)."""
    rec = read_record(pid_file)
    return rec if rec is not None and is_alive(rec) else None


def spawn(
    argv: Sequence[str],
    *,
    pid_file: Path,
    log_file: Path,
    env: Mapping[str, str] | None = None,
) -> ProcRecord:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        log.write(f"\n==== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=dict(env) if env is not None else None,
        )
    rec = record_for(proc.pid)
    if rec is None:
        proc.wait()
        raise RuntimeError(f"{argv[0]} exited at once (exit {proc.returncode}); see {log_file}")
    pid_file.write_text(rec.render())
    return rec


def stop(rec: ProcRecord, *, grace: float = 10.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL; returns when the process is gone."""
    if not is_alive(rec):
        return
    _signal(rec, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while is_alive(rec) and time.monotonic() < deadline:
        time.sleep(0.05)
    if is_alive(rec):
        _signal(rec, signal.SIGKILL)
        while is_alive(rec):
            time.sleep(0.05)


def _signal(rec: ProcRecord, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(rec.pid, sig)


def port_conflicts(ports: Mapping[str, int], host: str = "127.0.0.1") -> list[str]:
    """One message per port in `ports` (label -> port) that something already listens on.

    Binding is the only honest test: a connect() probe misses sockets bound but not listening.
    """
    taken = []
    for label, port in ports.items():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        except OSError as exc:
            taken.append(
                f"port {port} ({label}) is already in use by another process: {exc.strerror}"
            )
        finally:
            s.close()
    return taken


def cmdline(pid: int) -> str:
    """The command line of `pid` with NULs as spaces ("" if it is gone)."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def find_exact(argv: Sequence[str]) -> ProcRecord | None:
    """A live process whose command line is exactly `argv` (to adopt one that lost its PID
    file, e.g. when two `up`/`down` raced before the state lock existed)."""
    want = "\0".join(argv).encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() != want:
                continue
        except OSError:
            continue
        rec = record_for(int(entry.name))
        if rec is not None and is_alive(rec):
            return rec
    return None


def find_processes(exe_name: str, needle: str) -> list[ProcRecord]:
    """Processes whose argv[0] ends with `exe_name` and whose command line contains `needle`.

    Used only for containerd shims, which containerd starts detached: we recognise ours by the
    containerd socket address in their command line, never by name alone.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].decode(errors="replace").endswith(exe_name):
            continue
        if needle.encode() not in b" ".join(argv):
            continue
        rec = record_for(int(entry.name))
        if rec is not None and is_alive(rec):
            found.append(rec)
    return found
