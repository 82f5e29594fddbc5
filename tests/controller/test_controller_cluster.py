"""The controller against the real control plane (no node needed): the test writes Instances as
an agent would and stands in for the kubelet by writing Pod phases through pods/status; the
brokers' nodeSelector matches no node, so the scheduler leaves them alone.

The controller runs in-process (`run_controller`), watching only the test's own namespace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest
import trio

from akri_trio.controller.run import ControllerSettings, RunningController, run_controller
from akri_trio.kube import JSON, Client, NotFound, load_config
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.controller.support import (
    JOBS,
    NODES,
    PODS,
    SERVICES,
    broker_config,
    brokers,
    make_instance,
    namespace,
    pod_spec,
    service_names,
    set_pod_phase,
    unique,
    until,
)


class CountingClient(Client):
    """The real client, counting the requests it sends (watches are streams, not counted)."""

    def __init__(self, real: Client) -> None:
        super().__init__(real.http, default_namespace=real.default_namespace)
        self.requests: list[str] = []

    async def request(self, method: str, path: str, **kw: Any) -> JSON:
        self.requests.append(f"{method} {path}")
        return await super().request(method, path, **kw)


@pytest.fixture
async def api(cluster: dict[str, str]) -> AsyncIterator[Client]:
    async with Client.open(load_config(cluster["KUBECONFIG"])) as client:
        yield client


@asynccontextmanager
async def controller(api: Client, ns: str) -> AsyncIterator[RunningController]:
    settings = ControllerSettings(namespace=ns, leader_elect=False, metrics_port=None)
    async with trio.open_nursery() as nursery:
        running: RunningController = await nursery.start(
            lambda **kw: run_controller(settings, api=api, **kw)
        )
        with trio.fail_after(30):
            while not running.synced:  # noqa: ASYNC110  (a flag the controller sets)
                await trio.sleep(0.05)
        yield running
        nursery.cancel_scope.cancel()


async def _create_config(api: Client, body: JSON) -> JSON:
    return await api.create(CONFIGURATIONS, body)


def _names(pods: list[JSON]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


async def test_pod_brokers_are_made_recreated_and_removed(api: Client) -> None:
    async with namespace(api, "ctl-pods") as ns:
        counting = CountingClient(api)
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        await make_instance(api, config, "cfg-aaaaaa", ["node-1", "node-2"])
        await make_instance(api, config, "cfg-bbbbbb", ["node-1"], shared=False)
        async with controller(counting, ns):
            expected = {"node-1-cfg-aaaaaa-pod", "node-2-cfg-aaaaaa-pod", "cfg-bbbbbb-pod"}
            pods = await until(
                lambda: _wait_names(api, ns, expected), what=f"brokers {sorted(expected)}"
            )
            pod = next(p for p in pods if p["metadata"]["name"] == "node-2-cfg-aaaaaa-pod")
            labels = pod["metadata"]["labels"]
            assert labels[naming.LABEL_INSTANCE] == "cfg-aaaaaa"
            assert labels[naming.LABEL_TARGET_NODE] == "node-2"
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "Instance"
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits == {"akri.sh/cfg-aaaaaa": "1"}
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            assert terms == [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
            ]

            # Idle: nothing changes, nothing is sent.
            await trio.sleep(1)
            counting.requests.clear()
            await trio.sleep(3)
            assert counting.requests == [], counting.requests

            # A deleted broker comes back under a new uid.
            old_uid = pod["metadata"]["uid"]
            await api.delete(PODS, "node-2-cfg-aaaaaa-pod", namespace=ns)

            async def recreated() -> bool:
                try:
                    new = await api.get(PODS, "node-2-cfg-aaaaaa-pod", namespace=ns)
                except NotFound:
                    return False
                return bool(new["metadata"]["uid"] != old_uid)

            await until(recreated, what="the deleted broker recreated")

            # A node leaves the Instance: its broker goes.
            await api.merge_patch(
                INSTANCES, "cfg-aaaaaa", {"spec": {"nodes": ["node-1"]}}, namespace=ns
            )
            await until(
                lambda: _wait_names(api, ns, expected - {"node-2-cfg-aaaaaa-pod"}),
                what="node-2's broker removed",
            )
            # The Instance goes: its brokers go.
            await api.delete(INSTANCES, "cfg-bbbbbb", namespace=ns)
            await until(
                lambda: _wait_names(api, ns, {"node-1-cfg-aaaaaa-pod"}),
                what="the Instance's broker removed",
            )


async def _wait_names(api: Client, ns: str, expected: set[str]) -> list[JSON] | None:
    pods = await brokers(api, ns)
    return pods if _names(pods) == expected else None


async def test_failed_broker_is_recreated_with_backoff(api: Client) -> None:
    async with namespace(api, "ctl-backoff") as ns:
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        await make_instance(api, config, "cfg-cccccc", ["node-1"], shared=False)
        async with controller(api, ns) as running:
            uids: list[str] = []
            for _ in range(3):
                pod = (await until(lambda: _wait_names(api, ns, {"cfg-cccccc-pod"})))[0]
                if uids and pod["metadata"]["uid"] == uids[-1]:
                    continue
                uids.append(pod["metadata"]["uid"])
                await set_pod_phase(api, pod, "Failed")

                async def replaced(uid: str = uids[-1]) -> bool:
                    pods = await brokers(api, ns)
                    return bool(pods) and pods[0]["metadata"]["uid"] != uid

                await until(replaced, seconds=20, what="the failed broker replaced")
            assert len(set(uids)) == 3
            assert running.reconcilers is not None
            retry = running.reconcilers.retries[next(iter(running.reconcilers.retries))]
            assert retry["cfg-cccccc-pod"].creates >= 3  # backoff state kept, not reset


async def test_services_follow_running_brokers(api: Client) -> None:
    async with namespace(api, "ctl-svc") as ns:
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        await make_instance(api, config, "cfg-aaaaaa", ["node-1"])
        await make_instance(api, config, "cfg-bbbbbb", ["node-1"])
        async with controller(api, ns):
            pods = await until(lambda: _count(api, ns, 2), what="2 brokers")
            assert await service_names(api, ns) == set()  # nothing Running yet
            for pod in pods:
                await set_pod_phase(api, pod, "Running")
            want = {"cfg-aaaaaa-svc", "cfg-bbbbbb-svc", "cfg-svc"}
            await until(lambda: _services_are(api, ns, want), what=f"services {want}")
            svc = await api.get(SERVICES, "cfg-svc", namespace=ns)
            assert svc["spec"]["selector"] == {
                "controller": "akri.sh",
                naming.LABEL_CONFIGURATION: "cfg",
            }
            assert svc["metadata"]["ownerReferences"][0]["kind"] == "Configuration"
            await api.delete(INSTANCES, "cfg-aaaaaa", namespace=ns)
            await until(
                lambda: _services_are(api, ns, {"cfg-bbbbbb-svc", "cfg-svc"}),
                what="the Instance's Service gone",
            )
            await api.delete(INSTANCES, "cfg-bbbbbb", namespace=ns)
            await until(lambda: _services_are(api, ns, set()), what="every Service gone")


async def _count(api: Client, ns: str, n: int) -> list[JSON] | None:
    pods = await brokers(api, ns)
    return pods if len(pods) == n else None


async def _services_are(api: Client, ns: str, names: set[str]) -> bool:
    return await service_names(api, ns) == names


async def test_job_broker_per_generation(api: Client) -> None:
    job_spec: JSON = {
        "template": {"spec": {**pod_spec("true", nowhere=True), "restartPolicy": "Never"}}
    }
    async with namespace(api, "ctl-job") as ns:
        config = await _create_config(api, broker_config("cfg", ns, job=job_spec, services=False))
        generation = config["metadata"]["generation"]
        await make_instance(api, config, "cfg-aaaaaa", ["node-1"])
        async with controller(api, ns):

            async def jobs() -> set[str]:
                items = (await api.list(JOBS, namespace=ns)).items
                return {
                    j["metadata"]["name"]
                    for j in items
                    if not j["metadata"].get("deletionTimestamp")
                }

            first = f"cfg-aaaaaa-{generation}-job"
            await until(lambda: _equals(jobs, {first}), what=f"job {first}")
            job = await api.get(JOBS, first, namespace=ns)
            template_labels = job["spec"]["template"]["metadata"]["labels"]
            assert template_labels[naming.LABEL_INSTANCE] == "cfg-aaaaaa"
            patched = await api.merge_patch(
                CONFIGURATIONS,
                "cfg",
                {"spec": {"brokerSpec": {"brokerJobSpec": {**job_spec, "backoffLimit": 2}}}},
                namespace=ns,
            )
            second = f"cfg-aaaaaa-{patched['metadata']['generation']}-job"
            assert second != first
            await until(lambda: _equals(jobs, {second}), what=f"only job {second}")


async def _equals(get: Any, want: Any) -> bool:
    return bool(await get() == want)


def _node_body(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


async def _set_ready(api: Client, node: str, ready: bool) -> None:
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "Test",
        "message": "set by the controller's tests",
        "lastHeartbeatTime": _now(),
        "lastTransitionTime": _now(),
    }
    await api.merge_patch(
        NODES, node, {"status": {"conditions": [condition]}}, subresource="status"
    )


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@asynccontextmanager
async def fake_node(api: Client) -> AsyncIterator[str]:
    """A Node object of our own (no kubelet behind it), Ready."""
    name = unique("ctl-test-node")
    await api.create(NODES, _node_body(name))
    try:
        await _set_ready(api, name, True)
        yield name
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10), suppress(NotFound):
            await api.delete(NODES, name)


@pytest.mark.parametrize("how", ["not-ready", "deleted"])
async def test_lost_node_is_removed_everywhere(api: Client, how: str) -> None:
    async with namespace(api, "ctl-node") as ns, fake_node(api) as lost:
        config = await _create_config(api, broker_config("cfg", ns, services=False))
        status = {"nodes": [{"node": "other"}, {"node": lost}]}
        await api.merge_patch(
            CONFIGURATIONS, "cfg", {"status": status}, namespace=ns, subresource="status"
        )
        shared = await make_instance(
            api,
            config,
            "cfg-aaaaaa",
            [lost, "other"],
            usage={
                "cfg-aaaaaa-0": lost,
                "cfg-aaaaaa-1": f"C:cfg-0:{lost}",
                "cfg-aaaaaa-2": "other",
            },
            finalizers=[lost, "other"],
        )
        alone = await make_instance(api, config, "cfg-bbbbbb", [lost], finalizers=[lost])
        async with controller(api, ns) as running:
            await until(
                lambda: _true(
                    lost in (running.reconcilers.node_states if running.reconcilers else {})
                ),
                what="the node seen Ready",
            )
            if how == "not-ready":
                await _set_ready(api, lost, False)
            else:
                await api.delete(NODES, lost)

            async def released() -> JSON | None:
                inst = await api.get(INSTANCES, "cfg-aaaaaa", namespace=ns)
                return inst if inst["spec"]["nodes"] == ["other"] else None

            inst = await until(released, what="the lost node removed from the shared Instance")
            assert inst["spec"]["deviceUsage"] == {"cfg-aaaaaa-2": "other"}
            assert inst["metadata"]["finalizers"] == ["other"]
            assert inst["metadata"]["uid"] == shared["metadata"]["uid"]

            async def gone() -> bool:
                try:
                    await api.get(INSTANCES, "cfg-bbbbbb", namespace=ns)
                except NotFound:
                    return True
                return False

            await until(gone, what="the Instance left with no node deleted")
            cfg = await api.get(CONFIGURATIONS, "cfg", namespace=ns)
            # Agents of other tests that watch every namespace add their own entries.
            nodes = [entry["node"] for entry in cfg["status"]["nodes"]]
            assert "other" in nodes and lost not in nodes
            del alone


async def _true(value: bool) -> bool:
    return value


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})
