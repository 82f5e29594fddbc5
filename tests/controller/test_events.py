"""Which Event each of the controller's writes means (akri_trio.controller.events)."""

from __future__ import annotations

from typing import Any

from akri_trio.controller import Delete, Retry, broker_pod, configuration_service
from akri_trio.controller import events as ev
from akri_trio.controller.reconcilers import about, about_owner
from akri_trio.kube import ObjectRef
from tests.controller.objects import CONFIG, INSTANCE, configuration, instance

SERVICE_SPEC: dict[str, Any] = {"ports": [{"port": 80}]}
POD_SPEC: dict[str, Any] = {"containers": [{"name": "b", "image": "busybox"}]}


def _pod() -> dict[str, Any]:
    return broker_pod(configuration({"brokerPodSpec": POD_SPEC}), instance(), "node-a")


def test_a_created_broker_is_told_on_its_instance() -> None:
    event = ev.created(_pod(), Retry(1, 10.0))
    assert event is not None
    assert (event.type, event.reason) == ("Normal", "BrokerCreated")
    assert event.message == f"broker Pod node-a-{INSTANCE}-pod created for node node-a"
    # The recorder takes the subject as an object: kubectl describe matches kind, name, uid.
    assert ObjectRef.of(event.obj) == ObjectRef(
        "akri.sh/v0", "Instance", "ns", INSTANCE, f"{INSTANCE}-uid"
    )


def test_a_second_create_is_a_recreation_with_its_count() -> None:
    event = ev.created(_pod(), Retry(3, 10.0))
    assert event is not None
    assert event.reason == "BrokerRecreated"
    assert "created again (3 creates since it last ran stably)" in event.message


def test_a_configuration_service_is_told_on_its_configuration() -> None:
    body = configuration_service(configuration(configurationServiceSpec=SERVICE_SPEC))
    assert body is not None
    event = ev.created(body)
    assert event is not None
    assert (event.reason, event.obj["kind"], event.obj["metadata"]["name"]) == (
        "ServiceCreated",
        "Configuration",
        CONFIG,
    )
    on = ev.owner(body)
    gone = ev.deleted("Service", Delete("ns", f"{CONFIG}-svc", "u"), on)
    assert gone is not None and gone.reason == "ServiceDeleted"


def test_an_ended_broker_is_a_warning_and_a_departed_node_is_not() -> None:
    on = ev.ref(instance())
    for reason in ("Failed", "Succeeded", "Pending for more than 300 s"):
        event = ev.deleted("Pod", Delete("ns", "p", "u", reason), on)
        assert event is not None
        assert (event.type, event.reason) == ("Warning", "BrokerFailed"), reason
        assert reason in event.message
    left = ev.deleted("Pod", Delete("ns", "p", "u", "not desired"), on)
    assert left is not None
    assert (left.type, left.reason) == ("Normal", "BrokerDeleted")
    assert "its node left the Instance" in left.message
    assert ev.deleted("Pod", Delete("ns", "p", "u", "Failed"), None) is None  # owner gone


def test_a_refused_create_says_why() -> None:
    event = ev.refused(_pod(), 'pods "x" is forbidden: exceeded quota')
    assert event is not None
    assert (event.type, event.reason) == ("Warning", "BrokerFailed")
    assert event.message.endswith(
        "could not create broker Pod node-a-" + INSTANCE + "-pod: "
        'pods "x" is forbidden: exceeded quota'
    )
    assert ev.refused({"kind": "Pod", "metadata": {"name": "x"}}, "no") is None  # no owner


def test_node_lost_names_the_node_why_and_what_was_freed() -> None:
    on = ev.ref(instance())
    event = ev.node_lost("node-a", "NotReady", on, ["b-1", "a-0"], left=True)
    assert (event.type, event.reason) == ("Warning", "NodeLost")
    assert event.message == "node node-a lost (NotReady): removed from its nodes; freed a-0, b-1"
    only_finalizer = ev.node_lost("node-a", "deleted", on, [], left=False)
    assert only_finalizer.message.endswith("its finalizer removed")
    config = ev.ref(configuration())
    assert (
        "Instance i had no other node" in ev.instance_deleted("n", "deleted", config, "i").message
    )
    assert ev.status_released("n", "deleted", config).obj["kind"] == "Configuration"


def test_log_fields_name_the_configuration_instance_and_node() -> None:
    assert about(_pod()) == {
        "configuration": f"ns/{CONFIG}",
        "instance": f"ns/{INSTANCE}",
        "node": "node-a",
    }
    assert about_owner(ev.ref(configuration())) == {"configuration": f"ns/{CONFIG}"}
    assert about_owner(ev.ref(instance())) == {"instance": f"ns/{INSTANCE}"}
    assert about_owner(None) == {}
