"""`helm upgrade --set allocation=dra` on a release with a running broker and a running Pod in
device-plugin mode, on the real node (issue 24, item 5): the chart's agent and controller Pods
restart in DRA mode, no slot is held twice at any moment, the broker comes back with a claim,
the device-plugin Pod keeps its slot until it ends (a new Pod waits for it), and the node's
device-plugin resource drops to 0.

One debugEcho Instance of capacity 2, held by the broker and a Pod before the upgrade. A
sampler records, every half second through the whole module, how many hold the device: its
deviceUsage slots plus the claims allocated it. The release is this module's own (see
tests/support/release.py); uninstalling it is the only teardown.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from akri_trio import dra
from akri_trio.controller import names
from akri_trio.model import naming
from tests.support.kubectl import busybox_pod
from tests.support.polling import until
from tests.support.release import Release, release

pytestmark = pytest.mark.node

CONFIG = "switch-echo"
DESCRIPTION = "switch0"
CAPACITY = 2
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"


class Holders:
    """How many hold the Instance's device, sampled in a thread."""

    def __init__(self, rel: Release, instance: str) -> None:
        self.rel = rel
        self.instance = instance
        self.most = 0
        self.samples = 0
        self.stop = threading.Event()

    def get(self, *args: str) -> dict[str, Any]:
        out = self.rel.kubectl("get", *args, "-o", "json", check=False)
        return dict(json.loads(out)) if out else {}

    def allocated(self) -> int:
        count = 0
        for claim in self.get("resourceclaims", "-n", self.rel.namespace).get("items", []):
            allocation = (claim.get("status") or {}).get("allocation") or {}
            results = (allocation.get("devices") or {}).get("results") or []
            count += sum(
                1
                for r in results
                if r["driver"] == dra.DRIVER and r["device"].startswith(self.instance)
            )
        return count

    def slots(self) -> dict[str, str]:
        inst = self.get("instances.akri.sh", self.instance, "-n", self.rel.namespace)
        return {k: v for k, v in (inst.get("spec") or {}).get("deviceUsage", {}).items() if v}

    def phase(self, pod: str) -> str:
        """The Pod's phase, "" while it does not exist (or the API server restarts)."""
        return str(
            self.get("pod", pod, "-n", self.rel.namespace).get("status", {}).get("phase", "")
        )

    def run(self) -> None:
        while not self.stop.wait(0.5):
            allocated = self.allocated()  # first: a slot freed, then allocated, counts once
            self.most = max(self.most, allocated + len(self.slots()))
            self.samples += 1


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
    h = Holders(rel, naming.instance_name(CONFIG, naming.device_hash(DESCRIPTION, rel.node)))
    thread = threading.Thread(target=h.run, daemon=True)
    thread.start()
    try:
        yield h
    finally:
        h.stop.set()
        thread.join(timeout=30)


def _broker(rel: Release) -> dict[str, Any] | None:
    live = [
        p
        for p in rel.pods_of(CONFIG)
        if not p["metadata"].get("deletionTimestamp") and p["metadata"]["name"] != "user-dp"
    ]
    return live[0] if len(live) == 1 else None


def test_in_device_plugin_mode_a_broker_and_a_pod_hold_both_slots(
    rel: Release, holders: Holders
) -> None:
    name = names.broker_pod_name(holders.instance, rel.node, shared=False)
    rel.until(lambda: holders.phase(name) == "Running", "the broker Running", seconds=180)
    pod = busybox_pod("user-dp", rel.namespace, SLEEP, {f"akri.sh/{holders.instance}": 1})
    rel.kubectl.apply(pod)
    rel.until(lambda: holders.phase("user-dp") == "Running", "user-dp Running", seconds=120)
    assert sorted(holders.slots().values()) == [rel.node, rel.node]


def test_the_upgrade_to_dra_brings_the_broker_back_with_a_claim(
    rel: Release, holders: Holders
) -> None:
    (old,) = [p for p in rel.pods_of(CONFIG) if p["metadata"]["name"] != "user-dp"]
    rel.upgrade({"allocation": "dra"})
    resource = f"akri.sh/{holders.instance}"
    rel.until(
        lambda: rel.allocatable({resource}).get(resource, "0") == "0",
        "the device-plugin resource at 0",
        seconds=180,
    )

    def new_broker() -> dict[str, Any] | None:
        pod = _broker(rel)
        return pod if pod and pod["metadata"]["uid"] != old["metadata"]["uid"] else None

    broker = rel.until(new_broker, "the broker made again", seconds=240)
    assert [c["name"] for c in broker["spec"]["resourceClaims"]] == ["akri"]
    name = broker["metadata"]["name"]
    rel.until(lambda: holders.phase(name) == "Running", "the new broker Running", seconds=240)
    assert holders.phase("user-dp") == "Running"
    assert list(holders.slots().values()) == [rel.node]  # user-dp's, still held


@pytest.mark.k8s_feature("DRAExtendedResource")  # the Pod asks for akri.sh/<instance>
def test_a_new_pod_waits_for_the_slot_the_old_pod_holds(rel: Release, holders: Holders) -> None:
    pod = busybox_pod("user-dra", rel.namespace, SLEEP, {f"akri.sh/{holders.instance}": 1})
    rel.kubectl.apply(pod)

    def unschedulable() -> bool:
        status = holders.get("pod", "user-dra", "-n", rel.namespace).get("status", {})
        return any(c.get("reason") == "Unschedulable" for c in status.get("conditions", []))

    rel.until(unschedulable, "user-dra unschedulable while user-dp holds the slot", seconds=90)
    rel.kubectl("delete", "pod", "user-dp", "-n", rel.namespace, "--wait=true", "--timeout=60s")
    rel.until(lambda: holders.phase("user-dra") == "Running", "user-dra Running", seconds=180)
    assert holders.slots() == {}


def test_no_slot_was_held_twice(holders: Holders) -> None:
    assert holders.samples > 10
    assert holders.most == CAPACITY, holders.most  # both were held, never more


def test_the_dra_release_uninstalls(rel: Release) -> None:
    rel.kubectl(
        "delete",
        "pod",
        "user-dra",
        "-n",
        rel.namespace,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
    )  # not made on a release without DRAExtendedResource
    rel.uninstall()
    until(lambda: not rel.pods_of(CONFIG), seconds=120, what="the brokers gone")
