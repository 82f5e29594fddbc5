"""`akri-trio status` against the real API server: which Pod holds which slot, and why a
Configuration found nothing, in the text and in `-o json`."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import trio

from akri_trio.kube import Resource
from akri_trio.model.resources import CONFIGURATIONS
from tests.observe.conftest import (
    RunningAgent,
    Space,
    admit_user_pod,
    first_instance,
    run_cli,
)
from tests.support.akri_cluster import debug_echo_config
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s
PODS = Resource.core("pods", "Pod")


def status(space: Space, *args: str) -> str:
    return run_cli(space, sys.executable, "-m", "akri_trio", "status", "-n", space.name, *args)


async def test_status_shows_slot_holders_and_why_nothing_appeared(
    space: Space, agent: RunningAgent
) -> None:
    api, ns = space.api, space.name
    await api.create(CONFIGURATIONS, debug_echo_config("cams", ns, ["cam0"], capacity=2))
    missing = debug_echo_config("nothing", ns, ["x"])
    missing["spec"]["discoveryHandler"]["name"] = "noSuchHandler"
    await api.create(CONFIGURATIONS, missing)

    inst = await until_api(lambda: first_instance(space), 20)
    name = inst["metadata"]["name"]
    with trio.fail_after(20):
        await trio.to_thread.run_sync(
            agent.kubelet.wait_for, lambda k: len(k.healthy(f"akri.sh/{name}")) == 2, 20.0
        )
    await trio.to_thread.run_sync(agent.kubelet.allocate, f"akri.sh/{name}", [[f"{name}-1"]])
    await admit_user_pod(space, agent.node, f"akri.sh/{name}")

    async def reported() -> dict[str, Any] | None:
        pic: dict[str, Any] = json.loads(await trio.to_thread.run_sync(status, space, "-o", "json"))
        cfgs = {c["name"]: c for c in pic["configurations"]}
        if any(not c["nodes"] for c in cfgs.values()):
            return None
        return pic

    pic = await until_api(reported, 30)
    assert {c["name"] for c in pic["configurations"]} == {"cams", "nothing"}
    (inst_pic,) = pic["instances"]
    assert inst_pic["name"] == name
    assert [(s["slot"], s["node"], s["pods"]) for s in inst_pic["slots"]] == [
        (f"{name}-0", "", []),
        (f"{name}-1", agent.node, [f"{ns}/user"]),
    ]
    text = await trio.to_thread.run_sync(status, space)
    assert f"{name}-1" in text and f"{agent.node}  {ns}/user" in text
    assert "HandlerAvailable=False" in text
    assert (
        f"no discovery handler named 'noSuchHandler' is registered with the agent on {agent.node}"
        in text
    )
