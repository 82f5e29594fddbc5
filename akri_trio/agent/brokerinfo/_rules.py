"""brokerInfo's decisions as plain functions: which files count, under which key, and what
happens to a workload's directory once its slot is freed. No I/O here (the disk edge is
`_disk.py`, the API edge `_sync.py`), so every rule below is tested without a cluster.

Key scheme: `<node>/<file name>`. Each node's agent writes only keys under its own node name,
by server-side apply with a field manager of its own (`brokerinfo-<node>`), so on a shared
Instance no node's entry can overwrite another's, and no write ever reads the whole map first.
Neither a node name nor a file name (the ConfigMap key alphabet, below) contains `/`.

A node's entries for an Instance come from ONE source at a time:
- while a workload of the Instance runs on the node (its slot is held), the files of the
  running workloads' directories (a name in two of them: the newer file wins);
- once none runs, the files the workloads that ended last left behind (`ended-*` directories):
  a Job's report outlives the Job. A new workload on the node replaces them (its directory
  starts empty), and so does a new Configuration generation (the controller replaces the Jobs
  of an older generation; their reports go with them).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

import attrs

from akri_trio.model import naming
from akri_trio.model.jsonpatch import pointer, remove_if_unchanged

KEY_SEPARATOR = naming.BROKER_INFO_SEPARATOR
node_entries = naming.node_broker_info  # the part of an Instance's brokerInfo a node writes
FIELD_MANAGER_PREFIX = "brokerinfo-"
# Bounds in the Instance CRD (k8s/crds/instance.yaml, spec.brokerInfo): the flags may not
# promise more than the API server accepts.
CRD_MAX_ENTRIES = 1024
CRD_MAX_VALUE_CHARS = 4096
# The most a node's entries on one Instance may be given by flag: an Instance is one etcd
# object (about 1.5 MiB at most) that every node serving it writes into.
MAX_NODE_BYTES = 256 * 1024
# A file name is a ConfigMap key: what `kubectl create configmap --from-file` accepts.
_FILE_NAME = re.compile(r"[-._a-zA-Z0-9]+")
MAX_NAME = 253
ENDED = "ended-"
SET_ASIDE = ".superseded"


def field_manager(node: str) -> str:
    return FIELD_MANAGER_PREFIX + node


def entry_key(node: str, file_name: str) -> str:
    return f"{node}{KEY_SEPARATOR}{file_name}"


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value}")


@attrs.frozen
class Limits:
    """Per workload directory (`max_files`, `max_file_bytes`, `max_total_bytes`), and per node
    on one Instance: what all of the node's directories of that Instance add up to
    (`max_node_entries`, and `max_node_bytes` of keys and values, UTF-8). Files over a limit
    are reported and skipped, never cut."""

    max_files: int = attrs.field(default=16, validator=_positive)
    max_file_bytes: int = attrs.field(default=1024, validator=_positive)
    max_total_bytes: int = attrs.field(default=4096, validator=_positive)
    max_node_entries: int = attrs.field(default=32, validator=_positive)
    max_node_bytes: int = attrs.field(default=8192, validator=_positive)

    def __attrs_post_init__(self) -> None:
        for name in ("max_files", "max_node_entries"):
            if getattr(self, name) > CRD_MAX_ENTRIES:
                raise ValueError(f"{name} is at most {CRD_MAX_ENTRIES} (the CRD's maxProperties)")
        if self.max_file_bytes > CRD_MAX_VALUE_CHARS:
            raise ValueError(
                f"max_file_bytes is at most {CRD_MAX_VALUE_CHARS} (the CRD's maxLength)"
            )
        if self.max_node_bytes > MAX_NODE_BYTES:
            raise ValueError(f"max_node_bytes is at most {MAX_NODE_BYTES} (one etcd object)")


@attrs.frozen
class FileRead:
    """One entry of a workload directory as the disk edge found it. `data` is None when the
    entry could not be taken (`problem` says why); at most `max_file_bytes + 1` bytes are read,
    so a longer file shows up as one byte too long."""

    name: str
    mtime: float
    data: bytes | None
    problem: str = ""


@attrs.frozen
class Selection:
    """The files of one directory that count (name -> (mtime, text)), and what was skipped."""

    files: Mapping[str, tuple[float, str]]
    problems: tuple[str, ...] = ()


def is_file_name(name: str) -> bool:
    return len(name) <= MAX_NAME and _FILE_NAME.fullmatch(name) is not None


def select(found: Iterable[FileRead], limits: Limits) -> Selection:
    """The files that go into brokerInfo, in name order until a limit is reached. Names that
    start with a dot are ignored without a report: write `.status.tmp`, then rename it to
    `status`, and the map never holds half a file."""
    kept: dict[str, tuple[float, str]] = {}
    problems: list[str] = []
    total = 0
    for f in sorted(found, key=lambda f: f.name):
        if f.name.startswith("."):
            continue
        if not is_file_name(f.name):
            problems.append(f"{f.name!r}: name is not [-._a-zA-Z0-9]{{1,{MAX_NAME}}}")
            continue
        if f.data is None:
            problems.append(f"{f.name!r}: {f.problem or 'unreadable'}")
            continue
        if len(f.data) > limits.max_file_bytes:
            problems.append(f"{f.name!r}: over {limits.max_file_bytes} bytes")
            continue
        try:
            text = f.data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{f.name!r}: not UTF-8")
            continue
        if len(kept) >= limits.max_files:
            problems.append(f"{f.name!r}: more than {limits.max_files} files")
            continue
        if total + len(f.data) > limits.max_total_bytes:
            problems.append(f"{f.name!r}: over {limits.max_total_bytes} bytes in all")
            continue
        total += len(f.data)
        kept[f.name] = (f.mtime, text)
    return Selection(kept, tuple(problems))


def merge(selections: Iterable[Selection]) -> dict[str, str]:
    """One node's files of one Instance: a name in several directories takes the newest file
    (the later directory on a tie)."""
    newest: dict[str, tuple[float, str]] = {}
    for sel in selections:
        for name, (mtime, text) in sel.files.items():
            if name not in newest or mtime >= newest[name][0]:
                newest[name] = (mtime, text)
    return {name: text for name, (_, text) in sorted(newest.items())}


def running_workloads(read: Iterable[tuple[str, Selection]]) -> dict[str, dict[str, str]]:
    """slot -> the files of the running workload holding it, from the directories read
    (directory name, selection); ended workloads' directories and problems are left out."""
    by_slot: dict[str, list[Selection]] = {}
    for name, selection in read:
        wd = parse_dir(name)
        if wd is not None and not wd.ended:
            by_slot.setdefault(wd.slot, []).append(selection)
    return {slot: merge(selections) for slot, selections in sorted(by_slot.items())}


def desired_entries(
    node: str, files: Mapping[str, str], limits: Limits
) -> tuple[dict[str, str], list[str]]:
    """This node's entries of one Instance from its merged `files`, in name order until the
    node's budget on the Instance is spent, and what did not fit."""
    entries: dict[str, str] = {}
    problems: list[str] = []
    total = 0
    for name, text in sorted(files.items()):
        key = entry_key(node, name)
        size = len(key.encode()) + len(text.encode())
        if len(entries) >= limits.max_node_entries:
            problems.append(f"{name!r}: more than {limits.max_node_entries} entries from {node}")
        elif total + size > limits.max_node_bytes:
            problems.append(f"{name!r}: over {limits.max_node_bytes} bytes from {node}")
        else:
            total += size
            entries[key] = text
    return entries, problems


def foreign_entries(
    broker_info: Mapping[str, str] | None, node: str, desired: Mapping[str, str]
) -> dict[str, str]:
    """Entries under this node's keys that its files do not account for, as they are after
    its apply: another field manager's (an apply never removes what it does not own)."""
    return {k: v for k, v in node_entries(broker_info, node).items() if k not in desired}


def removal_ops(entries: Mapping[str, str]) -> list[dict[str, object]]:
    """JSON patch removing `entries`, each only while it still has the value seen."""
    ops: list[dict[str, object]] = []
    for key, value in sorted(entries.items()):
        ops += remove_if_unchanged(pointer("spec", "brokerInfo", key), value)
    return ops


def apply_body(namespace: str, instance: str, entries: Mapping[str, str]) -> dict[str, object]:
    """This node's whole intent for the map. Keys it wrote before and leaves out are removed by
    the API server (they are its manager's alone). The body has no required spec fields, so
    it can never create an Instance that is gone: that write is refused instead. No entries:
    no `brokerInfo` at all (an empty map would be stored as null, which the schema refuses)."""
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": instance, "namespace": namespace},
        "spec": {"brokerInfo": dict(entries)} if entries else {},
    }


# --- workload directories ------------------------------------------------------------------------


@attrs.frozen
class WorkloadDir:
    """`[ended-]<slot>.g<generation>.<token>`. The token (random hex, one per Allocate) makes
    every workload's directory a name of its own: a copy pass that listed the directories
    before an Allocate can never rename or remove the directory that Allocate just made."""

    slot: str  # the deviceUsage key the workload holds (its lowest one, for several)
    generation: int  # the Configuration's generation at Allocate
    token: str
    ended: bool = False

    @property
    def name(self) -> str:
        return f"{ENDED if self.ended else ''}{self.slot}.g{self.generation}.{self.token}"


_DIR = re.compile(
    r"(?P<ended>ended-)?(?P<slot>.+)\.g(?P<gen>0|[1-9][0-9]{0,18})\.(?P<token>[0-9a-f]{1,32})"
)


def parse_dir(name: str) -> WorkloadDir | None:
    m = _DIR.fullmatch(name)
    if m is None:
        return None
    return WorkloadDir(m["slot"], int(m["gen"]), m["token"], m["ended"] is not None)


def superseded(names: Iterable[str], slot: str) -> list[str]:
    """The running-workload directories of `slot` in `names`: a new workload given that slot
    means the one before it has ended (the kubelet hands a device on when its container ends,
    before the reclaimer frees the slot), so they are set aside when the new one's directory
    is made."""
    return [
        name
        for name in names
        if (wd := parse_dir(name)) is not None and not wd.ended and wd.slot == slot
    ]


def set_aside(name: str) -> str:
    """What a superseded directory is renamed to: a name `parse_dir` refuses (the token is
    hex), so the next copy pass removes it like any unknown entry, in its worker thread."""
    return name + SET_ASIDE


@attrs.frozen
class DirPlan:
    """What to do with one Instance's directories on this node, and where its entries come
    from afterwards (directory names as they are once the plan is carried out)."""

    remove_all: bool = False  # `remove` is everything: the Instance's directory goes too
    end: tuple[tuple[str, str], ...] = ()  # (live name, ended name) to rename
    remove: tuple[str, ...] = ()
    report_from: tuple[str, ...] = ()


def plan_dirs(
    names: Iterable[str], *, held: Collection[str], serving: bool, generation: int | None
) -> DirPlan:
    """`names`: the Instance's directories; `held`: the deviceUsage keys this node holds on it;
    `serving`: the Instance exists and lists this node; `generation`: its Configuration's
    (None: gone). A workload whose slot is no longer held has ended: its directory is renamed
    `ended-*` (current generation) or removed (older). Any other name (a directory set aside
    at Allocate, anything else) is removed."""
    if not serving or generation is None:
        return DirPlan(remove_all=True, remove=tuple(sorted(names)))
    live: list[str] = []
    ended: dict[str, WorkloadDir] = {}
    end: list[tuple[str, str]] = []
    remove: list[str] = []
    for name in sorted(names):
        wd = parse_dir(name)
        if wd is None:
            remove.append(name)
        elif wd.ended:
            ended[wd.name] = wd
        elif wd.slot in held:
            live.append(name)
        elif wd.generation >= generation:
            done = attrs.evolve(wd, ended=True)
            end.append((name, done.name))
            ended[done.name] = done
        else:
            remove.append(name)
    kept_ended: list[str] = []
    for wd in ended.values():
        if live or wd.generation < generation:
            remove.append(wd.name)
        else:
            kept_ended.append(wd.name)
    # A renamed directory that is removed right away needs no rename.
    renames = tuple((a, b) for a, b in end if b not in remove)
    removes = tuple(dict.fromkeys([*remove, *(a for a, b in end if b in remove)]))
    return DirPlan(
        end=renames,
        remove=removes,
        report_from=tuple(live) if live else tuple(sorted(kept_ended)),
    )
