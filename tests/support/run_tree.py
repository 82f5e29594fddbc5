"""Reading a run module's docstring tree, and checking it against the tasks that run.

`run_agent` and `run_controller` each draw their nursery tree in their module docstring; their
tree tests (tests/agent/test_run_tree.py, tests/controller/test_run_tree.py) parse the drawing
here and walk the running task tree with `assert_runs_drawn_tree`.
"""

from __future__ import annotations

import re

import trio

from tests.support.cancellation import all_tasks

_BRANCH = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<label>.*)$")
_NOTE = re.compile(r"^(?P<indent>[ │]*)│ +(?P<text>\S.*)$")


def drawn_tree(doc: str) -> dict[str, list[tuple[str, bool]]]:
    """Parent name -> its drawn children as (name, only in DRA mode). A branch's names are the
    comma-separated text before its first double space; the siblings after a note that says
    "DRA mode" are DRA mode's."""
    lines = doc.split("\n")
    first = next(i for i, line in enumerate(lines) if _BRANCH.match(line))
    root = lines[first - 1].strip()
    parents: dict[int, str] = {0: root}
    dra_from: set[int] = set()
    tree: dict[str, list[tuple[str, bool]]] = {}
    for line in lines:
        branch = _BRANCH.match(line)
        if branch is None:
            note = _NOTE.match(line)
            if note is not None and "DRA mode" in note["text"]:
                dra_from.add(len(note["indent"]) // 4)
            continue
        depth = len(branch["indent"]) // 4
        label = branch["label"].split("  ", 1)[0].strip()
        names = [name.strip() for name in label.split(",")]
        for name in names:
            tree.setdefault(parents[depth - 1], []).append((name, depth in dra_from))
        parents[depth] = names[-1]
    return tree


def _children(task: trio.lowlevel.Task) -> dict[str, trio.lowlevel.Task]:
    # A task started from a partial of a module's function is named module.function.
    return {
        child.name.rsplit(".", 1)[-1] if "/" not in child.name else child.name: child
        for nursery in task.child_nurseries
        for child in nursery.child_tasks
    }


def assert_runs_drawn_tree(tree: dict[str, list[tuple[str, bool]]], root: str) -> None:
    """The task named `root` (the only one) runs the tree drawn under it, outside DRA mode:
    each drawn task's children are exactly the ones drawn under it (a leaf's are not drawn)."""
    (task,) = [t for t in all_tasks() if t.name == root]
    stack = [(root, task)]
    while stack:
        name, task = stack.pop()
        drawn = {child for child, dra in tree.get(name, []) if not dra}
        if not drawn:
            continue  # a leaf: what it starts itself is not drawn
        children = _children(task)
        assert set(children) == drawn, name
        stack.extend((child, children[child]) for child in drawn)
