"""How big the image is that every node pulls and unpacks: issue 25 asks for <= 150 MB.

Builds this tree's image the way the tests do (`akri_trio_dev.cluster.image.ensure_image`,
podman on the debootstrap base; nothing is built when podman has it) and reports three sizes:
unpacked as podman counts it (`podman image inspect` .Size, the layer's tar), the sum of its
files, and gzip-compressed at level 6 (what a registry stores and a node downloads; the image is
one layer). Then where the bytes are: the base (the OS and the interpreter) against the venv,
and the venv's largest packages. A size is a measurement, so it is written here and in
RESULTS.md, never asserted by a test.

Usage: python -m bench.image_size [--ref REF] [--top 12] [--no-write]
"""

from __future__ import annotations

import argparse
import collections
import subprocess

from akri_trio_dev.cluster.image import ensure_image
from akri_trio_dev.cluster.image_contents import VENV, image_contents
from bench._common import machine, now, table, write_run

SITE = f"{VENV}lib/python3.11/site-packages/"


def mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def packages(files: dict[str, int]) -> collections.Counter[str]:
    """Bytes per top-level entry of site-packages (a package's dist-info counted apart)."""
    sizes: collections.Counter[str] = collections.Counter()
    for path, size in files.items():
        if path.startswith(SITE):
            sizes[path[len(SITE) :].split("/", 1)[0]] += size
    return sizes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ref", help="an image podman has (default: this tree's, built if missing)")
    p.add_argument("--top", type=int, default=12, help="how many of the venv's packages to list")
    p.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = p.parse_args()
    ref = args.ref or ensure_image(into_node=False)
    inspected = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", ref],
        capture_output=True,
        text=True,
        check=True,
    )
    contents = image_contents(ref, compressed=True)
    assert contents.gzip_bytes is not None
    venv = sum(size for path, size in contents.files.items() if path.startswith(VENV))
    sizes = [
        ("unpacked (podman .Size)", int(inspected.stdout)),
        ("files", contents.file_bytes),
        ("of which the venv", venv),
        ("of which the base", contents.file_bytes - venv),
        ("gzip-compressed (level 6)", contents.gzip_bytes),
    ]
    top = packages(contents.files).most_common(args.top)
    report = "\n".join(
        [
            f"### {now()}: image {ref}",
            "",
            f"{machine()}; {len(contents.files)} files, "
            f"{len(contents.unstripped)} unstripped ELF files in the venv",
            "",
            table(["image", "MB"], [(name, mb(n)) for name, n in sizes]),
            "",
            table(["venv package", "MB"], [(name, mb(n)) for name, n in top]),
        ]
    )
    print(report)
    if not args.no_write:
        write_run("image", report)


if __name__ == "__main__":
    main()
