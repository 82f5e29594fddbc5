"""Command lines of the cluster's processes, as pure functions of the `Layout`.

Everything on loopback, TLS with our CA, token auth, Node+RBAC authorization, ServiceAccount
admission on (the controller-manager creates the ServiceAccounts; the kubelet requests their
tokens), admission webhooks on (the default). The kubelet takes its settings from a
KubeletConfiguration file (configs.kubelet_config); only what has no field there is a flag.
"""

from __future__ import annotations

from akri_trio_dev.cluster.layout import SERVICE_CIDR, Layout, NodeLayout

SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# How often the node lifecycle controller looks at the nodes' heartbeats, and how long one may
# be missing before the node is NotReady: a stopped or cut-off node shows within ~20 s, so
# tests and demos of node loss take seconds (see configs.NODE_LEASE_SECONDS).
NODE_MONITOR_PERIOD = "2s"
NODE_MONITOR_GRACE = "16s"


def etcd(lay: Layout) -> list[str]:
    p = lay.ports
    client = f"http://127.0.0.1:{p.etcd_client}"
    peer = f"http://127.0.0.1:{p.etcd_peer}"
    return [
        str(lay.binary("etcd")),
        "--name=akri-trio",
        f"--data-dir={lay.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=akri-trio={peer}",
        # A throwaway test cluster: durability is not worth the fsync latency.
        "--unsafe-no-fsync",
        "--logger=zap",
        "--log-level=warn",
    ]


def kube_apiserver(lay: Layout) -> list[str]:
    pki = lay.pki
    return [
        str(lay.binary("kube-apiserver")),
        f"--etcd-servers={lay.etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # The `kubernetes` Service's endpoints may not be a loopback address; with no
        # kube-proxy nothing could route to them anyway.
        "--endpoint-reconciler-type=none",
        f"--secure-port={lay.ports.apiserver}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={lay.tokens_csv}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-account-issuer={SA_ISSUER}",
        f"--api-audiences={SA_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        # The node's InternalIP is the address the kubelet listens on; never resolve its name.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        "--enable-priority-and-fairness=false",
        "--allow-privileged=true",
        f"--cert-dir={lay.run / 'apiserver-certs'}",
        "--v=1",
    ]


def kube_controller_manager(lay: Layout) -> list[str]:
    pki = lay.pki
    return [
        str(lay.binary("kube-controller-manager")),
        f"--kubeconfig={lay.kubeconfig('controller-manager')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={lay.ports.controller_manager}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        # One ServiceAccount per controller costs ~250 ms each at start (the client builder
        # waits for every token): ~7 s before the ServiceAccount controller's caches even
        # start. A throwaway cluster runs them all as the (system:masters) kcm user instead.
        "--use-service-account-credentials=false",
        "--controllers=*",
        "--leader-elect=false",
        f"--node-monitor-period={NODE_MONITOR_PERIOD}",
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
        f"--cert-dir={lay.run / 'kcm-certs'}",
        # Its default, /usr/libexec/kubernetes/..., would be created on the host and left behind.
        f"--flex-volume-plugin-dir={lay.run / 'kcm-certs' / 'flexvolume'}",
        "--v=1",
    ]


def kube_scheduler(lay: Layout) -> list[str]:
    return [
        str(lay.binary("kube-scheduler")),
        f"--kubeconfig={lay.kubeconfig('scheduler')}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={lay.ports.scheduler}",
        f"--cert-dir={lay.run / 'scheduler-certs'}",
        "--v=1",
    ]


def containerd(lay: Layout, node: NodeLayout) -> list[str]:
    """containerd; an extra node's in a mount namespace of its own (`own_mounts`)."""
    argv = [str(lay.binary("containerd")), f"--config={node.containerd_config}"]
    return argv if node.is_first else own_mounts(node, argv)


# The kubelet's device-plugin directory is a constant of the device-plugin API, whatever its
# --root-dir: two kubelets on one host would take each other's registration socket.
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"
# Where a Pod finds the kubelet's pod-resources socket: the agent's DaemonSet mounts this fixed
# host path on every node, as on any real cluster, and reads which slots its node's Pods hold.
POD_RESOURCES_PATH = "/var/lib/kubelet/pod-resources"


def node_binds(node: NodeLayout) -> list[tuple[str, str]]:
    """(fixed path, the node's own directory) pairs an extra node's mounts bind: what the
    kubelet and a hostPath volume on the node see at the standard kubelet paths."""
    return [
        (DEVICE_PLUGIN_PATH, str(node.device_plugin_dir)),
        (POD_RESOURCES_PATH, str(node.pod_resources_socket.parent)),
    ]


def own_mounts(node: NodeLayout, argv: list[str]) -> list[str]:
    """`argv` in a new mount namespace (receiving the host's mounts, never sending its own)
    where the fixed kubelet paths (`node_binds`) are the node's own directories. The node's
    kubelet joins it (`join_mounts`), so its containerd sees the volume mounts the kubelet
    makes, the kubelet dials the plugins registered in the node's directory, and a Pod on the
    node (the agent's DaemonSet) mounting those paths reaches this node's kubelet, not node 1's."""
    script = (
        'while [ "$1" != -- ]; do mkdir -p "$1" "$2" && mount --bind "$2" "$1" || exit 1; '
        'shift 2; done; shift; exec "$@"'
    )
    pairs = [path for pair in node_binds(node) for path in pair]
    unshare = ["unshare", "--mount", "--propagation", "slave", "--"]
    return [*unshare, "sh", "-c", script, "sh", *pairs, "--", *argv]


def join_mounts(anchor_pid: int, argv: list[str]) -> list[str]:
    """`argv` in the mount namespace of process `anchor_pid` (the node's containerd)."""
    return ["nsenter", f"--mount=/proc/{anchor_pid}/ns/mnt", "--", *argv]


def kubelet(lay: Layout, node: NodeLayout) -> list[str]:
    """kubelet flags; the rest is in its configuration file.

    A node named by an IP (the default, 127.0.0.1) uses --hostname-override=<ip>: the kubelet
    then reports InternalIP=<ip> without the "nodeIP can't be loopback" check that --node-ip
    applies, so `kubectl logs` reaches it on loopback. Other names need a non-loopback
    InternalIP: see `kubelet_node_ip` in the shell (`runner`).
    """
    return [
        str(lay.binary("kubelet")),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.kubelet_kubeconfig}",
        f"--root-dir={node.root_dir}",
        f"--hostname-override={node.name}",
        "--v=1",
    ]


def _is_ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and 0 <= int(p) <= 255 for p in parts)


def is_ip_node_name(node_name: str) -> bool:
    return _is_ipv4(node_name)


def with_node_ip(argv: list[str], node_ip: str) -> list[str]:
    """Named (non-IP) nodes: pin InternalIP and the listen address to a non-loopback IP."""
    return [*argv, f"--node-ip={node_ip}"]


def kubelet_address(node_name: str, node_ip: str | None) -> str:
    """The address the kubelet serves on: the node's InternalIP, which the apiserver dials."""
    if is_ip_node_name(node_name):
        return node_name
    if node_ip is None:
        raise ValueError(f"node {node_name!r} is not an IP: it needs a non-loopback node IP")
    return node_ip


def kubelet_argv(
    lay: Layout, node: NodeLayout, node_ip: str | None, runtime_pid: int | None = None
) -> list[str]:
    """The node's kubelet; an extra node's joins its containerd's (`runtime_pid`) mounts."""
    argv = kubelet(lay, node)
    if not is_ip_node_name(node.name):
        argv = with_node_ip(argv, kubelet_address(node.name, node_ip))
    if node.is_first:
        return argv
    if runtime_pid is None:
        raise ValueError(f"node {node.name}'s kubelet joins its containerd's mount namespace")
    return join_mounts(runtime_pid, argv)


def control_plane_argv(lay: Layout, name: str) -> list[str]:
    table = {
        "etcd": etcd,
        "kube-apiserver": kube_apiserver,
        "kube-controller-manager": kube_controller_manager,
        "kube-scheduler": kube_scheduler,
    }
    return table[name](lay)
