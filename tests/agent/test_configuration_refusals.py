"""A Configuration the agent's model cannot read, on the real API server, without the webhook.

The CRD's schema does not require `spec` (upstream's does not either), so `{"spec": null}`, a
merge patch anyone may send, leaves a Configuration the API server keeps and the model refuses
(its `spec` is required). The agent's Configuration cache keeps the last version that decoded
(`kube/store.py`, `keep_last_good`): an update like that must not look like a deletion (which
would stop discovery and delete the Instances); one first seen that way (a restarted agent) is
not acted on at all; both are logged once per version; a deletion still removes it.

Each test runs its own agent in its own namespace, watching only that namespace, with debugEcho
embedded under another name: other agents on the shared cluster serve none of this.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.kube.client import Client
from akri_trio.kube.errors import NotFound
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.akri_cluster import (
    debug_echo_config,
    ensure_namespace,
    install_crds,
    purge_namespace,
)
from tests.support.echo_agent import renamed_echo
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api, until_state

NS = "agent-config-refusals"
NODE = "refusals-node"
ECHO = "refusalEcho"
NAME = "kept"
KEY = ObjectKey(NS, NAME)
GREETING = {"GREETING": "hi"}


def _config(name: str = NAME) -> dict[str, Any]:
    body = debug_echo_config(name, NS, ["k0"], broker_properties=GREETING)
    body["spec"]["discoveryHandler"]["name"] = ECHO
    return body


class AgentRunner:
    """Starts and stops agents for one node (the same directories each time)."""

    def __init__(self, nursery: trio.Nursery, api: Client, root: Path) -> None:
        self.nursery = nursery
        self.api = api
        self.kubelet = KubeletStandin(root / "device-plugins").start()
        self.settings = renamed_echo(
            AgentSettings(
                node=NODE,
                namespace=NS,
                discovery_handlers_directory=root / "akri",
                device_plugin_dir=root / "device-plugins",
                pod_resources_socket=root / "pod-resources.sock",
                debug_echo_availability=root / "availability",
            ),
            ECHO,
        )
        self.scope: trio.CancelScope | None = None

    async def start(self) -> Agent:
        scope = self.scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[Agent]) -> None:
            with scope:
                await run_agent(self.settings, api=self.api, task_status=task_status)

        agent: Agent = await self.nursery.start(run)
        return agent

    def stop(self) -> None:
        assert self.scope is not None
        self.scope.cancel()


@pytest.fixture
async def agents(api: Client, short_tmp: Path) -> AsyncIterator[AgentRunner]:
    await install_crds(api)
    await ensure_namespace(api, NS)
    await purge_namespace(api, NS)
    async with trio.open_nursery() as nursery:
        runner = AgentRunner(nursery, api, short_tmp)
        try:
            yield runner
        finally:
            nursery.cancel_scope.cancel()
            runner.kubelet.stop()
    await purge_namespace(api, NS)


async def _instance(api: Client) -> dict[str, Any] | None:
    """The one Instance of the Configuration, once this node serves it."""
    items = (await api.list(INSTANCES, namespace=NS)).items
    mine = [i for i in items if NODE in (i.get("spec") or {}).get("nodes", ())]
    return mine[0] if len(mine) == 1 else None


async def _tamper(api: Client, inst: dict[str, Any]) -> None:
    """Change a field the agent writes, as if someone edited the Instance."""
    await api.merge_patch(
        INSTANCES,
        inst["metadata"]["name"],
        {"spec": {"brokerProperties": {"GREETING": "tampered"}}},
        namespace=NS,
    )


async def _put_back(api: Client, uid: str) -> dict[str, Any] | None:
    """The Instance, once the agent has written GREETING back (None: not yet); it must be the
    same object all along (the same uid: never deleted and made again)."""
    inst = await _instance(api)
    if inst is None or inst["spec"].get("brokerProperties", {}).get("GREETING") != "hi":
        return None
    assert inst["metadata"]["uid"] == uid
    return inst


async def _refused(agent: Agent) -> bool:
    """The agent's store holds a refused version of the Configuration: the broken one, or a
    later one (a status write to the broken object makes a new version, refused too)."""
    return KEY in agent.configs.refused()


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The store's refusals of the Configuration logged so far, each a different version (the
    agents' status writes make new versions, each logged once)."""
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "akri_trio.kube.store" and f"{KEY} (resourceVersion" in r.getMessage()
    ]
    versions = [line.split("(resourceVersion ", 1)[1].split(")", 1)[0] for line in lines]
    assert len(set(versions)) == len(versions), lines
    return lines


async def test_an_update_that_does_not_decode_leaves_the_agent_serving_the_last_good_version(
    api: Client, agents: AgentRunner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="akri_trio.kube.store")
    agent = await agents.start()
    await api.create(CONFIGURATIONS, _config())
    inst = await until_api(lambda: _instance(api), what="the Instance of the good version")
    uid = inst["metadata"]["uid"]

    broken = await api.merge_patch(CONFIGURATIONS, NAME, {"spec": None}, namespace=NS)
    assert "spec" not in broken  # the CRD accepted it
    await until_api(lambda: _refused(agent), what="the broken version refused")
    kept = agent.configs.get(KEY)
    assert kept is not None and kept.spec.discovery_handler.name == ECHO
    assert kept.spec.broker_properties == GREETING
    # Still served as that version says: an Instance changed behind its back is put back (a
    # reconcile that, had the refusal looked like a deletion, would have left and deleted it).
    await _tamper(api, inst)
    await until_api(lambda: _put_back(api, uid), what="GREETING put back by the kept version")
    assert all("keeping the last version that decoded" in line for line in _refusals(caplog))

    # A deletion still removes it, and the agent leaves its Instance.
    await api.delete(CONFIGURATIONS, NAME, namespace=NS)
    await until_state(lambda: not agent.configs.holds(KEY), 30)
    assert agent.configs.get(KEY) is None
    await until_api(
        lambda: _gone(api, inst["metadata"]["name"]),
        what="the Instance gone with its Configuration",
    )


async def _gone(api: Client, name: str) -> bool:
    try:
        await api.get(INSTANCES, name, namespace=NS)
    except NotFound:
        return True
    return False


async def test_a_configuration_first_seen_undecodable_is_not_acted_on(
    api: Client, agents: AgentRunner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="akri_trio.kube.store")
    await agents.start()
    await api.create(CONFIGURATIONS, _config())
    inst = await until_api(lambda: _instance(api), what="the Instance of the good version")
    uid = inst["metadata"]["uid"]
    agents.stop()

    await api.merge_patch(CONFIGURATIONS, NAME, {"spec": None}, namespace=NS)
    agent = await agents.start()  # a restart: this agent never saw a version that decodes
    assert await _refused(agent)  # started: synced
    assert agent.configs.get(KEY) is None and agent.configs.holds(KEY)
    assert any("left out of the cache" in line for line in _refusals(caplog))
    # Its Instance was listed: neither served (put back) nor left (deleted) while it stays so.
    await _tamper(api, inst)
    await until_state(lambda: _tampered_in_view(agent, inst["metadata"]["name"]), 30)

    # Made readable again, it is served: the same Instance, put back.
    await api.merge_patch(CONFIGURATIONS, NAME, {"spec": _config()["spec"]}, namespace=NS)
    await until_api(lambda: _put_back(api, uid), what="GREETING put back once it decodes")
    _refusals(caplog)


def _tampered_in_view(agent: Agent, name: str) -> bool:
    """The agent's node view has the edited Instance (so its Configuration was woken)."""
    held = agent.view.instance(ObjectKey(NS, name))
    return held is not None and held.spec.broker_properties.get("GREETING") == "tampered"
