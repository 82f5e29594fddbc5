"""DRA mode against the real scheduler: a Pod that kube-scheduler refused an Akri device ("cannot
allocate all claims") gets the scheduler to look again, through an annotation on the device's
DeviceClass (akri_trio/controller/dra/requeue.py).

The refusal here is a true one (the one slot is held by another Pod): the scheduler's miscount
that makes the nudges worth having comes only in bursts (bench.dra_storm). A fake Node stands in
for a kubelet: the scheduler binds to it and allocates the claim, nothing runs.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime

import trio

from akri_trio import dra
from akri_trio.controller.dra.requeue import NUDGES_AFTER_S, REFUSAL, REQUEUE_ANNOTATION
from akri_trio.dra import DEVICE_CLASSES
from akri_trio.kube import JSON, Client, NotFound
from akri_trio.kube.events import EVENTS
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS
from tests.controller.support import (
    NO_KUBELET_TAINT,
    PODS,
    broker_config,
    make_instance,
    schedulable_nodes,
)
from tests.controller.test_controller_dra import controller, dra_namespace
from tests.support.kubectl import busybox_pod
from tests.support.polling import until_api
from tests.support.releases import skip_without

INSTANCE = "cfg-aaaaaa"


def device_pod(name: str, ns: str, node: str) -> JSON:
    pod = busybox_pod(name, ns, "sleep 3600", limits={naming.resource_name(INSTANCE): 1})
    pod["spec"]["nodeSelector"] = {dra.HOSTNAME_LABEL: node}
    pod["spec"]["tolerations"] = [{**NO_KUBELET_TAINT, "operator": "Exists"}]
    return pod


async def _annotation(api: Client, name: str) -> str | None:
    body = await api.get(DEVICE_CLASSES, name)
    return ((body.get("metadata") or {}).get("annotations") or {}).get(REQUEUE_ANNOTATION)


async def test_a_pod_refused_a_device_gets_the_scheduler_to_look_again(
    api: Client, cluster: dict[str, str]
) -> None:
    skip_without(cluster, "DRAExtendedResource")
    async with dra_namespace(api, "dra-requeue") as ns, schedulable_nodes(api) as (node,):
        config = await api.create(CONFIGURATIONS, broker_config("cfg", ns, capacity=1))
        await make_instance(api, config, INSTANCE, [node])
        class_name = dra.instance_class_name(INSTANCE, ns)
        try:
            async with controller(api, ns):

                async def class_serves() -> bool:
                    with suppress(NotFound):
                        body = await api.get(DEVICE_CLASSES, class_name)
                        return "extendedResourceName" in body["spec"]
                    return False

                await until_api(class_serves, what="the Instance's DeviceClass")
                await api.create(PODS, device_pod("first", ns, node), namespace=ns)

                async def bound() -> bool:
                    pod = await api.get(PODS, "first", namespace=ns)
                    return bool(pod["spec"].get("nodeName"))

                await until_api(bound, seconds=60, what="the first Pod bound with the slot")
                assert await _annotation(api, class_name) is None  # nothing refused yet
                await api.create(PODS, device_pod("second", ns, node), namespace=ns)

                async def refused() -> bool:
                    pod = await api.get(PODS, "second", namespace=ns)
                    conditions = (pod.get("status") or {}).get("conditions") or []
                    return any(REFUSAL in str(c.get("message")) for c in conditions)

                await until_api(refused, seconds=60, what="the second Pod refused the device")
                first = await until_api(
                    lambda: _annotation(api, class_name),
                    seconds=30 + NUDGES_AFTER_S[0],
                    what="the class annotated for the refused Pod",
                )
                # The scheduler tried the Pod again after the nudge (nothing else changed).
                again = await until_api(
                    lambda: _refused_again(api, ns, "second"),
                    seconds=30,
                    what="the scheduler's second try of the refused Pod",
                )
                # (the core recorder's times are whole seconds)
                assert again >= datetime.fromisoformat(first).replace(microsecond=0)
                second = await until_api(
                    lambda: _nudged_again(api, class_name, first),
                    seconds=30 + NUDGES_AFTER_S[1],
                    what="a second nudge, the Pod still refused",
                )
                assert second != first
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                for name in ("first", "second"):
                    with suppress(NotFound):
                        await api.delete(PODS, name, namespace=ns, grace_period_seconds=0)


async def _nudged_again(api: Client, class_name: str, before: str) -> str | None:
    now = await _annotation(api, class_name)
    return now if now != before else None


async def _refused_again(api: Client, ns: str, pod: str) -> datetime | None:
    """When the scheduler last refused `pod`, once it has refused it more than once (its
    FailedScheduling events: the count and last time of the core recorder's, or the series of
    the events API's), None before."""
    refusals, last = 0, None
    for event in (await api.list(EVENTS, namespace=ns)).items:
        involved = event.get("involvedObject") or {}
        if event.get("reason") != "FailedScheduling" or involved.get("name") != pod:
            continue
        series = event.get("series") or {}
        refusals += int(series.get("count") or event.get("count") or 1)
        stamp = series.get("lastObservedTime") or event.get("lastTimestamp") or event["eventTime"]
        when = datetime.fromisoformat(stamp)
        last = when if last is None else max(last, when)
    return last if refusals > 1 else None
