"""The dashboard's messages: a full picture first, then only what changed. Pure, no I/O.

A page kept open for hours on a cluster with hundreds of Instances should not receive the whole
picture (every slot of every Instance) each time one Pod changes phase. The picture's three
lists (`configurations`, `instances`, `nodes`) are keyed (namespace/name, or name for nodes), so
a change is the entries to put and the keys to drop, per list. `apply` is what the page's script
does with a change; the tests hold `apply(old, diff(old, new)) == new`, which is how the page
stays equal to the server's picture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["LISTS", "apply", "diff", "key", "snapshot"]

JSON = dict[str, Any]
LISTS = ("configurations", "instances", "nodes")


def key(entry: Mapping[str, Any]) -> str:
    """An entry's key within its list: namespace/name, or name for a Node."""
    if "namespace" in entry:
        return f"{entry['namespace']}/{entry['name']}"
    return str(entry["name"])


def snapshot(pic: Mapping[str, Any]) -> JSON:
    """The first message on a connection: the whole picture."""
    return {"type": "snapshot", "picture": dict(pic)}


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> JSON | None:
    """The change message taking `old` to `new`, or None when nothing changed.

    `{"type": "change", "put": {list: [entry, ...]}, "drop": {list: [key, ...]}}`, with a list
    present only when something in it changed."""
    put: JSON = {}
    drop: JSON = {}
    for name in LISTS:
        before = {key(e): e for e in old.get(name, [])}
        after = {key(e): e for e in new.get(name, [])}
        changed = [e for k, e in after.items() if before.get(k) != e]
        gone = sorted(k for k in before if k not in after)
        if changed:
            put[name] = changed
        if gone:
            drop[name] = gone
    if not put and not drop:
        return None
    return {"type": "change", "put": put, "drop": drop}


def apply(pic: Mapping[str, Any], change: Mapping[str, Any]) -> JSON:
    """The picture after a change message (a snapshot message replaces it). Entries stay
    sorted by key, as `picture` sorts them."""
    if change.get("type") == "snapshot":
        return dict(change["picture"])
    out: JSON = dict(pic)
    for name in LISTS:
        entries = {key(e): e for e in pic.get(name, [])}
        for gone in change.get("drop", {}).get(name, []):
            entries.pop(gone, None)
        for entry in change.get("put", {}).get(name, []):
            entries[key(entry)] = entry
        out[name] = [entries[k] for k in sorted(entries)]
    return out
