"""The node's own devices, which no tenant's Configuration may be handed unless an admin allows it.

Device plugins are not checked by Pod Security Admission: a Configuration whose udev rule
matches `KERNEL=="vda"` or `KERNEL=="kmsg"` would give its brokers (and any Pod that asks for
the resource) the node's root disk or kernel log with `rwm`. So every device node and mount a
handler sends is checked against what the node itself uses, and refused by default:

- `block`: block devices holding a mounted filesystem (by device number, from
  /proc/self/mountinfo and /proc/1/mountinfo), swap (/proc/swaps), members of an LVM, RAID,
  dm-crypt or other stacked device (a non-empty /sys/block/*/holders), and a disk one of whose
  partitions is any of these;
- `kernel`: /dev/mem, /dev/kmem, /dev/port (physical memory and I/O ports), /dev/kmsg;
- `console`: /dev/console, /dev/tty, the virtual consoles /dev/tty<N> and /dev/vcs*,
  /dev/ptmx and /dev/pts/*, and the consoles the kernel writes to
  (/sys/class/tty/console/active, e.g. a VM's ttyS0). Other serial ports stay available.

A cluster admin allows classes per namespace (`--allow-host-devices NAMESPACE:CLASS`, `*` for
every namespace, `all` for every class). Paths are compared as the handler names them
(`/dev/vda`, `/dev/mapper/<name>` for a device-mapper device) and, where the agent can stat
the path, by device number, so an alias such as /dev/disk/by-uuid/... is caught too when the
agent sees the node's /dev. The facts are read when a handler's list with device nodes or
mounts arrives.

Layout: parsing and the decision are pure functions of text and plain data; `read_node_facts`,
`device_number` and `host_check` at the bottom are the I/O edge.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

CLASSES: Final = ("block", "kernel", "console")
ALL: Final = "all"
EVERY_NAMESPACE: Final = "*"
KERNEL_DEVICES: Final = {
    "/dev/mem": "physical memory",
    "/dev/kmem": "kernel memory",
    "/dev/port": "the I/O ports",
    "/dev/kmsg": "the kernel log",
}
_CONSOLE: Final = re.compile(r"/dev/(?:console|tty|tty[0-9]+|vcs[a-z]*[0-9]*|ptmx|pts(?:/.*)?)")

# An allowance: namespace (or "*") -> the classes it may use.
Allowances = Mapping[str, frozenset[str]]
# Where an agent stats a path: its "major:minor" when it is a device node it can see, else None.
NumberOf = Callable[[str], str | None]


@attrs.frozen
class BlockDevice:
    """One entry of /sys/block (or a partition below one)."""

    name: str  # as in /sys/block: "vda", "vda1", "dm-0" ("!" already turned into "/")
    number: str  # "major:minor"
    disk: str | None = None  # a partition's disk
    holders: tuple[str, ...] = ()  # devices stacked on this one (dm-0, md0)
    aliases: tuple[str, ...] = ()  # other /dev paths the kernel names it by (/dev/mapper/x)


@attrs.frozen
class NodeFacts:
    """What the node uses: critical block device paths and numbers with their reason, and the
    consoles the kernel writes to."""

    block: Mapping[str, str] = attrs.field(factory=dict)  # "/dev/vda" -> why
    numbers: Mapping[str, str] = attrs.field(factory=dict)  # "254:0" -> "/dev/vda"
    consoles: frozenset[str] = frozenset()


# ---- parsing (pure) ------------------------------------------------------------------------


def _unescape(field: str) -> str:
    """mountinfo and /proc/swaps write space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def parse_mountinfo(text: str) -> dict[str, str]:
    """Device number -> the first mount point it holds, from /proc/<pid>/mountinfo."""
    mounted: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and re.fullmatch(r"[0-9]+:[0-9]+", fields[2]):
            mounted.setdefault(fields[2], _unescape(fields[4]))
    return mounted


def parse_swaps(text: str) -> list[str]:
    """The swap areas' file names (devices or files) from /proc/swaps."""
    return [_unescape(line.split()[0]) for line in text.splitlines()[1:] if line.strip()]


def parse_consoles(text: str) -> frozenset[str]:
    """/sys/class/tty/console/active ("tty0 ttyS0") as /dev paths."""
    return frozenset(f"/dev/{name}" for name in text.split())


def parse_allowances(entries: Iterable[str]) -> Allowances:
    """`NAMESPACE:CLASS` entries (CLASS one of CLASSES or `all`; NAMESPACE may be `*`) as a
    mapping; ValueError naming the entry that is wrong."""
    allowed: dict[str, set[str]] = {}
    for entry in entries:
        namespace, sep, cls = entry.partition(":")
        if not sep or not namespace or cls not in (*CLASSES, ALL):
            raise ValueError(
                f"{entry!r} is not NAMESPACE:CLASS with CLASS one of {', '.join(CLASSES)}, {ALL}"
            )
        allowed.setdefault(namespace, set()).update(CLASSES if cls == ALL else (cls,))
    return {ns: frozenset(classes) for ns, classes in allowed.items()}


def allowed_classes(allowances: Allowances, namespace: str) -> frozenset[str]:
    return allowances.get(namespace, frozenset()) | allowances.get(EVERY_NAMESPACE, frozenset())


# ---- the decision (pure) -------------------------------------------------------------------


def node_facts(
    blocks: Sequence[BlockDevice],
    mounted: Mapping[str, str],
    swap_numbers: Iterable[str] = (),
    swap_paths: Iterable[str] = (),
    consoles: frozenset[str] = frozenset(),
) -> NodeFacts:
    """Which block devices the node uses, and why. `mounted`: device number -> mount point;
    swap areas by device number (where they could be stat'ed) or by path."""
    swap_numbers, swap_paths = set(swap_numbers), set(swap_paths)
    reasons: dict[str, str] = {}
    for b in blocks:
        paths = {f"/dev/{b.name}", *b.aliases}
        if b.number in mounted:
            reasons[b.name] = f"it holds the node's filesystem mounted at {mounted[b.number]}"
        elif b.number in swap_numbers or paths & swap_paths:
            reasons[b.name] = "it is the node's swap"
        elif b.holders:
            reasons[b.name] = f"it is a member of {', '.join(sorted(b.holders))} (LVM/RAID/dm)"
    for b in blocks:  # a disk is as critical as any of its partitions
        if b.disk is not None and b.name in reasons and b.disk not in reasons:
            reasons[b.disk] = f"its partition {b.name}: {reasons[b.name]}"
    block: dict[str, str] = {}
    numbers: dict[str, str] = {}
    for b in blocks:
        if b.name in reasons:
            for path in (f"/dev/{b.name}", *b.aliases):
                block[path] = reasons[b.name]
            numbers[b.number] = f"/dev/{b.name}"
    return NodeFacts(block=block, numbers=numbers, consoles=consoles)


def refusal(
    path: str, facts: NodeFacts, allowed: frozenset[str], number: str | None = None
) -> str | None:
    """Why host `path` (a device node or mount a handler sent) may not be handed out, or None.
    `number` is the path's device number where the agent could stat it."""
    why: tuple[str, str] | None = None
    if path in facts.block:
        why = "block", facts.block[path]
    elif number is not None and number in facts.numbers:
        disk = facts.numbers[number]
        why = "block", f"it is {disk}: {facts.block[disk]}"
    elif path in KERNEL_DEVICES:
        why = "kernel", f"it is {KERNEL_DEVICES[path]}"
    elif _CONSOLE.fullmatch(path) or path in facts.consoles:
        why = "console", "it is one of the node's consoles or terminals"
    if why is None or why[0] in allowed:
        return None
    cls, reason = why
    return (
        f"host path {path!r} is a host-critical device ({reason}); an admin may allow the "
        f"namespace with the agent's --allow-host-devices NAMESPACE:{cls}"
    )


# ---- the node (I/O edge) -------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _block_device(entry: Path, disk: str | None) -> BlockDevice | None:
    number = _read(entry / "dev").strip()
    if not number:
        return None
    try:
        holders = tuple(sorted(os.listdir(entry / "holders")))
    except OSError:
        holders = ()
    dm_name = _read(entry / "dm" / "name").strip()
    return BlockDevice(
        name=entry.name.replace("!", "/"),
        number=number,
        disk=disk,
        holders=holders,
        aliases=(f"/dev/mapper/{dm_name}",) if dm_name else (),
    )


def device_number(path: str) -> str | None:
    """The "major:minor" of a device node the agent can see at `path` (links followed)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not (stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        return None
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def read_node_facts(sys: Path = Path("/sys"), proc: Path = Path("/proc")) -> NodeFacts:
    """The node's facts as this process sees them (sysfs and procfs are the node's, also in a
    container; mountinfo is this process's and PID 1's)."""
    blocks: list[BlockDevice] = []
    try:
        disks = sorted((sys / "block").iterdir())
    except OSError:
        disks = []
    for entry in disks:
        disk = _block_device(entry, None)
        if disk is None:
            continue
        blocks.append(disk)
        for child in sorted(entry.iterdir()) if entry.is_dir() else ():
            if (child / "partition").exists():
                part = _block_device(child, disk.name)
                if part is not None:
                    blocks.append(part)
    mounted = parse_mountinfo(_read(proc / "1" / "mountinfo"))
    mounted.update(parse_mountinfo(_read(proc / "self" / "mountinfo")))
    swaps = parse_swaps(_read(proc / "swaps"))
    swap_numbers = set()
    for swap in swaps:
        try:
            st = os.stat(swap)
        except OSError:
            continue
        dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
        swap_numbers.add(f"{os.major(dev)}:{os.minor(dev)}")
    consoles = parse_consoles(_read(sys / "class" / "tty" / "console" / "active"))
    return node_facts(blocks, mounted, swap_numbers, swaps, consoles)


def host_check(allowances: Allowances, namespace: str) -> Callable[[str], str | None]:
    """The check for one Configuration's namespace. The node's facts are read at its first
    call (a list of devices without device nodes or mounts, debugEcho's, costs no reads)."""
    allowed = allowed_classes(allowances, namespace)
    facts: list[NodeFacts] = []

    def check(path: str) -> str | None:
        if not facts:
            facts.append(read_node_facts())
        return refusal(path, facts[0], allowed, device_number(path))

    return check
