"""What `down` must undo, decided from plain data (mount table, PID files found).

The kubelet bind-mounts /var/lib/kubelet onto itself and adds a tmpfs per secret volume;
containerd adds rootfs and shm mounts under its state directory; CNI leaves a bind-mounted
network namespace per sandbox in /run/netns. Unmounting must go deepest first, and a path
mounted twice (the kubelet's self bind mount) must be unmounted twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from akri_trio_dev.cluster.layout import CONTROL_PLANE, NODE_PROCESSES

# Reverse start order: node first (its pods, then kubelet, then containerd), control plane last.
STOP_ORDER: tuple[str, ...] = ("kubelet", "containerd", *reversed(CONTROL_PLANE))
assert set(STOP_ORDER) == set(CONTROL_PLANE) | set(NODE_PROCESSES)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str) -> list[str]:
    """Mount points from /proc/self/mountinfo text, in table order (oldest first)."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            points.append(_unescape(fields[4]))
    return points


def _under(path: str, root: str) -> bool:
    p, r = PurePosixPath(path), PurePosixPath(root)
    return p == r or r in p.parents


def _is_cni_netns(path: str, netns_dir: str) -> bool:
    p = PurePosixPath(path)
    return p.parent == PurePosixPath(netns_dir) and p.name.startswith("cni-")


def unmount_plan(mountinfo: str, roots: Iterable[str], netns_dir: str = "/run/netns") -> list[str]:
    """Mount points to unmount, in a safe order: deepest path first, newest mount first.

    A path appears once per mount stacked on it. CNI network namespaces (/run/netns/cni-*)
    are included; other namespaces in /run/netns are not ours.
    """
    roots = list(roots)
    points = mount_points(mountinfo)
    chosen = [
        (i, p)
        for i, p in enumerate(points)
        if any(_under(p, r) for r in roots) or _is_cni_netns(p, netns_dir)
    ]
    chosen.sort(key=lambda ip: (len(PurePosixPath(ip[1]).parts), ip[0]), reverse=True)
    return [p for _, p in chosen]


def stop_plan(running: Sequence[str]) -> list[str]:
    """The processes to stop, in order, among those found running."""
    alive = set(running)
    return [name for name in STOP_ORDER if name in alive]
