"""`python -m akri_trio_dev cluster up --nodes 3` and `cluster node ...`: three real kubelets on one
control plane, and an extra node lost and brought back the two ways a real one is.

Uses the session's nodes (conftest `multi_node_cluster`): node 1 is shared and never touched;
each test leaves the extra node it stopped or partitioned running and connected again.
"""

from __future__ import annotations

import functools
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster import flags, iptables, netrules, procs
from akri_trio_dev.cluster.layout import EXTRA_NODE_TOLERATION, Layout, NodeLayout
from tests.support.fleet import node_command
from tests.support.kubectl import Kubectl, busybox_pod
from tests.support.polling import until

NAMESPACE = "multinode-test"
# Long enough for the controller-manager's default 50 s node grace too (a cluster started
# before the shortened one was configured).
NODE_LOSS_S = 120


@pytest.fixture
def kubectl(multi_node_cluster: list[dict[str, str]]) -> Iterator[Kubectl]:
    k = Kubectl(multi_node_cluster[0])
    k("create", "namespace", NAMESPACE, check=False)
    yield k
    k("delete", "pods", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=60s", check=False)


def _ready(kubectl: Kubectl, node: str) -> str:
    conds = kubectl.json("get", "node", node)["status"]["conditions"]
    return str(next(c["status"] for c in conds if c["type"] == "Ready"))


def _finished(kubectl: Kubectl, pod: str) -> dict[str, Any] | None:
    obj: dict[str, Any] = kubectl.json("get", "pod", pod, "-n", NAMESPACE)
    return obj if obj["status"].get("phase") in ("Succeeded", "Failed") else None


def _pinned(name: str, node: Mapping[str, str], script: str) -> dict[str, Any]:
    """A host-network busybox Pod the scheduler must place on `node`."""
    pod = busybox_pod(name, NAMESPACE, script)
    pod["spec"] |= {
        "hostNetwork": True,
        "nodeSelector": {"kubernetes.io/hostname": node["AKRI_TRIO_NODE_NAME"]},
        "tolerations": [EXTRA_NODE_TOLERATION],
    }
    return pod


def test_three_nodes_each_with_its_own_sockets(multi_node_cluster: list[dict[str, str]]) -> None:
    names = [n["AKRI_TRIO_NODE_NAME"] for n in multi_node_cluster]
    assert names[1:] == ["127.0.0.2", "127.0.0.3"]
    for key in (
        "AKRI_TRIO_DEVICE_PLUGIN_DIR",
        "AKRI_TRIO_POD_RESOURCES_SOCKET",
        "AKRI_TRIO_KUBELET_ROOT_DIR",
        "AKRI_TRIO_CDI_DIR",
        "AKRI_TRIO_CONTAINERD_SOCKET",
    ):
        assert len({n[key] for n in multi_node_cluster}) == 3, key
    kubectl = Kubectl(multi_node_cluster[0])
    for node in multi_node_cluster:
        assert _ready(kubectl, node["AKRI_TRIO_NODE_NAME"]) == "True"
        # Each kubelet serves its own registration socket, in its own device-plugin dir.
        registration = Path(node["AKRI_TRIO_DEVICE_PLUGIN_DIR"]) / "kubelet.sock"
        assert stat.S_ISSOCK(registration.stat().st_mode), registration


def test_extra_nodes_see_their_own_dirs_at_the_standard_kubelet_paths(
    multi_node_cluster: list[dict[str, str]],
) -> None:
    """In the mounts an extra node's containerd and kubelet share, the fixed kubelet paths a
    DaemonSet's Pod mounts (device plugins, pod resources) are the node's own directories:
    bound when the runtime starts, or by `up` on a runtime an older tree started."""
    lay = Layout.default()
    for node in multi_node_cluster[1:]:
        _, extra = _extra(node["AKRI_TRIO_NODE_NAME"])
        for process in (extra.containerd_process, extra.kubelet_process):
            rec = procs.running(lay.pid_file(process))
            assert rec is not None, process
            root = Path(f"/proc/{rec.pid}/root")  # paths as that process sees them
            for target, source in flags.node_binds(extra):
                seen, own = (root / target.lstrip("/")).stat(), Path(source).stat()
                assert (seen.st_dev, seen.st_ino) == (own.st_dev, own.st_ino), (process, target)
        socket = Path(node["AKRI_TRIO_POD_RESOURCES_SOCKET"])
        assert socket.parent == Path(dict(flags.node_binds(extra))[flags.POD_RESOURCES_PATH])


def test_a_pod_on_each_node_reaches_the_api_server_through_its_node(
    multi_node_cluster: list[dict[str, str]], kubectl: Kubectl
) -> None:
    """The scheduler places one Pod on each node; each talks HTTP to the API server's TLS port
    at its node's address and gets the Go TLS server's plain-HTTP answer; `kubectl logs`
    reaches each kubelet."""
    for i, node in enumerate(multi_node_cluster):
        address = node["AKRI_TRIO_NODE_ADDRESS"]
        script = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {address} 16443"
        kubectl.apply(_pinned(f"api-{i}", node, script))
    for i, node in enumerate(multi_node_cluster):
        name = f"api-{i}"
        pod = until(functools.partial(_finished, kubectl, name), 60, f"pod {name} finished")
        assert pod["spec"]["nodeName"] == node["AKRI_TRIO_NODE_NAME"]
        logs = kubectl("logs", name, "-n", NAMESPACE)
        assert "400 Bad Request" in logs, logs


def test_node_stop_makes_it_not_ready_and_start_ready_again(
    multi_node_cluster: list[dict[str, str]], kubectl: Kubectl
) -> None:
    node = multi_node_cluster[2]["AKRI_TRIO_NODE_NAME"]
    kubectl.apply(_pinned("victim", multi_node_cluster[2], "sleep 3600"))
    until(
        lambda: (
            kubectl.json("get", "pod", "victim", "-n", NAMESPACE)["status"].get("phase")
            == "Running"
        ),
        seconds=60,
        what="pod on the node running",
    )
    node_command("stop", node)
    try:
        until(lambda: _ready(kubectl, node) != "True", NODE_LOSS_S, f"{node} NotReady")
        # Its runtime and containers went with it: no containerd, no shim of it is left.
        lay, extra = _extra(node)
        assert procs.running(lay.pid_file(extra.containerd_process)) is None
        assert procs.running(lay.pid_file(extra.kubelet_process)) is None
        assert not procs.find_processes("containerd-shim-runc-v2", str(extra.containerd_socket))
        assert _ready(kubectl, multi_node_cluster[1]["AKRI_TRIO_NODE_NAME"]) == "True"
    finally:
        node_command("start", node)
    assert _ready(kubectl, node) == "True"


def test_node_partition_cuts_only_that_node_and_heal_restores_it(
    multi_node_cluster: list[dict[str, str]], kubectl: Kubectl
) -> None:
    cut, other = (n["AKRI_TRIO_NODE_NAME"] for n in multi_node_cluster[1:])
    kubelet_pid = _kubelet_pid(cut)
    node_command("partition", cut)
    try:
        until(lambda: _ready(kubectl, cut) != "True", NODE_LOSS_S, f"{cut} NotReady")
        assert _ready(kubectl, other) == "True"
        assert _kubelet_pid(cut) == kubelet_pid  # cut off, not stopped
    finally:
        node_command("heal", cut)
    until(lambda: _ready(kubectl, cut) == "True", 60, f"{cut} Ready after heal")


def test_up_heals_a_partition_left_by_a_killed_session(
    multi_node_cluster: list[dict[str, str]], kubectl: Kubectl
) -> None:
    """A session killed between `node partition` and `heal` leaves the DROP behind; the next
    `up --nodes 3` lifts it, so the node's kubelet reaches the API server again."""
    cut = multi_node_cluster[1]["AKRI_TRIO_NODE_NAME"]
    lay, node = _extra(cut)
    rule = netrules.partition(node.address, lay.ports.apiserver, lay.ports.kubelet)
    node_command("partition", cut)
    try:
        proc = run_cluster_command("up", "--nodes", "3", capture_output=True, timeout=180)
    finally:
        iptables.remove(rule)  # never leave it cut, whatever `up` did
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"healed a leftover partition of node {cut}" in proc.stdout
    until(lambda: _ready(kubectl, cut) == "True", 60, f"{cut} Ready after up")


def _extra(node: str) -> tuple[Layout, NodeLayout]:
    lay = Layout.default()
    return lay, lay.node_named(node)


def _kubelet_pid(node: str) -> int:
    lay, extra = _extra(node)
    rec = procs.running(lay.pid_file(extra.kubelet_process))
    assert rec is not None, f"{node}'s kubelet is not running"
    return rec.pid


def test_a_fourth_node_joins_and_node_remove_leaves_nothing_of_it(
    multi_node_cluster: list[dict[str, str]], kubectl: Kubectl
) -> None:
    """`up --nodes 4` adds only node 4; `node remove` takes away its processes, Node object,
    API link, root dir and state, and leaves the other nodes as they were."""
    proc = run_cluster_command("up", "--nodes", "4", capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "started kubelet-127.0.0.4" in proc.stdout
    assert "started kubelet-127.0.0.2" not in proc.stdout  # the others were adopted
    assert _ready(kubectl, "127.0.0.4") == "True"
    lay, fourth = _extra("127.0.0.4")
    node_command("remove", "127.0.0.4")
    assert kubectl("get", "node", "127.0.0.4", "--ignore-not-found") == ""
    assert procs.running(lay.pid_file(fourth.kubelet_process)) is None
    assert procs.running(lay.pid_file(fourth.containerd_process)) is None
    assert not fourth.root_dir.exists() and not fourth.state.exists()
    assert not iptables.present(netrules.api_link(fourth.address, lay.ports.apiserver))
    for node in multi_node_cluster:
        assert _ready(kubectl, node["AKRI_TRIO_NODE_NAME"]) == "True"
