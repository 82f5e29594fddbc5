"""The tree run_agent's docstring draws is the tree of tasks it runs: each branch's names are the
names its tasks are started with, and a drawn task's children are exactly the ones drawn under
it (a leaf's own helpers are not drawn). Device-plugin mode, with every optional branch on (a
metrics port, a brokerInfo directory); DRA mode's branch is read but not run here."""

from __future__ import annotations

from pathlib import Path

import trio

from akri_trio.agent import run
from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.kube import Client
from tests.controller.support import namespace
from tests.support.kubelet_standin import KubeletStandin
from tests.support.run_tree import assert_runs_drawn_tree, drawn_tree


def test_the_docstring_tree_parses_to_named_branches() -> None:
    tree = dict(drawn_tree(run.__doc__ or "")["run_agent"])
    assert tree["watch configurations"] is False and tree["watch instances"] is False
    assert tree["plugin manager"] is False and tree["slot reclaimer"] is False
    assert tree["DRA node"] is True
    assert "per Configuration its discovery" not in tree  # a note, not a branch


async def test_run_agent_runs_the_tree_its_docstring_draws(api: Client, short_tmp: Path) -> None:
    tree = drawn_tree(run.__doc__ or "")
    kubelet = KubeletStandin(short_tmp / "device-plugins").start()
    try:
        async with namespace(api, "agent-tree") as ns, trio.open_nursery() as nursery:
            settings = AgentSettings(
                node="tree-node",
                namespace=ns,
                discovery_handlers_directory=short_tmp / "akri",
                device_plugin_dir=short_tmp / "device-plugins",
                pod_resources_socket=short_tmp / "pod-resources.sock",
                broker_info_dir=short_tmp / "broker-info",
                metrics_port=0,
                metrics_host="127.0.0.1",
            )
            agent: Agent = await nursery.start(
                lambda **kw: run_agent(settings, api=api, **kw), name="run_agent"
            )
            assert agent.metrics_port is not None  # every optional branch is running
            assert_runs_drawn_tree(tree, "run_agent")
            nursery.cancel_scope.cancel()
    finally:
        kubelet.stop()
