"""brokerInfo's file-system edge: workload directories under the agent's `--broker-info-dir`.

    <root>/<namespace>/<instance>/<slot>.g<generation>.<token>/        a running workload
    <root>/<namespace>/<instance>/ended-<slot>.g<generation>.<token>/  what an ended one left

Blocking calls, made from a worker thread (`trio.to_thread`) except at Allocate, which lists
the Instance's directory (the agent's entries only), renames the slot's earlier workload
directory aside and makes the new one: a few syscalls whatever a broker left behind, since
removing what it left is the copy pass's work. Everything a broker put in its directory is
untrusted: only entries the listing says are regular files are opened, without following
symlinks and without blocking, and a file that is not regular by then is not read; at most one
byte past the per-file limit is read, a directory's listing stops after a bound, and a tree is
removed without recursion or following a link, so a broker cannot make the agent open a device
node, read or remove the node's files, crash, or spend unbounded time or memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo._rules import (
    DirPlan,
    FileRead,
    Limits,
    WorkloadDir,
    set_aside,
    superseded,
)

# A listing longer than this is cut (and the cut reported through the file-count limit).
LISTING_FACTOR = 4


def instance_dir(root: Path, key: ObjectKey) -> Path:
    return root / key.namespace / key.name


def make_workload_dir(root: Path, key: ObjectKey, workload: WorkloadDir) -> Path:
    """An empty directory for a new workload, writable by any user the broker runs as (it is
    mounted into that workload only). The directories of the slot's earlier workloads are
    renamed aside (the next copy pass removes them)."""
    parent = instance_dir(root, key)
    parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    for name in superseded(_names(parent), workload.slot):
        with contextlib.suppress(FileNotFoundError):  # a copy pass ended it meanwhile
            os.rename(parent / name, parent / set_aside(name))
    path = parent / workload.name
    path.mkdir(mode=0o777)
    path.chmod(0o777)  # the umask narrowed mkdir's mode
    return path


def instance_dirs(root: Path, namespace: str | None) -> dict[ObjectKey, list[str]]:
    """Every Instance directory under `root` (one namespace's, or all) with its entries."""
    found: dict[ObjectKey, list[str]] = {}
    namespaces = [namespace] if namespace is not None else _names(root)
    for ns in namespaces:
        for inst in _names(root / ns):
            found[ObjectKey(ns, inst)] = _names(root / ns / inst)
    return found


def _names(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def carry_out(path: Path, plan: DirPlan) -> None:
    """Do what `plan` says in the Instance directory `path`."""
    for live, ended in plan.end:
        remove_tree(path / ended)
        with contextlib.suppress(FileNotFoundError):
            os.rename(path / live, path / ended)
    for name in plan.remove:
        remove_tree(path / name)
    if plan.remove_all:
        with contextlib.suppress(OSError):  # not empty: an Allocate made one meanwhile
            path.rmdir()
            path.parent.rmdir()  # the namespace's, once empty


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# How many directories deep a removal holds open; a deeper one is moved up to be removed later.
MAX_OPEN_DEPTH = 32
MAX_SCANS = 1024


def remove_tree(path: Path) -> None:
    """`path` and everything below it, as far as permissions allow (what cannot go stays).
    Unlike `shutil.rmtree`, which recurses, any depth: a broker may nest directories deeper
    than Python's recursion limit. Every call is relative to an open directory and never
    follows a symbolic link; `path` itself may be one (it is removed, not followed)."""
    try:
        parent = os.open(path.parent, _DIR_FLAGS)  # the agent's own directory
    except OSError:
        return
    try:
        _remove_in(parent, path.name)
    finally:
        os.close(parent)


def _remove_in(parent: int, name: str) -> None:
    top = _open_dir(parent, name)
    if top is None:  # gone, not a directory (a symbolic link), or not ours to open
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=parent)
        return
    try:
        # Each scan empties the tree down to MAX_OPEN_DEPTH and moves what is deeper into
        # `top`; the depths of what is left only go down, so the scans end (bounded all the
        # same: a broker still writing there may keep nesting; the next pass goes on).
        for _ in range(MAX_SCANS):
            if not _empty(top):
                break
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=parent)


def _empty(top: int) -> bool:
    """One depth-first pass over the directory `top`; True when it moved a directory up."""
    moved = False
    stack: list[tuple[str, int, Iterator[os.DirEntry[str]]]] = []
    fd, it = top, _scan(top)
    while True:
        entry = next(it, None)
        if entry is None:
            if not stack:
                return moved
            name, parent, parent_it = stack.pop()
            os.close(fd)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)
            fd, it = parent, parent_it
            continue
        if not _is_dir(entry):
            with contextlib.suppress(OSError):
                os.unlink(entry.name, dir_fd=fd)
        elif len(stack) >= MAX_OPEN_DEPTH:
            with contextlib.suppress(OSError):
                os.rename(
                    entry.name, f".deep-{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=top
                )
                moved = True
        else:
            child = _open_dir(fd, entry.name)
            if child is None:
                continue  # not ours to open: it stays
            stack.append((entry.name, fd, it))
            fd, it = child, _scan(child)


def _open_dir(parent: int, name: str) -> int | None:
    """The directory `name` in `parent`, opened to be emptied. One this process owns whose
    owner's permissions a broker took away (a broker running as root: an agent without
    CAP_DAC_OVERRIDE is held to them) gets them back first."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        if not _give_back(parent, name):
            return None
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError:
            return None
    except OSError:
        return None
    with contextlib.suppress(OSError):  # to remove what is in it
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o700 != 0o700:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)
    return fd


def _give_back(parent: int, name: str) -> bool:
    """u+rwx on the directory `name` in `parent` when this process owns it (one it cannot
    read: changed through an O_PATH descriptor, so never through a symbolic link)."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return False
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | 0o700)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _scan(fd: int) -> Iterator[os.DirEntry[str]]:
    """The entries of the open directory `fd`; an error ends the listing."""
    try:
        with os.scandir(fd) as it:
            yield from it
    except OSError:
        return


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _entries(path: Path, bound: int) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            for n, entry in enumerate(it):
                if n >= bound:
                    return
                yield entry
    except FileNotFoundError:
        return


def read_workload(path: Path, limits: Limits) -> list[FileRead]:
    """The entries of one workload directory, each read within the limits. OSError: the
    directory cannot be listed (a broker running as root may take its permissions away)."""
    out = []
    for entry in _entries(path, limits.max_files * LISTING_FACTOR + 16):
        if entry.name.startswith("."):
            continue
        out.append(_read(entry, limits.max_file_bytes + 1))
    return out


def _read(entry: os.DirEntry[str], most: int) -> FileRead:
    # The listing's type first: a device node a broker made is never opened.
    try:
        if entry.is_symlink():
            return FileRead(entry.name, 0.0, None, "a symbolic link")
        if not entry.is_file(follow_symlinks=False):
            return FileRead(entry.name, 0.0, None, "not a regular file")
    except OSError as exc:
        return FileRead(entry.name, 0.0, None, f"cannot open: {exc.strerror}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(entry.path, flags)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else f"cannot open: {exc.strerror}"
        return FileRead(entry.name, 0.0, None, why)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return FileRead(entry.name, st.st_mtime, None, "not a regular file")
        chunks = []
        left = most
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return FileRead(entry.name, st.st_mtime, b"".join(chunks))
    except OSError as exc:
        return FileRead(entry.name, 0.0, None, f"cannot read: {exc.strerror}")
    finally:
        os.close(fd)
