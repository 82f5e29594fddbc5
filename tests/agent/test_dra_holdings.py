"""A device-plugin-mode agent's care of the claims DRA mode left prepared (agent/dra/holdings.py),
against the real API server, its kubelet plugin served on sockets no kubelet watches: the slots
a checkpointed claim holds are recorded as `D:<claim>:<node>` before `run` reports started
(so before the device plugins start), the plugin refuses a new claim and unprepares a
checkpointed one, whose records are then freed and the plugin's sockets removed. A node where
DRA mode never ran frees records no checkpoint holds and serves nothing. A DRA-mode agent still
running (holding the node lock) keeps its claims, without holding the start up, until it
stops."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import trio

from akri_trio.agent.dra.holdings import DraHoldings
from akri_trio.agent.dra.node import LOCK_FILE, node_lock
from akri_trio.agent.dra.plugin import plugin_socket, registration_socket
from akri_trio.agent.dra.preparer import CHECKPOINT_FILE, NO_NEW_CLAIMS
from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.view import NodeView
from akri_trio.dra import DRIVER, node_pool
from akri_trio.dra.checkpoint import PreparedClaim, PreparedDevice, encode
from akri_trio.kube import Client
from akri_trio.model.resources import INSTANCES
from akri_trio.rpc.gen import dra_v1_pb2 as v1
from akri_trio.rpc.gen import dra_v1_pb2_grpc, pluginregistration_v1_pb2_grpc
from akri_trio.rpc.gen import pluginregistration_v1_pb2 as reg
from tests.controller.support import namespace
from tests.support.polling import until_api

NODE = "holdings-node"
NAME = "cam-abc123"


def instance_body(ns: str, usage: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Instance",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "configurationName": "cam",
            "cdiName": "akri.sh/cam=abc123",
            "capacity": 3,
            "nodes": [NODE],
            "deviceUsage": usage,
        },
    }


async def usage(api: Client, ns: str) -> dict[str, str]:
    inst = await api.get(INSTANCES, NAME, namespace=ns)
    return dict(inst["spec"].get("deviceUsage") or {})


async def view_of(api: Client, ns: str) -> NodeView:
    view = NodeView(NODE)
    view.put_instance(await api.get(INSTANCES, NAME, namespace=ns))
    return view


async def call(socket: Path, stub: Callable[[Any], Any], method: str, msg: Any) -> Any:
    """A grpcio client (an independent gRPC implementation, as the kubelet's Go one is)."""

    def run() -> Any:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            return getattr(stub(channel), method)(msg, timeout=20)

    return await trio.to_thread.run_sync(run)


def claims_msg(ns: str, *uids: str) -> list[v1.Claim]:
    return [v1.Claim(namespace=ns, uid=uid, name=f"c-{uid}") for uid in uids]


async def left_claim(api: Client, ns: str, tmp: Path) -> tuple[Path, Path, DraHoldings]:
    """An Instance whose slot 0 another node holds, and a checkpoint with claim u1 prepared
    on its slot device 2: the kubelet root, the CDI directory, the holdings."""
    await api.create(INSTANCES, instance_body(ns, {f"{NAME}-0": "other-node"}), namespace=ns)
    root = tmp / "kubelet"
    state = root / "plugins" / DRIVER
    state.mkdir(parents=True)
    device = PreparedDevice(("r",), node_pool(NODE, ns), f"{NAME}-2", ("cdi",))
    claim = PreparedClaim(ns, "c-u1", (device,), "u1.json")
    (state / CHECKPOINT_FILE).write_text(encode({"u1": claim}))
    cdi = tmp / "cdi"
    cdi.mkdir()
    (cdi / "u1.json").write_text("{}")
    view = await view_of(api, ns)
    return root, cdi, DraHoldings(view, Claims(api, view), kubelet_root_dir=root, cdi_dir=cdi)


async def test_left_claims_are_recorded_refused_new_and_freed_when_unprepared(
    api: Client, short_tmp: Path
) -> None:
    async with namespace(api, "holdings") as ns:
        root, cdi, holdings = await left_claim(api, ns, short_tmp)
        async with trio.open_nursery() as nursery:
            await nursery.start(holdings.run)
            # Recorded before `run` reported started: the lowest free slot, not slot 2.
            assert await usage(api, ns) == {
                f"{NAME}-0": "other-node",
                f"{NAME}-1": f"D:u1:{NODE}",
            }
            info = await call(
                registration_socket(root),
                pluginregistration_v1_pb2_grpc.RegistrationStub,
                "GetInfo",
                reg.InfoRequest(),
            )
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            sock, stub = plugin_socket(root), dra_v1_pb2_grpc.DRAPluginStub
            prepare = v1.NodePrepareResourcesRequest(claims=claims_msg(ns, "u1", "u2"))
            answer = await call(sock, stub, "NodePrepareResources", prepare)
            assert answer.claims["u2"].error == f"prepare {ns}/c-u2: {NO_NEW_CLAIMS}"
            assert answer.claims["u1"].error == ""  # answered from the checkpoint
            assert [d.device_name for d in answer.claims["u1"].devices] == [f"{NAME}-2"]
            unprepare = v1.NodeUnprepareResourcesRequest(claims=claims_msg(ns, "u1"))
            answer = await call(sock, stub, "NodeUnprepareResources", unprepare)
            assert answer.claims["u1"].error == ""

            async def freed() -> bool:
                return await usage(api, ns) == {f"{NAME}-0": "other-node"}

            async def unregistered() -> bool:
                return not registration_socket(root).exists()

            await until_api(freed, 30, "the claim's slot freed", poll=0.2)
            await until_api(unregistered, 30, "the plugin's sockets removed", poll=0.2)
            assert not (cdi / "u1.json").exists()
            nursery.cancel_scope.cancel()


async def test_a_node_without_dra_state_frees_left_records_and_serves_nothing(
    api: Client, short_tmp: Path
) -> None:
    async with namespace(api, "holdings") as ns:
        left = {f"{NAME}-0": f"D:gone:{NODE}", f"{NAME}-1": "D:x:other-node"}
        await api.create(INSTANCES, instance_body(ns, left), namespace=ns)
        root = short_tmp / "kubelet"
        view = await view_of(api, ns)
        holdings = DraHoldings(view, Claims(api, view), kubelet_root_dir=root, cdi_dir=root)
        async with trio.open_nursery() as nursery:
            await nursery.start(holdings.run)
            assert await usage(api, ns) == {f"{NAME}-1": "D:x:other-node"}
            assert not registration_socket(root).exists()
            nursery.cancel_scope.cancel()


async def test_a_dra_mode_agent_still_running_keeps_its_claims_till_it_stops(
    api: Client, short_tmp: Path
) -> None:
    async with namespace(api, "holdings") as ns:
        root, _, holdings = await left_claim(api, ns, short_tmp)
        stopped = trio.Event()

        async def dra_agent(*, task_status: trio.TaskStatus[None]) -> None:
            async with node_lock(root / "plugins" / DRIVER / LOCK_FILE):
                task_status.started()
                await stopped.wait()

        async with trio.open_nursery() as nursery:
            await nursery.start(dra_agent)
            await nursery.start(holdings.run)  # at once: the device plugins are not held up
            assert await usage(api, ns) == {f"{NAME}-0": "other-node"}
            assert not registration_socket(root).exists()
            stopped.set()

            async def recorded() -> bool:
                return await usage(api, ns) == {
                    f"{NAME}-0": "other-node",
                    f"{NAME}-1": f"D:u1:{NODE}",
                }

            await until_api(recorded, 30, "the claim taken over", poll=0.2)
            nursery.cancel_scope.cancel()
