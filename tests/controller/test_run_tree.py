"""The tree run_controller's docstring draws is the tree of tasks it runs: each branch's names are
the names its tasks are started with, and a drawn task's children are exactly the ones drawn
under it (a leaf's own helpers are not drawn)."""

from __future__ import annotations

import re

import trio

from akri_trio.controller import run
from akri_trio.controller.run import ControllerSettings, RunningController, run_controller
from akri_trio.kube import Client, load_config
from tests.controller.support import namespace
from tests.support.cancellation import all_tasks
from tests.support.polling import until_api

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


def test_the_docstring_tree_parses_to_named_branches() -> None:
    tree = drawn_tree(run.__doc__ or "")
    assert [n for n, _ in tree["run_controller"]] == ["health / metrics server", "leader election"]
    assert tree["leader election"] == [("reconcile_while_leading", False)]
    leading = dict(tree["reconcile_while_leading"])
    assert leading["node queue"] is False and leading["pool queue"] is True


def _children(task: trio.lowlevel.Task) -> dict[str, trio.lowlevel.Task]:
    # A task started from a partial of a module's function is named module.function.
    return {
        child.name.rsplit(".", 1)[-1] if "/" not in child.name else child.name: child
        for nursery in task.child_nurseries
        for child in nursery.child_tasks
    }


async def test_run_controller_runs_the_tree_its_docstring_draws(cluster: dict[str, str]) -> None:
    tree = drawn_tree(run.__doc__ or "")
    async with (
        Client.open(load_config(cluster["KUBECONFIG"])) as api,
        namespace(api, "ctl-tree") as ns,
        trio.open_nursery() as nursery,
    ):
        settings = ControllerSettings(namespace=ns, lease_namespace=ns, metrics_port=0)
        running: RunningController = await nursery.start(
            lambda **kw: run_controller(settings, api=api, **kw), name="run_controller"
        )

        async def synced() -> bool:
            return running.synced

        await until_api(synced, what="the controller synced")
        (root,) = [t for t in all_tasks() if t.name == "run_controller"]
        stack = [("run_controller", root)]
        while stack:
            name, task = stack.pop()
            drawn = {child for child, dra in tree.get(name, []) if not dra}
            if not drawn:
                continue  # a leaf: what it starts itself is not drawn
            children = _children(task)
            assert set(children) == drawn, name
            stack.extend((child, children[child]) for child in drawn)
        nursery.cancel_scope.cancel()
