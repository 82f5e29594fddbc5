"""The multi-node layout, configs and iptables rules, without starting anything: node 1 stays
exactly where the single-node cluster always put it, and nodes 2..N share nothing a kubelet or a
containerd writes."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from akri_trio_dev.cluster import configs, flags, netrules
from akri_trio_dev.cluster.layout import (
    EXTRA_NODE_TAINT,
    EXTRA_NODE_TOLERATION,
    MAX_NODES,
    Layout,
    NodeLayout,
)

LAY = Layout(home=Path("/h"))


def _opts(argv: list[str]) -> dict[str, str]:
    return dict(a.partition("=")[::2] for a in argv[1:])


def _settings(node: NodeLayout) -> configs.KubeletSettings:
    return configs.KubeletSettings(
        runtime_endpoint=f"unix://{node.containerd_socket}",
        client_ca=Path("/h/run/pki/ca.crt"),
        address=node.address,
        port=10250,
        healthz_port=10248,
        volume_plugin_dir=node.root_dir / "volumeplugins",
        healthz_address=node.address,
        pod_logs_dir=node.pod_logs_dir,
        register_with_taints=node.taints,
    )


def test_node_one_keeps_the_single_node_paths_names_and_network() -> None:
    first = LAY.node(1)
    assert first.name == "127.0.0.1" and first.address == "127.0.0.1"
    assert first.root_dir == Path("/var/lib/kubelet")
    assert first.containerd_socket == Path("/h/run/containerd/containerd.sock")
    assert first.cni_conf_dir == Path("/h/run/cni/net.d")
    assert first.cdi_dir == Path("/h/run/cdi")
    assert first.kubelet_config == Path("/h/run/kubelet-config.yaml")
    assert first.kubelet_kubeconfig == LAY.kubeconfig("kubelet")
    assert first.admin_kubeconfig == LAY.kubeconfig("admin")
    assert (first.kubelet_process, first.containerd_process) == ("kubelet", "containerd")
    assert (first.bridge, first.pod_cidr, first.cni_network) == (
        "cni0",
        "10.244.0.0/24",
        "akri-trio",
    )
    assert first.apiserver_url == LAY.apiserver_url and first.pod_logs_dir is None
    assert LAY.node(1, "akri-node").name == "akri-node"
    assert LAY.containerd_socket == first.containerd_socket


def test_extra_nodes_are_named_and_reached_by_their_own_loopback_address() -> None:
    node = LAY.node(3, "ignored")
    assert node.name == node.address == "127.0.0.3"
    assert node.apiserver_url == "https://127.0.0.3:16443"
    assert node.root_dir == Path("/var/lib/kubelet-127.0.0.3")
    assert node.device_plugin_dir == Path("/var/lib/kubelet-127.0.0.3/device-plugins")
    assert node.pod_resources_socket == Path(
        "/var/lib/kubelet-127.0.0.3/pod-resources/kubelet.sock"
    )
    assert node.state == LAY.nodes_dir / "127.0.0.3"
    assert node.kubelet_process == "kubelet-127.0.0.3"
    assert LAY.node_named("127.0.0.3") == node


@pytest.mark.parametrize("name", ["127.0.0.1", "127.0.0.10", "127.0.0.02", "node-b", "10.0.0.2"])
def test_node_named_refuses_what_is_not_an_extra_node(name: str) -> None:
    with pytest.raises(ValueError):
        LAY.node_named(name)


def test_no_two_nodes_share_a_path_a_process_a_bridge_or_a_subnet() -> None:
    nodes = [LAY.node(i) for i in range(1, MAX_NODES + 1)]

    def owned(n: NodeLayout) -> set[object]:
        logs = n.pod_logs_dir or Path("/var/log/pods")
        paths = {n.root_dir, n.containerd_dir, n.cni_dir, n.cdi_dir, n.kubelet_config, logs}
        paths |= {n.kubelet_kubeconfig, n.admin_kubeconfig}
        return {*paths, n.kubelet_process, n.containerd_process, n.bridge, n.pod_cidr}

    for a, b in itertools.combinations(nodes, 2):
        assert not owned(a) & owned(b), (a.name, b.name)
    # Unix socket paths stay well under the 108-byte limit for a plugin's own socket name.
    assert all(len(str(n.device_plugin_dir)) < 48 for n in nodes)


def test_node_index_is_bounded() -> None:
    for bad in (0, MAX_NODES + 1):
        with pytest.raises(ValueError):
            LAY.node(bad)


def test_extra_kubelet_runs_from_its_own_root_dir_config_and_name() -> None:
    node = LAY.node(2)
    argv = flags.kubelet_argv(LAY, node, None, runtime_pid=42)
    assert argv[:3] == ["nsenter", "--mount=/proc/42/ns/mnt", "--"]
    o = _opts(argv[3:])
    assert o["--root-dir"] == "/var/lib/kubelet-127.0.0.2"
    assert o["--hostname-override"] == "127.0.0.2"
    assert o["--config"] == str(node.kubelet_config)
    assert o["--kubeconfig"] == str(node.kubelet_kubeconfig)
    assert "--node-ip" not in o
    with pytest.raises(ValueError):
        flags.kubelet_argv(LAY, node, None)  # it must join its containerd's mounts


def test_extra_containerd_has_its_own_mounts_with_the_nodes_kubelet_dirs() -> None:
    """The kubelet's device-plugin path is fixed whatever its root dir, and a DaemonSet mounts
    the pod-resources socket's at a fixed path: each extra node's containerd (and the kubelet
    that joins it) sees the node's own directories there."""
    node = LAY.node(2)
    argv = flags.containerd(LAY, node)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "slave", "--"]
    at = argv.index(flags.DEVICE_PLUGIN_PATH)
    assert argv[at : at + 5] == [
        "/var/lib/kubelet/device-plugins",
        str(node.device_plugin_dir),
        "/var/lib/kubelet/pod-resources",
        "/var/lib/kubelet-127.0.0.2/pod-resources",
        "--",
    ]
    assert argv[at + 5 :] == [str(LAY.binary("containerd")), f"--config={node.containerd_config}"]
    first = LAY.node(1)
    assert [str(first.device_plugin_dir), str(first.pod_resources_socket.parent)] == [
        flags.DEVICE_PLUGIN_PATH,
        flags.POD_RESOURCES_PATH,
    ]
    # Node 1 runs in the host's mounts, exactly as the single-node cluster did.
    assert flags.containerd(LAY, LAY.node(1))[0] == str(LAY.binary("containerd"))
    assert flags.kubelet_argv(LAY, LAY.node(1), None)[0] == str(LAY.binary("kubelet"))


def test_the_mount_script_binds_the_nodes_dirs_then_runs_the_program() -> None:
    """Run the wrapper's shell script with `mount` replaced by echo: it binds each node dir on
    its fixed path and execs the rest."""

    argv = flags.own_mounts(LAY.node(3), ["echo", "ran", "--", "x"])
    script = argv[argv.index("-c") + 1].replace("mount --bind", "echo bind")
    out = subprocess.run(
        ["sh", "-c", script.replace("mkdir -p", "true"), *argv[argv.index("-c") + 2 :]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert out[:3] == [
        "bind /var/lib/kubelet-127.0.0.3/device-plugins /var/lib/kubelet/device-plugins",
        "bind /var/lib/kubelet-127.0.0.3/pod-resources /var/lib/kubelet/pod-resources",
        "ran -- x",
    ]


def test_extra_kubelet_config_binds_and_logs_on_its_own() -> None:
    node = LAY.node(2)
    doc = yaml.safe_load(configs.kubelet_config(_settings(node)))
    assert doc["address"] == doc["healthzBindAddress"] == "127.0.0.2"
    assert doc["podLogsDir"] == "/var/log/pods-127.0.0.2"
    assert doc["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    assert doc["registerWithTaints"] == [EXTRA_NODE_TAINT]
    first = yaml.safe_load(configs.kubelet_config(_settings(LAY.node(1))))
    assert "podLogsDir" not in first and first["healthzBindAddress"] == "127.0.0.1"
    assert "registerWithTaints" not in first  # node 1 takes every Pod, as it always did


def test_extra_nodes_keep_away_every_pod_that_does_not_tolerate_them() -> None:
    assert EXTRA_NODE_TAINT["effect"] == "NoExecute"  # also evicts DaemonSet Pods placed early
    assert EXTRA_NODE_TOLERATION["key"] == EXTRA_NODE_TAINT["key"]
    assert EXTRA_NODE_TOLERATION["operator"] == "Exists"


def test_node_heartbeat_fits_inside_the_controller_managers_grace() -> None:
    """The lease is renewed every quarter of its duration; several renewals must be missed
    before a node goes NotReady, and a lost one must show within seconds."""
    kcm = _opts(flags.kube_controller_manager(LAY))
    grace = int(kcm["--node-monitor-grace-period"].removesuffix("s"))
    renew = configs.NODE_LEASE_SECONDS / 4
    assert grace >= 4 * renew and grace <= 20
    assert int(kcm["--node-monitor-period"].removesuffix("s")) < grace


def test_each_node_has_its_own_cni_network_and_containerd_without_nri() -> None:
    node = LAY.node(3)
    doc = json.loads(
        configs.cni_conflist(bridge=node.bridge, subnet=node.pod_cidr, name=node.cni_network)
    )
    assert doc["name"] == "akri-trio-3"
    assert doc["plugins"][0]["bridge"] == "cni2"
    assert doc["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.244.2.0/24"}]]
    text = configs.containerd_config(
        root=node.containerd_root,
        state=node.containerd_state,
        socket=node.containerd_socket,
        cni_conf_dir=node.cni_conf_dir,
        cdi_dir=node.cdi_dir,
        sandbox_image="pause",
    )
    assert f'address = "{node.containerd_socket}"' in text
    assert "io.containerd.nri.v1.nri" in text  # one host-wide socket: off on every node


def test_kubeconfig_names_the_cert_to_check_when_dialling_a_node_address() -> None:
    text = configs.kubeconfig(
        server="https://127.0.0.2:16443",
        ca=Path("/p/ca.crt"),
        user="system:node:127.0.0.2",
        creds=configs.Credentials(token="t"),
        tls_server_name="localhost",
    )
    cluster = yaml.safe_load(text)["clusters"][0]["cluster"]
    assert cluster == {
        "server": "https://127.0.0.2:16443",
        "certificate-authority": "/p/ca.crt",
        "tls-server-name": "localhost",
    }


def test_node_env_pairs_describe_that_nodes_sockets() -> None:
    env = LAY.node(2).env_pairs()
    assert env["AKRI_TRIO_NODE_NAME"] == "127.0.0.2"
    assert env["AKRI_TRIO_DEVICE_PLUGIN_DIR"] == Path("/var/lib/kubelet-127.0.0.2/device-plugins")
    assert env["AKRI_TRIO_KUBELET_ROOT_DIR"] == Path("/var/lib/kubelet-127.0.0.2")
    assert env["AKRI_TRIO_CDI_DIR"] == LAY.nodes_dir / "127.0.0.2" / "cdi"
    assert env["AKRI_TRIO_NODE_KUBECONFIG"] == LAY.nodes_dir / "127.0.0.2" / "admin.kubeconfig"
    first = LAY.node(1).env_pairs()
    assert first["AKRI_TRIO_DEVICE_PLUGIN_DIR"] == Path("/var/lib/kubelet/device-plugins")
    assert first["AKRI_TRIO_NODE_KUBECONFIG"] == LAY.kubeconfig("admin")


def test_api_link_sends_the_node_address_to_the_real_api_server() -> None:
    rule = netrules.api_link("127.0.0.2", 16443)
    assert rule.append() == [
        "iptables", "-w", "-t", "nat", "-A", "AKRI-TRIO-NODES",
        "-d", "127.0.0.2/32", "-p", "tcp", "--dport", "16443",
        "-j", "DNAT", "--to-destination", "127.0.0.1:16443",
    ]  # fmt: skip
    assert rule.check()[4:6] == ["-C", "AKRI-TRIO-NODES"]


def test_partition_drops_before_nat_both_the_api_link_and_the_kubelet_port() -> None:
    rule = netrules.partition("127.0.0.3", 16443, 10250)
    assert rule.table == "raw"  # raw OUTPUT sees the node's address, before the DNAT
    spec = list(rule.spec)
    assert spec[spec.index("-d") + 1] == "127.0.0.3/32"
    assert spec[spec.index("--dports") + 1] == "16443,10250"
    assert spec[-2:] == ["-j", "DROP"]
    assert rule.delete()[4:6] == ["-D", "AKRI-TRIO-PARTITION"]


def test_our_chains_are_jumped_to_from_output_of_their_table() -> None:
    for chain in netrules.CHAINS:
        assert chain.jump.append() == [
            "iptables", "-w", "-t", chain.table, "-A", "OUTPUT", "-j", chain.name,
        ]  # fmt: skip
        assert chain.remove() == ["iptables", "-w", "-t", chain.table, "-X", chain.name]
