"""akri-trio as Pods on the real node, upstream's end-to-end scenario: the image built offline and
imported into containerd (cached by content hash), the Helm chart installed with Helm v4's
engine with the controller and the webhook, the agent's Pod offering debugEcho devices to the
kubelet, the controller's Pod running a busybox broker per Instance that gets its device's
DEBUG_ECHO_DESCRIPTION and the instance and configuration Services in front of the brokers, a
DaemonSet restart that loses no slot, the webhook's Pod refusing a bad Configuration, upstream's
offline scenario (the devices go and come back, and with them Instances, brokers and Services),
an upgrade, and an uninstall that leaves nothing behind (see tests/support/release.py for how a
release is scoped on the shared node).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from akri_trio.controller import names
from akri_trio.model import naming
from tests.support.kubectl import busybox_pod, free_port
from tests.support.polling import until
from tests.support.release import Release, release

pytestmark = pytest.mark.node

CONFIG = "ship-echo"
DESCRIPTIONS = ("ship0", "ship1")
CAPACITY = 3  # a broker, and two consumers of the test of the agent's restart
# prints its device's env, then waits; exits at once on SIGTERM (sh as PID 1 would ignore it)
BROKER_SCRIPT = "trap 'exit 0' TERM; env | grep ^DEBUG_ECHO; sleep 3600 & wait"
COMPONENTS = ("akri-agent", "akri-controller", "akri-webhook-configuration")


def values(rel: Release) -> dict[str, Any]:
    webhook_port = free_port()
    return {
        # the full agent embeds debugEcho (allowDebugEcho alone embeds nothing, as upstream)
        "agent": {"full": True, "allowDebugEcho": True},
        # by URL: this API server cannot reach Services; only this run's namespace, and Ignore
        # so that nothing this test writes while the webhook Pod (re)starts is refused (a denial
        # is still a denial; the install's sample Configuration is not sent to it anyway)
        "webhookConfiguration": {
            "enabled": True,
            "replicas": 1,
            "port": webhook_port,
            "url": f"https://127.0.0.1:{webhook_port}/validate",
            "certIPs": ["127.0.0.1"],
            "failurePolicy": "Ignore",
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": rel.namespace}},
        },
        "debugEcho": {
            "configuration": {
                "enabled": True,
                "name": CONFIG,
                "capacity": CAPACITY,
                "shared": False,
                "discoveryDetails": {"descriptions": list(DESCRIPTIONS)},
                "brokerPod": {
                    "image": {
                        "repository": "docker.io/library/busybox",
                        "tag": "latest",
                        "pullPolicy": "Never",
                    },
                    "command": ["sh", "-c", BROKER_SCRIPT],
                },
            }
        },
    }


def instance_name(rel: Release, description: str) -> str:
    return naming.instance_name(CONFIG, naming.device_hash(description, rel.node))


def instances(rel: Release) -> dict[str, str]:
    return {d: instance_name(rel, d) for d in DESCRIPTIONS}


def broker(rel: Release, description: str) -> str:
    return names.broker_pod_name(instance_name(rel, description), rel.node, shared=False)


def resources(rel: Release) -> set[str]:
    return {f"akri.sh/{i}" for i in instances(rel).values()} | {f"akri.sh/{CONFIG}"}


def consumer(rel: Release, name: str, instance: str) -> None:
    script = "env | grep ^DEBUG_ECHO; sleep 3600"
    rel.kubectl.apply(busybox_pod(name, rel.namespace, script, {f"akri.sh/{instance}": 1}))


def running(rel: Release, pod: str) -> bool:
    return (
        bool(
            rel.get("pods", "-n", rel.namespace, "--field-selector", f"metadata.name={pod}")[
                "items"
            ]
        )
        and rel.phase(pod) == "Running"
    )


@pytest.fixture(scope="module")
def rel(
    node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    with release(node_cluster, "ship", tmp_path_factory.mktemp("chart")) as r:
        try:
            r.components = COMPONENTS
            r.install(values(r))
            yield r
        finally:
            r.kubectl("delete", "pods", "-n", r.namespace, "first", "second", check=False)


def test_agent_pod_offers_the_devices(rel: Release) -> None:
    rel.until(lambda: rel.ready_pod("akri-agent"), "the agent Pod Ready", seconds=120)
    expected = {f"akri.sh/{i}": str(CAPACITY) for i in instances(rel).values()}
    # "any of them": a virtual device per Instance with a free slot
    expected[f"akri.sh/{CONFIG}"] = str(len(DESCRIPTIONS))
    rel.until(lambda: rel.allocatable(resources(rel)) == expected, "the plugins on the node")
    items = rel.get("instances.akri.sh", "-n", rel.namespace)["items"]
    assert {i["metadata"]["name"] for i in items} == set(instances(rel).values())
    for inst in items:
        assert inst["spec"]["nodes"] == [rel.node]
        assert inst["spec"]["configurationName"] == CONFIG
    agent = rel.ready_pod("akri-agent")
    assert agent is not None
    spec = agent["spec"]
    assert spec["hostNetwork"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_controller_pod_leads_and_runs_a_broker_per_instance(rel: Release) -> None:
    pod = rel.until(lambda: rel.ready_pod("akri-controller"), "the controller Ready", 120)
    lease = rel.get("lease", "akri-controller", "-n", rel.namespace)
    assert lease["spec"]["holderIdentity"].startswith(pod["metadata"]["name"] + "_")
    assert pod["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] is True
    for description, instance in instances(rel).items():
        name = broker(rel, description)
        rel.until(functools.partial(running, rel, name), f"broker {name} Running", seconds=90)
        # the agent's Allocate gave the broker its device, through the kubelet
        env = until(functools.partial(rel.logs, name), what=f"{name}'s output")
        assert f"DEBUG_ECHO_DESCRIPTION={description}" in env.splitlines()
        pod = rel.get("pod", name, "-n", rel.namespace)
        labels = pod["metadata"]["labels"]
        assert labels[naming.LABEL_INSTANCE] == instance
        assert labels[naming.LABEL_CONFIGURATION] == CONFIG
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits[f"akri.sh/{instance}"] == "1"  # {{PLACEHOLDER}}, renamed
        assert list(rel.usage()[instance].values()) == [rel.node]  # the broker's slot


def fronts(rel: Release, service: str, ips: set[str]) -> bool:
    """Whether `service`'s EndpointSlices hold exactly the Pod addresses `ips`."""
    slices = rel.get(
        "endpointslices", "-n", rel.namespace, "-l", f"kubernetes.io/service-name={service}"
    )["items"]
    return {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]} == ips


def test_services_front_the_brokers(rel: Release) -> None:
    ips: dict[str, str] = {}
    for description, instance in instances(rel).items():
        name = broker(rel, description)
        ips[instance] = rel.get("pod", name, "-n", rel.namespace)["status"]["podIP"]
    for instance, ip in ips.items():
        service = names.instance_service_name(instance)
        rel.until(functools.partial(fronts, rel, service, {ip}), f"{service} -> its broker")
    config_service = names.configuration_service_name(CONFIG)
    rel.until(
        functools.partial(fronts, rel, config_service, set(ips.values())),
        f"{config_service} -> every broker",
    )
    svc = rel.get("service", config_service, "-n", rel.namespace)
    assert svc["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(6052, 6052)]


def test_a_new_agent_pod_loses_no_slot(rel: Release) -> None:
    instance = instances(rel)[DESCRIPTIONS[0]]
    consumer(rel, "first", instance)
    until(lambda: rel.phase("first") == "Running", what="the first consumer Running")
    held = rel.usage()[instance]
    assert sorted(held.values()) == [rel.node, rel.node]  # the broker's and the first's

    old = rel.ready_pod("akri-agent")
    assert old is not None
    rel.kubectl("delete", "pod", "-n", rel.namespace, old["metadata"]["name"])
    new = rel.until(
        lambda: (
            (p := rel.ready_pod("akri-agent"))
            and p["metadata"]["uid"] != old["metadata"]["uid"]
            and p
        ),
        "a new agent Pod Ready",
        seconds=120,
    )
    assert new["metadata"]["name"] != old["metadata"]["name"]
    # the slots the broker and the running consumer hold are still held, nothing else is
    until(
        lambda: rel.allocatable(resources(rel)).get(f"akri.sh/{instance}") == str(CAPACITY),
        what="the plugin back",
    )
    assert rel.usage()[instance] == held
    assert rel.phase("first") == "Running"
    assert rel.phase(broker(rel, DESCRIPTIONS[0])) == "Running"
    # and the last slot is still free: a second consumer gets it
    consumer(rel, "second", instance)
    until(lambda: rel.phase("second") == "Running", what="the second consumer Running")
    assert sorted(rel.usage()[instance].values()) == [rel.node] * 3
    rel.kubectl(
        "delete", "pod", "-n", rel.namespace, "first", "second", "--wait=true", "--timeout=60s"
    )


def test_the_webhook_pod_refuses_a_bad_configuration(rel: Release) -> None:
    rel.until(lambda: rel.ready_pod("akri-webhook-configuration"), "the webhook Ready", 120)
    bad = {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": "ship-bad", "namespace": rel.namespace},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": "descriptions: [b]"},
            "brokerSpec": {
                "brokerPodSpec": {
                    "containers": [{"name": "b", "image": "x", "imagePullPolcy": "Never"}]
                }
            },
        },
    }
    with pytest.raises(AssertionError, match=r"denied the request(.|\n)*imagePullPolcy"):
        rel.kubectl.apply(bad)
    configurations = rel.get("configurations.akri.sh", "-n", rel.namespace)["items"]
    assert [c["metadata"]["name"] for c in configurations] == [CONFIG]


def availability(rel: Release, text: str) -> None:
    """debugEcho's availability file in the agent's container, as upstream's end-to-end test
    writes it: OFFLINE takes every device away, anything else brings them back."""
    agent = rel.ready_pod("akri-agent")
    assert agent is not None
    script = f"echo {text} > /tmp/debug-echo-availability.txt"
    rel.kubectl("exec", "-n", rel.namespace, agent["metadata"]["name"], "--", "sh", "-c", script)


def services(rel: Release) -> set[str]:
    """The Services the controller made (the webhook's is the chart's)."""
    made = rel.get("services", "-n", rel.namespace, "-l", f"{naming.LABEL_CONTROLLER}=akri.sh")
    return {s["metadata"]["name"] for s in made["items"]}


def test_devices_offline_and_back(rel: Release) -> None:
    """Upstream's offline scenario: the devices go, and their Instances, brokers and Services
    with them; they come back, and so does everything."""
    availability(rel, "OFFLINE")
    rel.until(lambda: not rel.usage(), "the Instances gone")
    brokers = {broker(rel, d) for d in DESCRIPTIONS}
    rel.until(
        lambda: not brokers & {p["metadata"]["name"] for p in rel.pods_of(CONFIG)},
        "the brokers gone",
    )
    rel.until(lambda: not services(rel), "the Services gone")
    availability(rel, "ONLINE")
    rel.until(lambda: set(rel.usage()) == set(instances(rel).values()), "the Instances back")
    for name in brokers:
        rel.until(functools.partial(running, rel, name), f"broker {name} Running again", 90)
    wanted = {names.instance_service_name(i) for i in instances(rel).values()}
    wanted.add(names.configuration_service_name(CONFIG))
    rel.until(lambda: services(rel) == wanted, "the Services back")


def test_upgrade_changes_the_sample_configuration(rel: Release) -> None:
    """An upgrade goes through the webhook (UPDATE); the agent and the controller follow it."""
    holder = rel.get("lease", "akri-controller", "-n", rel.namespace)["spec"]["holderIdentity"]
    details = {"descriptions": [*DESCRIPTIONS, "ship2"]}
    rel.upgrade({"debugEcho": {"configuration": {"discoveryDetails": details}}})
    rel.until(lambda: len(rel.usage()) == 3, "a third Instance after the upgrade")
    config = rel.get("configurations.akri.sh", CONFIG, "-n", rel.namespace)
    assert "ship2" in config["spec"]["discoveryHandler"]["discoveryDetails"]
    name = broker(rel, "ship2")
    rel.until(lambda: running(rel, name), f"the new Instance's broker {name} Running", 90)
    # the chart's Lease is the leader's still: the upgrade left the fields it does not set
    lease = rel.get("lease", "akri-controller", "-n", rel.namespace)
    assert lease["spec"]["holderIdentity"] == holder


def test_uninstall_leaves_nothing(rel: Release) -> None:
    ns = rel.namespace
    # a Configuration the release did not make: only the pre-delete hook removes it (and must,
    # while the agent still runs to release its Instances' finalizers)
    extra = {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": "ship-extra", "namespace": ns},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": "descriptions: [x9]"},
            "capacity": 1,
        },
    }
    rel.kubectl.apply(extra)
    until(
        lambda: any(name.startswith("ship-extra-") for name in rel.usage()),
        what="the extra Configuration's Instance",
    )
    rel.uninstall()
    assert rel.get("configurations.akri.sh", "-n", ns)["items"] == []
    assert rel.get("instances.akri.sh", "-n", ns)["items"] == []

    # The workloads are gone when uninstall returns, the controller's Lease too; their Pods stop
    # on SIGTERM right after. Brokers and Services went with their Instances.
    until(lambda: not rel.left(), what="the namespace emptied")
    cluster_wide = rel.get("clusterroles,clusterrolebindings")["items"]
    assert [o["metadata"]["name"] for o in cluster_wide if rel.name in o["metadata"]["name"]] == []
    # no device plugin of this run's Configurations is left on the node. (Not checked through the
    # node's allocatable: on a shared node, another session's agent watching every namespace
    # serves these Configurations too while they exist, and the kubelet's bookkeeping of two
    # agents registering one resource is not ours to test.)
    plugins = Path(rel.env["AKRI_TRIO_DEVICE_PLUGIN_DIR"])
    until(
        lambda: (
            not [
                p for p in plugins.glob("*.sock") if p.name.startswith(("ship-echo", "ship-extra"))
            ]
        ),
        what="this run's plugin sockets removed",
    )
    assert not list(rel.handlers_dir.glob("*.sock"))
