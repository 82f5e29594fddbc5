"""`helm upgrade --set allocation=dra` on a release with a running broker and a running Pod in
device-plugin mode, and `helm upgrade --set allocation=device-plugin` back, on the real node
(issue 24, item 5).

There: the chart's agent and controller Pods restart in DRA mode, no slot is held twice at any
moment, the broker comes back with a claim, the device-plugin Pod keeps its slot until it ends
(a new Pod waits for it), and the node's device-plugin resource drops to 0.

And back (the chart's `draSwitchBack`, on by default, gives the device-plugin release DRA
mode's directories and the controller the rights to delete what DRA mode left): the Pod of DRA
mode keeps running with its slot recorded as the node's, the broker comes back without a claim,
the DeviceClasses go, the node's device-plugin resource comes back, and when the Pod ends (not
stuck Terminating: the agent unprepares its claim) a new device-plugin Pod takes its slot and
the node's ResourceSlices go.

One debugEcho Instance of capacity 2, held by the broker and a Pod before each upgrade. A
sampler (tests/support/holders.py) records, every half second through the whole module, how
many hold the device: its deviceUsage slots plus the claims allocated it (a claim and its
`D:`/`DX:` records count once). The release is this module's own (see
tests/support/release.py); uninstalling it is the only teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from akri_trio import dra
from akri_trio.controller import names
from akri_trio.model import naming
from tests.support.holders import Holders
from tests.support.kubectl import busybox_pod
from tests.support.polling import until
from tests.support.release import Release, release
from tests.support.releases import lacks, skip

pytestmark = pytest.mark.node

CONFIG = "switch-echo"
DESCRIPTION = "switch0"
CAPACITY = 2
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"


@pytest.fixture(scope="module")
def rel(
    node_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    with release(node_cluster, "switch", tmp_path_factory.mktemp("chart")) as r:
        r.components = ("akri-agent", "akri-controller")
        r.install(
            {
                "agent": {
                    "full": True,
                    "allowDebugEcho": True,
                    "host": {"cdi": node_cluster["AKRI_TRIO_CDI_DIR"]},
                },
                "debugEcho": {
                    "configuration": {
                        "enabled": True,
                        "name": CONFIG,
                        "capacity": CAPACITY,
                        "shared": False,
                        "discoveryDetails": {"descriptions": [DESCRIPTION]},
                        "brokerPod": {
                            "image": {
                                "repository": "docker.io/library/busybox",
                                "tag": "latest",
                                "pullPolicy": "Never",
                            },
                            "command": ["sh", "-c", SLEEP],
                        },
                    }
                },
            }
        )
        yield r


@pytest.fixture(scope="module")
def holders(rel: Release) -> Iterator[Holders]:
    instance = naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, rel.node))
    with Holders(rel.kubectl, rel.namespace, instance).sampling() as h:
        yield h


def _broker(rel: Release) -> dict[str, Any] | None:
    """The one live broker Pod, or None while there are none or two."""
    live = [
        p
        for p in rel.pods_of(CONFIG)
        if not p["metadata"].get("deletionTimestamp")
        and not p["metadata"]["name"].startswith("user-")
    ]
    return live[0] if len(live) == 1 else None


def _new_broker(rel: Release, holders: Holders, old: dict[str, Any]) -> dict[str, Any]:
    """The broker made in place of `old`, once it is the only one and Running."""

    def new() -> dict[str, Any] | None:
        pod = _broker(rel)
        return pod if pod and pod["metadata"]["uid"] != old["metadata"]["uid"] else None

    broker: dict[str, Any] = rel.until(new, "the broker made again", seconds=240)
    name = broker["metadata"]["name"]
    rel.until(lambda: holders.phase(name) == "Running", "the new broker Running", seconds=240)
    return broker


def _allocatable(rel: Release, holders: Holders) -> str:
    """The node's allocatable count of the Instance's device-plugin resource ("0" without)."""
    resource = f"akri.sh/{holders.instance}"
    return rel.allocatable({resource}).get(resource, "0")


def test_in_device_plugin_mode_a_broker_and_a_pod_hold_both_slots(
    rel: Release, holders: Holders
) -> None:
    name = names.broker_pod_name(holders.instance, rel.node, shared=False)
    rel.until(lambda: holders.phase(name) == "Running", "the broker Running", seconds=180)
    pod = busybox_pod("user-dp", rel.namespace, SLEEP, {f"akri.sh/{holders.instance}": 1})
    rel.kubectl.apply(pod)
    rel.until(lambda: holders.phase("user-dp") == "Running", "user-dp Running", seconds=120)
    assert sorted(holders.usage().values()) == [rel.node, rel.node]


def test_the_upgrade_to_dra_brings_the_broker_back_with_a_claim(
    rel: Release, holders: Holders
) -> None:
    old = _broker(rel)
    assert old is not None
    rel.upgrade({"allocation": "dra"})
    rel.until(
        lambda: _allocatable(rel, holders) == "0", "the device-plugin resource at 0", seconds=180
    )
    broker = _new_broker(rel, holders, old)
    assert [c["name"] for c in broker["spec"]["resourceClaims"]] == ["akri"]
    assert holders.phase("user-dp") == "Running"
    assert list(holders.usage().values()) == [rel.node]  # user-dp's, still held


@pytest.mark.k8s_feature("DRAExtendedResource")  # the Pod asks for akri.sh/<instance>
def test_a_new_pod_waits_for_the_slot_the_old_pod_holds(rel: Release, holders: Holders) -> None:
    pod = busybox_pod("user-dra", rel.namespace, SLEEP, {f"akri.sh/{holders.instance}": 1})
    rel.kubectl.apply(pod)
    holders.wait_unschedulable("user-dra", "user-dp holds the slot")
    rel.kubectl("delete", "pod", "user-dp", "-n", rel.namespace, "--wait=true", "--timeout=60s")
    rel.until(lambda: holders.phase("user-dra") == "Running", "user-dra Running", seconds=180)
    assert holders.usage() == {}


def test_the_upgrade_back_deletes_the_device_classes_and_brings_the_broker_back_without_a_claim(
    rel: Release, holders: Holders
) -> None:
    old = _broker(rel)
    assert old is not None and old["spec"].get("resourceClaims")
    rel.upgrade({"allocation": "device-plugin"})
    # The controller, with the chart's rights in device-plugin mode, deletes DRA mode's classes:
    # nothing asking for akri.sh/... is allocated through DRA any more.
    classes = (
        dra.device_class_name(CONFIG, rel.namespace),
        dra.instance_class_name(holders.instance, rel.namespace),
    )
    rel.until(
        lambda: not any(holders.get("deviceclass", c) for c in classes),
        "the DeviceClasses deleted",
        seconds=180,
    )
    # The DRA broker ends (the agent unprepares its claim), a device-plugin one takes its slot.
    broker = _new_broker(rel, holders, old)
    assert "resourceClaims" not in broker["spec"]
    pods = holders.get("pods", "-n", rel.namespace).get("items", [])
    assert old["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}  # not stuck
    # Both slots offered again: the broker's, and user-dra's, recorded DX: (healthy, as the
    # scheduler counts user-dra's akri.sh/<instance> against it), or user-dp's without it.
    rel.until(
        lambda: _allocatable(rel, holders) == str(CAPACITY),
        "the device-plugin resource back",
        seconds=180,
    )
    missing = lacks(rel.env, "DRAExtendedResource")
    if missing:  # no user-dra: it asks for akri.sh/<instance>
        skip(f"user-dra's slot was not checked: {missing}")
    assert holders.phase("user-dra") == "Running"
    (claim,) = holders.allocated()
    assert sorted(holders.usage().values()) == sorted([rel.node, f"DX:{claim}:{rel.node}"])


@pytest.mark.k8s_feature("DRAExtendedResource")  # user-dra asks for akri.sh/<instance>
def test_the_dra_pod_ends_cleanly_and_a_device_plugin_pod_takes_its_slot(
    rel: Release, holders: Holders
) -> None:
    pod = busybox_pod("user-dp2", rel.namespace, SLEEP, {f"akri.sh/{holders.instance}": 1})
    rel.kubectl.apply(pod)
    holders.wait_unschedulable("user-dp2", "user-dra holds the slot")
    # Ends (not stuck Terminating): the device-plugin-mode agent unprepares its claim.
    rel.kubectl("delete", "pod", "user-dra", "-n", rel.namespace, "--wait=true", "--timeout=60s")
    rel.until(lambda: holders.phase("user-dp2") == "Running", "user-dp2 Running", seconds=180)
    assert list(holders.usage().values()) == [rel.node, rel.node]


def test_the_nodes_resource_slices_go_with_the_last_claim(rel: Release, holders: Holders) -> None:
    """Once no claim of DRA mode is left on the node, the agent's kubelet plugin stops and the
    kubelet deletes the node's ResourceSlices (30 s after it unregisters)."""

    def slices() -> list[str]:
        found = holders.get("resourceslices", "-l", f"{dra.LABEL_NAMESPACE}={rel.namespace}")
        return [s["metadata"]["name"] for s in found.get("items", [])]

    rel.until(lambda: not slices(), "the node's ResourceSlices gone", seconds=180)
    assert holders.allocated() == {}


def test_no_slot_was_held_twice(holders: Holders) -> None:
    assert holders.samples > 10
    assert holders.most == CAPACITY, holders.when_most  # both were held, never more


def test_the_release_uninstalls(rel: Release) -> None:
    for pod in ("user-dp", "user-dp2"):  # either, as the release's features allowed
        rel.kubectl(
            "delete",
            "pod",
            pod,
            "-n",
            rel.namespace,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        )
    rel.uninstall()
    until(lambda: not rel.pods_of(CONFIG), seconds=120, what="the brokers gone")
