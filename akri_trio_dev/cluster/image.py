"""`just image`: build akri-trio's container image and import it into the local node's containerd,
with no Docker daemon and no registry.

The machines this project runs on reach Debian's archive and PyPI but no image registry, so the
image users build from `Dockerfile` (on a public Python base) is built here from the same
Dockerfile on a base made offline: debootstrap writes a minimal Debian with Python, podman
imports that directory as a local image, podman builds the Dockerfile with `BASE` pointing at it
(pip inside gets the host's CA bundle as a build secret, never a layer), `podman save` writes a
docker-archive and `ctr images import` puts it where the kubelets look: into every running
node's containerd, so the chart's DaemonSets run on every node of `cluster up --nodes N`.

The image is tagged with a hash of everything that goes into it (`content_hash`), so a second
`just image` or a test fixture asking for the image finds it already imported and builds nothing.
Like the rest of `akri_trio_dev`, this is development tooling and is not in the image it builds.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from akri_trio_dev.cluster import procs
from akri_trio_dev.cluster.layout import Layout, NodeLayout
from akri_trio_dev.cluster.runner import extra_nodes

REPO = Path(__file__).resolve().parents[2]
IMAGE_REPOSITORY = "localhost/akri-trio"
BASE_IMAGE = "localhost/akri-trio-base:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What the base needs: the interpreter, venv for the builder stage, pyudev's libudev.so.1, and
# the CA bundle for HTTPS clients (ONVIF cameras, OPC UA servers) at run time.
BASE_PACKAGES = ("python3", "python3-venv", "libudev1", "ca-certificates")
# Trimmed from the debootstrap tree: nothing at run time reads them.
BASE_PRUNE = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/cache/debconf",
    "var/log",
)
HOST_TOOLS = {"podman": "podman", "debootstrap": "debootstrap"}
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

# The build context as .dockerignore leaves it: the files whose bytes decide the image.
CONTEXT_FILES = ("Dockerfile", ".dockerignore", "constraints.txt", "pyproject.toml", "README.md")
PACKAGE = "akri_trio"


class ImageError(Exception):
    """A step of the build or import failed; the message says which."""


def say(msg: str) -> None:
    print(f"[image] {msg}", flush=True)


# -- pure --------------------------------------------------------------------------------------
def _excluded(rel: str) -> bool:
    return "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo"))


def context_files(repo: Path) -> list[str]:
    """Repository-relative paths of every file the Dockerfile copies, sorted."""
    out = [name for name in CONTEXT_FILES if (repo / name).is_file()]
    for path in sorted((repo / PACKAGE).rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if path.is_file() and not _excluded(rel):
            out.append(rel)
    return out


def content_hash(files: Iterable[tuple[str, bytes]], base: str) -> str:
    """A short hash of (path, bytes) pairs and the base image name: the image's tag."""
    h = hashlib.sha256(f"base={base}\n".encode())
    for rel, data in sorted(files):
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def image_ref(repo: Path, base: str = BASE_IMAGE) -> str:
    files = [(rel, (repo / rel).read_bytes()) for rel in context_files(repo)]
    return f"{IMAGE_REPOSITORY}:{content_hash(files, base)}"


def build_command(
    *, repo: Path, ref: str, base: str, ca_bundle: Path | None, tags: Sequence[str] = ()
) -> list[str]:
    cmd = ["podman", "build", "--network=host", "--build-arg", f"BASE={base}", "-t", ref]
    for tag in tags:
        cmd += ["-t", tag]
    if ca_bundle is not None:
        cmd += ["--secret", f"id=cacert,src={ca_bundle}"]
    return [*cmd, "-f", str(repo / "Dockerfile"), str(repo)]


# -- I/O ---------------------------------------------------------------------------------------
def _run(cmd: Sequence[str], *, capture: bool = False) -> str:
    proc = subprocess.run(list(cmd), capture_output=capture, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or "").strip()[-2000:] if capture else "(output above)"
        raise ImageError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {detail}")
    return proc.stdout or ""


def ensure_host_tools() -> None:
    """podman (with buildah's engine) and debootstrap from Debian, when missing."""
    missing = [pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None]
    if not missing:
        return
    say(f"installing {' '.join(missing)} from Debian")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        if subprocess.run(cmd, env=env).returncode != 0:
            raise ImageError(f"`{' '.join(cmd)}` failed")


def podman_has(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref]).returncode == 0


def ensure_base(base: str = BASE_IMAGE) -> None:
    """A minimal Debian with BASE_PACKAGES as a local podman image, made once (~1 minute)."""
    if podman_has(base):
        return
    say(f"making the base {base} with debootstrap ({DEBIAN_SUITE}, minbase)")
    with tempfile.TemporaryDirectory(prefix="akri-trio-base-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        try:
            _make_base(root, base)
        finally:
            _unmount_under(root)  # debootstrap mounts /proc inside; never rmtree through it


def _unmount_under(root: Path) -> None:
    """Lazily unmount whatever a failed debootstrap left mounted below `root`, deepest first."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _make_base(root: Path, base: str) -> None:
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            DEBIAN_SUITE,
            str(root),
            DEBIAN_MIRROR,
        ],
        capture=True,
    )
    for rel in BASE_PRUNE:
        target = root / rel
        if target.is_dir():
            shutil.rmtree(target)
            target.mkdir()
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    assert tar.stdout is not None
    imported = subprocess.run(
        ["podman", "import", "--change", "CMD=/bin/bash", "-", base],
        stdin=tar.stdout,
        capture_output=True,
        text=True,
    )
    tar.stdout.close()
    if tar.wait() != 0 or imported.returncode != 0:
        raise ImageError(f"importing the base failed: {imported.stderr.strip()}")


def build(repo: Path, ref: str, base: str = BASE_IMAGE) -> None:
    ca = HOST_CA_BUNDLE if HOST_CA_BUNDLE.is_file() else None
    say(f"building {ref} from {repo / 'Dockerfile'} on {base}")
    _run(
        build_command(
            repo=repo, ref=ref, base=base, ca_bundle=ca, tags=[f"{IMAGE_REPOSITORY}:latest"]
        )
    )


def size_bytes(ref: str) -> int:
    return int(_run(["podman", "image", "inspect", "--format", "{{.Size}}", ref], capture=True))


def _ctr(lay: Layout, node: NodeLayout, *args: str, capture: bool = True) -> str:
    return _run(
        [str(lay.binary("ctr")), "--address", str(node.containerd_socket), "-n", "k8s.io", *args],
        capture=capture,
    )


def running_nodes(lay: Layout) -> list[NodeLayout]:
    """Every node whose containerd runs: node 1 and the extra nodes of `up --nodes N`. A
    DaemonSet's Pod on any of them finds the image there (pullPolicy Never)."""
    nodes = [lay.node(1), *extra_nodes(lay)]
    return [n for n in nodes if procs.running(lay.pid_file(n.containerd_process)) is not None]


def node_has(lay: Layout, node: NodeLayout, ref: str) -> bool:
    return ref in _ctr(lay, node, "images", "ls", "-q").split()


def import_into_nodes(lay: Layout, nodes: Sequence[NodeLayout], ref: str) -> None:
    """`podman save` (docker-archive, the format `ctr images import` reads) once, and import
    the archive into each node's containerd."""
    with tempfile.TemporaryDirectory(prefix="akri-trio-image-", dir="/var/tmp") as tmp:
        archive = Path(tmp) / "image.tar"
        _run(
            ["podman", "save", "--format", "docker-archive", "-o", str(archive), ref], capture=True
        )
        for node in nodes:
            _ctr(lay, node, "images", "import", str(archive))
            say(f"imported {ref} into {node.name}'s containerd (namespace k8s.io)")


def ensure_image(*, repo: Path = REPO, into_node: bool = True, lay: Layout | None = None) -> str:
    """The image for the tree at `repo`, built unless podman has it and imported into every
    running node's containerd that lacks it; returns its reference."""
    lay = lay or Layout.default()
    ref = image_ref(repo)
    lacking: list[NodeLayout] = []
    if into_node:
        nodes = running_nodes(lay)
        if not nodes:
            raise ImageError(
                "no node's containerd runs: `python -m akri_trio_dev cluster up --node`"
            )
        lacking = [n for n in nodes if not node_has(lay, n, ref)]
        if not lacking:
            return ref
    ensure_host_tools()
    if not podman_has(ref):
        ensure_base()
        build(repo, ref)
    if lacking:
        import_into_nodes(lay, lacking, ref)
    return ref


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m akri_trio_dev.cluster.image", description=__doc__)
    p.add_argument("--no-import", action="store_true", help="build only; leave the nodes alone")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        ref = ensure_image(into_node=not args.no_import)
    except ImageError as exc:
        print(f"[image] error: {exc}", file=sys.stderr)
        return 1
    say(f"{ref}: {size_bytes(ref) / 1e6:.0f} MB" if podman_has(ref) else ref)
    print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
