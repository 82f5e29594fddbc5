"""Letting a test's non-root process reach the checkout and its venv.

A clone made with `mktemp -d` (as CI makes one) is mode 0700: a process started as another user
cannot even find the venv's site-packages, so its Python runs without them. For the duration of
a test, `traversable_by_others` adds the search bit for others (o+x: enter, not list) to every
directory above the given paths that lacks it, and takes it away again afterwards.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def traversable_by_others(*paths: Path) -> Iterator[None]:
    opened: list[tuple[Path, int]] = []
    try:
        for path in paths:
            for directory in (path.resolve(), *path.resolve().parents):
                mode = directory.stat().st_mode
                if not mode & stat.S_IXOTH and directory not in (d for d, _ in opened):
                    os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)
                    opened.append((directory, stat.S_IMODE(mode)))
        yield
    finally:
        for directory, mode in reversed(opened):
            os.chmod(directory, mode)
