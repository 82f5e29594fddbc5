"""What is inside a built image: every regular file with its size, which of the venv's ELF files
still carry a symbol table, and how big the image is gzip-compressed, as a registry stores it.

An edge board pulls and unpacks the image on every node, and it runs code, so what it holds is
checked, not assumed: tests/deploy/test_image.py asserts what must not be in it (the
development package, compilers, test and build tools, caches, source without bytecode) and
bench/image_size.py measures it. The image is read as `podman export` streams it, from a
container that is created and never started: nothing in it runs and nothing is mounted.
"""

from __future__ import annotations

import io
import struct
import subprocess
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from typing_extensions import Buffer

SHT_SYMTAB = 2
# where the Dockerfile puts the application's venv: our build step's files
VENV = "opt/akri-trio/"


@dataclass(frozen=True)
class Contents:
    files: dict[str, int]  # image path (no leading "/") -> size in bytes, regular files only
    unstripped: list[str]  # ELF files under VENV that still have a symbol table, sorted
    gzip_bytes: int | None  # the exported tree gzip-compressed (level 6), when asked for

    @property
    def file_bytes(self) -> int:
        return sum(self.files.values())


def has_symbol_table(elf: bytes) -> bool:
    """Whether `elf` (a whole ELF file) still has a SHT_SYMTAB section, the one
    `strip --strip-unneeded` removes; the loader's dynamic symbols are in `.dynsym` and stay.
    Anything that is not ELF has none."""
    if elf[:4] != b"\x7fELF" or len(elf) < 0x40:
        return False
    order = "<" if elf[5] == 1 else ">"
    if elf[4] == 2:  # ELFCLASS64
        (shoff,) = struct.unpack_from(order + "Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", elf, 0x3A)
    else:
        (shoff,) = struct.unpack_from(order + "I", elf, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", elf, 0x2E)
    return any(
        struct.unpack_from(order + "I", elf, shoff + i * shentsize + 4)[0] == SHT_SYMTAB
        for i in range(shnum)
        if shoff + i * shentsize + 8 <= len(elf)
    )


class _Gzipped(io.RawIOBase):
    """A read-only stream that counts the gzip size of what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
        self.size = 0
        self.finished = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Buffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self.raw.read(len(view))
        view[: len(data)] = data
        if data:
            self.size += len(self.deflate.compress(data))
        elif not self.finished:
            self.size += len(self.deflate.flush())
            self.finished = True
        return len(data)


@contextmanager
def _exported(ref: str) -> Iterator[IO[bytes]]:
    """The image's root filesystem as a tar stream, from a container created (never started)."""
    created = subprocess.run(["podman", "create", ref], capture_output=True, text=True)
    if created.returncode != 0:
        raise RuntimeError(f"podman create {ref}: {created.stderr.strip()}")
    container = created.stdout.strip().splitlines()[-1]
    try:
        proc = subprocess.Popen(["podman", "export", container], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            yield proc.stdout
        finally:
            proc.stdout.close()
            if proc.wait() not in (0, -13):  # -13: we stopped reading (SIGPIPE)
                raise RuntimeError(f"podman export {ref} failed ({proc.returncode})")
    finally:
        subprocess.run(["podman", "rm", "-f", container], capture_output=True)


def image_contents(ref: str, *, compressed: bool = False) -> Contents:
    """Every regular file of the podman image `ref`; with `compressed`, also the gzip size of
    the whole tree (a registry's layer; the image is one layer)."""
    files: dict[str, int] = {}
    unstripped: list[str] = []
    with _exported(ref) as raw:
        counted = _Gzipped(raw) if compressed else None
        stream = io.BufferedReader(counted) if counted is not None else raw
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                path = member.name.removeprefix("./").lstrip("/")
                files[path] = member.size
                if path.startswith(VENV) and ".so" in path.rsplit("/", 1)[-1]:
                    data = tar.extractfile(member)
                    if data is not None and has_symbol_table(data.read()):
                        unstripped.append(path)
        if compressed:  # the rest of the stream: tar's end-of-archive padding
            while stream.read(1 << 20):
                pass
    gzip_bytes = counted.size if counted is not None else None
    return Contents(files=files, unstripped=sorted(unstripped), gzip_bytes=gzip_bytes)
