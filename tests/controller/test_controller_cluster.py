"""The controller against the real control plane (no node needed): the test writes Instances as
an agent would and stands in for the kubelet by writing Pod phases through pods/status; the
brokers' nodeSelector matches no node, so the scheduler leaves them alone. The nodes Instances
name are Node objects of the test's own (support.fake_nodes): the controller takes a node
that does not exist for one deleted while it was away.

The controller runs in-process (`run_controller`), watching only the test's own namespace.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from akri_trio.controller.run import ControllerSettings, RunningController
from akri_trio.kube import JSON, Client, NotFound, Resource
from akri_trio.kube.events import EVENTS
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.controller.support import (
    JOBS,
    NODES,
    PODS,
    SERVICES,
    broker_config,
    brokers,
    fake_nodes,
    instance_gone,
    make_instance,
    namespace,
    pod_spec,
    running_controller,
    served_configuration,
    service_names,
    set_pod_phase,
    set_ready,
    with_nodes,
)
from tests.support.intercept import Intercepting
from tests.support.polling import until_api


@asynccontextmanager
async def controller(api: Client, ns: str) -> AsyncIterator[RunningController]:
    settings = ControllerSettings(namespace=ns, leader_elect=False, metrics_port=None)
    async with running_controller(api, settings) as running:
        yield running


async def _create_config(api: Client, body: JSON) -> JSON:
    return await api.create(CONFIGURATIONS, body)


def _names(pods: list[JSON]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


async def test_pod_brokers_are_made_recreated_and_removed(api: Client) -> None:
    async with namespace(api, "ctl-pods") as ns, fake_nodes(api, 2) as (node1, node2):
        counting = Intercepting(api)  # counts the requests it sends
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        await make_instance(api, config, "cfg-aaaaaa", [node1, node2])
        await make_instance(api, config, "cfg-bbbbbb", [node1], shared=False)
        broker1, broker2 = f"{node1}-cfg-aaaaaa-pod", f"{node2}-cfg-aaaaaa-pod"
        async with controller(counting.client, ns):
            expected = {broker1, broker2, "cfg-bbbbbb-pod"}
            pods = await until_api(
                lambda: _wait_names(api, ns, expected), what=f"brokers {sorted(expected)}"
            )
            pod = next(p for p in pods if p["metadata"]["name"] == broker2)
            labels = pod["metadata"]["labels"]
            assert labels[naming.LABEL_INSTANCE] == "cfg-aaaaaa"
            assert labels[naming.LABEL_TARGET_NODE] == node2
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "Instance"
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits == {"akri.sh/cfg-aaaaaa": "1"}
            terms = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            assert terms == [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node2]}]}
            ]

            # Idle: nothing changes, nothing is sent.
            await trio.sleep(1)
            counting.seen.clear()
            await trio.sleep(3)
            assert counting.seen == [], counting.seen

            # A deleted broker comes back under a new uid.
            old_uid = pod["metadata"]["uid"]
            await api.delete(PODS, broker2, namespace=ns)

            async def recreated() -> bool:
                try:
                    new = await api.get(PODS, broker2, namespace=ns)
                except NotFound:
                    return False
                return bool(new["metadata"]["uid"] != old_uid)

            await until_api(recreated, what="the deleted broker recreated")

            # A node leaves the Instance: its broker goes.
            await api.merge_patch(
                INSTANCES, "cfg-aaaaaa", {"spec": {"nodes": [node1]}}, namespace=ns
            )
            await until_api(
                lambda: _wait_names(api, ns, expected - {broker2}), what="node 2's broker removed"
            )
            # The Instance goes: its brokers go.
            await api.delete(INSTANCES, "cfg-bbbbbb", namespace=ns)
            await until_api(
                lambda: _wait_names(api, ns, {broker1}), what="the Instance's broker removed"
            )


async def _wait_names(api: Client, ns: str, expected: set[str]) -> list[JSON] | None:
    pods = await brokers(api, ns)
    return pods if _names(pods) == expected else None


async def test_failed_broker_is_recreated_with_backoff(api: Client) -> None:
    async with namespace(api, "ctl-backoff") as ns, fake_nodes(api) as (node,):
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        await make_instance(api, config, "cfg-cccccc", [node], shared=False)
        async with controller(api, ns) as running:
            uids: list[str] = []
            for _ in range(3):
                pod = (await until_api(lambda: _wait_names(api, ns, {"cfg-cccccc-pod"})))[0]
                if uids and pod["metadata"]["uid"] == uids[-1]:
                    continue
                uids.append(pod["metadata"]["uid"])
                await set_pod_phase(api, pod, "Failed")

                async def replaced(uid: str = uids[-1]) -> bool:
                    pods = await brokers(api, ns)
                    return bool(pods) and pods[0]["metadata"]["uid"] != uid

                await until_api(replaced, seconds=20, what="the failed broker replaced")
            assert len(set(uids)) == 3
            assert running.reconcilers is not None
            retry = running.reconcilers.retries[next(iter(running.reconcilers.retries))]
            assert retry["cfg-cccccc-pod"].creates >= 3  # backoff state kept, not reset


async def test_services_follow_running_brokers(api: Client) -> None:
    async with namespace(api, "ctl-svc") as ns, fake_nodes(api) as (node,):
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        await make_instance(api, config, "cfg-aaaaaa", [node])
        await make_instance(api, config, "cfg-bbbbbb", [node])
        async with controller(api, ns):
            pods = await until_api(lambda: _count(api, ns, 2), what="2 brokers")
            assert await service_names(api, ns) == set()  # nothing Running yet
            for pod in pods:
                await set_pod_phase(api, pod, "Running")
            want = {"cfg-aaaaaa-svc", "cfg-bbbbbb-svc", "cfg-svc"}
            await until_api(lambda: _services_are(api, ns, want), what=f"services {want}")
            svc = await api.get(SERVICES, "cfg-svc", namespace=ns)
            assert svc["spec"]["selector"] == {
                "controller": "akri.sh",
                naming.LABEL_CONFIGURATION: "cfg",
            }
            assert svc["metadata"]["ownerReferences"][0]["kind"] == "Configuration"
            # as upstream's e2e selects them: one configuration Service, one per Instance
            by_config = await api.list(
                SERVICES, namespace=ns, label_selector=f"{naming.LABEL_CONFIGURATION}=cfg"
            )
            assert [s["metadata"]["name"] for s in by_config.items] == ["cfg-svc"]
            by_instance = await api.list(
                SERVICES, namespace=ns, label_selector=naming.LABEL_INSTANCE
            )
            assert {s["metadata"]["name"] for s in by_instance.items} == want - {"cfg-svc"}
            await api.delete(INSTANCES, "cfg-aaaaaa", namespace=ns)
            await until_api(
                lambda: _services_are(api, ns, {"cfg-bbbbbb-svc", "cfg-svc"}),
                what="the Instance's Service gone",
            )
            await api.delete(INSTANCES, "cfg-bbbbbb", namespace=ns)
            await until_api(lambda: _services_are(api, ns, set()), what="every Service gone")


async def _count(api: Client, ns: str, n: int) -> list[JSON] | None:
    pods = await brokers(api, ns)
    return pods if len(pods) == n else None


async def _services_are(api: Client, ns: str, names: set[str]) -> bool:
    return await service_names(api, ns) == names


async def test_job_broker_per_generation(api: Client) -> None:
    job_spec: JSON = {
        "template": {"spec": {**pod_spec("true", nowhere=True), "restartPolicy": "Never"}}
    }
    async with namespace(api, "ctl-job") as ns, fake_nodes(api) as (node,):
        config = await _create_config(api, broker_config("cfg", ns, job=job_spec, services=False))
        generation = config["metadata"]["generation"]
        await make_instance(api, config, "cfg-aaaaaa", [node])
        async with controller(api, ns):

            async def jobs() -> set[str]:
                items = (await api.list(JOBS, namespace=ns)).items
                return {
                    j["metadata"]["name"]
                    for j in items
                    if not j["metadata"].get("deletionTimestamp")
                }

            first = f"cfg-aaaaaa-{generation}-job"
            await until_api(lambda: _equals(jobs, {first}), what=f"job {first}")
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
            await until_api(lambda: _equals(jobs, {second}), what=f"only job {second}")


async def _equals(get: Any, want: Any) -> bool:
    return bool(await get() == want)


@pytest.mark.parametrize("how", ["not-ready", "deleted"])
async def test_lost_node_is_removed_everywhere(api: Client, how: str) -> None:
    async with namespace(api, "ctl-node") as ns, fake_nodes(api, 2) as (lost, other):
        config = await served_configuration(api, ns, [other, lost])
        shared = await make_instance(
            api,
            config,
            "cfg-aaaaaa",
            [lost, other],
            usage={
                "cfg-aaaaaa-0": lost,
                "cfg-aaaaaa-1": f"C:cfg-0:{lost}",
                "cfg-aaaaaa-2": other,
            },
            finalizers=[lost, other],
        )
        alone = await make_instance(api, config, "cfg-bbbbbb", [lost], finalizers=[lost])
        async with controller(api, ns) as running:
            await until_api(
                lambda: _true(
                    lost in (running.reconcilers.node_states if running.reconcilers else {})
                ),
                what="the node seen Ready",
            )
            if how == "not-ready":
                await set_ready(api, lost, False)
            else:
                await api.delete(NODES, lost)

            inst = await until_api(
                lambda: with_nodes(api, ns, "cfg-aaaaaa", [other]),
                what="the lost node removed from the shared Instance",
            )
            assert inst["spec"]["deviceUsage"] == {"cfg-aaaaaa-2": other}
            assert inst["metadata"]["finalizers"] == [other]
            assert inst["metadata"]["uid"] == shared["metadata"]["uid"]
            await until_api(
                lambda: instance_gone(api, ns, "cfg-bbbbbb"),
                what="the Instance left with no node deleted",
            )
            cfg = await api.get(CONFIGURATIONS, "cfg", namespace=ns)
            # Agents of other tests that watch every namespace add their own entries.
            nodes = [entry["node"] for entry in cfg["status"]["nodes"]]
            assert other in nodes and lost not in nodes
            del alone


async def _true(value: bool) -> bool:
    return value


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


async def _reasons(api: Client, obj: Mapping[str, Any]) -> dict[str, list[JSON]]:
    """The Events about `obj` (by uid), by reason."""
    meta = obj["metadata"]
    selector = f"involvedObject.uid={meta['uid']}"
    found = await api.list(EVENTS, namespace=meta["namespace"], field_selector=selector)
    out: dict[str, list[JSON]] = {}
    for event in found.items:
        out.setdefault(event["reason"], []).append(event)
    return out


async def test_events_tell_kubectl_describe_what_the_controller_did(
    api: Client, cluster: dict[str, str]
) -> None:
    async with namespace(api, "ctl-events") as ns, fake_nodes(api) as (node,):
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        inst = await make_instance(api, config, "cfg-aaaaaa", [node], shared=False)
        async with controller(api, ns):
            pod = (await until_api(lambda: _wait_names(api, ns, {"cfg-aaaaaa-pod"})))[0]
            await set_pod_phase(api, pod, "Failed")

            async def replaced() -> JSON | None:
                pods = await brokers(api, ns)
                new = [p for p in pods if p["metadata"]["uid"] != pod["metadata"]["uid"]]
                return new[0] if new else None

            await set_pod_phase(api, await until_api(replaced, what="a new broker"), "Running")
            want = {"BrokerCreated", "BrokerFailed", "BrokerRecreated", "ServiceCreated"}

            async def told() -> dict[str, list[JSON]] | None:
                reasons = await _reasons(api, inst)
                return reasons if want <= reasons.keys() else None

            reasons = await until_api(told, what=f"Events {sorted(want)} on the Instance")
            (failed,) = reasons["BrokerFailed"]
            assert failed["type"] == "Warning"
            assert (
                failed["message"]
                == "broker Pod cfg-aaaaaa-pod Failed: deleted, to be created again"
            )
            assert failed["source"]["component"] == "akri-controller"
            assert "2 creates since it last ran stably" in reasons["BrokerRecreated"][0]["message"]
            await until_api(
                lambda: _has(api, config, "ServiceCreated"),
                what="ServiceCreated on the Configuration",
            )

        proc = await trio.run_process(
            [cluster["KUBECTL"], "describe", "akrii", "cfg-aaaaaa", "-n", ns],
            env={**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]},
            capture_stdout=True,
        )
        described = proc.stdout.decode()
        events = described[described.index("Events:") :]
        for reason in want:
            assert reason in events, described
        assert "akri-controller" in events


async def _has(api: Client, obj: Mapping[str, Any], reason: str) -> bool:
    return reason in await _reasons(api, obj)


QUOTAS = Resource.core("resourcequotas", "ResourceQuota")


async def test_a_refused_broker_is_a_warning_with_the_api_servers_message(api: Client) -> None:
    """Admission refuses the broker (a quota of no Pods): the Instance says why, once per
    message however often the create is retried."""
    async with namespace(api, "ctl-refused") as ns, fake_nodes(api) as (node,):
        quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
        await api.create(
            QUOTAS, {"apiVersion": "v1", "kind": "ResourceQuota", **quota}, namespace=ns
        )
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        inst = await make_instance(api, config, "cfg-aaaaaa", [node], shared=False)
        async with controller(api, ns):

            async def refused() -> list[JSON] | None:
                return (await _reasons(api, inst)).get("BrokerFailed")

            (event,) = await until_api(refused, what="a BrokerFailed Event on the Instance")
            assert event["type"] == "Warning"
            assert event["message"].startswith("could not create broker Pod cfg-aaaaaa-pod: ")
            assert "exceeded quota" in event["message"]
            assert not await brokers(api, ns)


async def test_a_configuration_update_that_does_not_decode_keeps_brokers_and_services(
    api: Client,
) -> None:
    """Without the webhook, an update the CRD's schema accepts but the model cannot read (no
    `spec`) is not taken for a deletion: the brokers and Services stay as the last version that
    decoded says, until the Configuration is really deleted."""
    async with namespace(api, "ctl-refused") as ns, fake_nodes(api, 1) as (node,):
        config = await _create_config(api, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
        await make_instance(api, config, "cfg-aaaaaa", [node])
        broker = f"{node}-cfg-aaaaaa-pod"
        async with controller(api, ns):
            (pod,) = await until_api(lambda: _wait_names(api, ns, {broker}), what="the broker")
            await set_pod_phase(api, pod, "Running")
            services = {"cfg-aaaaaa-svc", "cfg-svc"}
            await until_api(lambda: _services_are(api, ns, services), what="both Services")

            await api.merge_patch(CONFIGURATIONS, "cfg", {"spec": None}, namespace=ns)
            await trio.sleep(3)  # what the controller would have done by now, it did not
            assert _names(await brokers(api, ns)) == {broker}
            assert (await brokers(api, ns))[0]["metadata"]["uid"] == pod["metadata"]["uid"]
            assert await service_names(api, ns) == services

            await api.delete(CONFIGURATIONS, "cfg", namespace=ns)
            await until_api(lambda: _services_are(api, ns, set()), what="the Services gone")
