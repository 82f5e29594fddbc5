"""Events on the real API server, as `kubectl describe` shows them: a Configuration whose
handler is missing, devices found, and an Allocate refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.observe.conftest import RunningAgent, Space, run_cli
from tests.support.akri_cluster import debug_echo_config
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s


def describe(space: Space, kubectl: str, kind: str, name: str) -> str:
    return run_cli(space, kubectl, "describe", kind, name, "-n", space.name)


async def test_kubectl_describe_shows_why(
    space: Space, agent: RunningAgent, cluster: dict[str, str]
) -> None:
    api, ns, kubectl = space.api, space.name, cluster["KUBECTL"]
    missing = debug_echo_config("nothing", ns, ["x"])
    missing["spec"]["discoveryHandler"]["name"] = "noSuchHandler"
    await api.create(CONFIGURATIONS, missing)
    await api.create(CONFIGURATIONS, debug_echo_config("cams", ns, ["cam0"], capacity=2))

    async def described(kind: str, name: str, *wanted: str) -> str | None:
        text = await trio.to_thread.run_sync(describe, space, kubectl, kind, name)
        return text if all(w in text for w in wanted) else None

    text = await until_api(lambda: described("akric", "nothing", "HandlerUnavailable"), 30)
    assert "Warning  HandlerUnavailable" in text
    assert (
        f"no discovery handler named 'noSuchHandler' is registered with the agent on {agent.node}"
        in text
    )

    async def one_instance() -> Any:
        items = (await api.list(INSTANCES, namespace=ns)).items
        return items[0]["metadata"]["name"] if len(items) == 1 else None

    name = await until_api(one_instance, 20)
    text = await until_api(lambda: described("akric", "cams", "DeviceFound"), 20)
    assert f"device of Instance {name} found on {agent.node}" in text

    await trio.to_thread.run_sync(
        agent.kubelet.wait_for, lambda k: len(k.healthy(f"akri.sh/{name}")) == 2, 20.0
    )
    with pytest.raises(Exception, match="cam"):  # grpc's RpcError: the slot does not exist
        await trio.to_thread.run_sync(agent.kubelet.allocate, f"akri.sh/{name}", [[f"{name}-7"]])
    text = await until_api(lambda: described("akrii", name, "AllocateRefused"), 20)
    assert f"Allocate of {name}-7 refused" in text
