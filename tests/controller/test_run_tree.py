"""The tree run_controller's docstring draws is the tree of tasks it runs: each branch's names are
the names its tasks are started with, and a drawn task's children are exactly the ones drawn
under it (a leaf's own helpers are not drawn)."""

from __future__ import annotations

import trio

from akri_trio.controller import run
from akri_trio.controller.run import ControllerSettings, RunningController, run_controller
from akri_trio.kube import Client, load_config
from tests.controller.support import namespace
from tests.support.polling import until_api
from tests.support.run_tree import assert_runs_drawn_tree, drawn_tree


def test_the_docstring_tree_parses_to_named_branches() -> None:
    tree = drawn_tree(run.__doc__ or "")
    assert [n for n, _ in tree["run_controller"]] == ["health / metrics server", "leader election"]
    assert tree["leader election"] == [("reconcile_while_leading", False)]
    leading = dict(tree["reconcile_while_leading"])
    assert leading["node queue"] is False and leading["pool queue"] is True


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
        assert_runs_drawn_tree(tree, "run_controller")
        nursery.cancel_scope.cancel()
