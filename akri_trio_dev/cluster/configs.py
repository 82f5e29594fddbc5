"""Text of the files the cluster's processes read: kubeconfigs, tokens.csv, containerd, CNI.

Pure renderers over plain values, so their content is unit-tested without starting anything.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from pathlib import Path

import attrs
import yaml

# Users authenticated by static token (--token-auth-file). The names of the controller-manager
# and scheduler match the bootstrap RBAC bindings, so they need no RBAC objects of ours.
# The controller-manager is also a master: it runs every controller with its own credentials
# (see flags.kube_controller_manager). `akri-restricted` is authenticated but bound to nothing:
# tests use it to see 403 Forbidden.
TOKEN_USERS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ("system:masters",)),
    "scheduler": ("system:kube-scheduler", ()),
    "restricted": ("akri-restricted", ()),
}


def new_tokens() -> dict[str, str]:
    return {who: secrets.token_hex(16) for who in TOKEN_USERS}


def tokens_csv(tokens: Mapping[str, str]) -> str:
    """--token-auth-file content: token,user,uid[,"group1,group2"]."""
    lines = []
    for who, (user, groups) in TOKEN_USERS.items():
        row = f"{tokens[who]},{user},{who}-uid"
        if groups:
            row += ',"' + ",".join(groups) + '"'
        lines.append(row)
    return "\n".join(lines) + "\n"


@attrs.frozen
class Credentials:
    """How a kubeconfig user authenticates: a bearer token, or a client cert and key."""

    token: str | None = None
    client_certificate: Path | None = None
    client_key: Path | None = None


def kubeconfig(
    *,
    server: str,
    ca: Path,
    user: str,
    creds: Credentials,
    cluster: str = "akri-trio",
    tls_server_name: str | None = None,
) -> str:
    """A one-context kubeconfig. `tls_server_name`: the name to check the serving cert for when
    `server` is an address the cert does not name (an extra node's own loopback address)."""
    user_entry: dict[str, str] = {}
    if creds.token is not None:
        user_entry["token"] = creds.token
    if creds.client_certificate is not None and creds.client_key is not None:
        user_entry["client-certificate"] = str(creds.client_certificate)
        user_entry["client-key"] = str(creds.client_key)
    if not user_entry:
        raise ValueError("a kubeconfig user needs a token or a client certificate and key")
    cluster_entry = {"server": server, "certificate-authority": str(ca)}
    if tls_server_name is not None:
        cluster_entry["tls-server-name"] = tls_server_name
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": cluster_entry}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [
            {
                "name": f"{user}@{cluster}",
                "context": {"cluster": cluster, "user": user, "namespace": "default"},
            }
        ],
        "current-context": f"{user}@{cluster}",
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def containerd_config(
    *, root: Path, state: Path, socket: Path, cni_conf_dir: Path, cdi_dir: Path, sandbox_image: str
) -> str:
    """containerd 2 config (version 3) confined to our state directory, CDI on.

    restrict_oom_score_adj is REQUIRED where the process lacks CAP_SYS_RESOURCE (this VM):
    without it every sandbox fails with "can't get final child's PID from pipe: EOF". NRI is
    off: its socket has one fixed host path, which a second node's containerd would take over.
    """
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 3
root = "{root}"
state = "{state}"
# Plugins that would probe for filesystems or devices we never use.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", \
"io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", \
"io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri"]

[grpc]
  address = "{socket}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox_image}"

[{runtime}]
  restrict_oom_score_adj = true
  enable_selinux = false
  enable_cdi = true
  cdi_spec_dirs = ["{cdi_dir}"]
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state next to ours, not in the shared /run/containerd/runc.
        Root = "{state}/runc"
  [{runtime}.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni_conf_dir}"
"""


@attrs.frozen
class KubeletSettings:
    runtime_endpoint: str
    client_ca: Path
    address: str
    port: int
    healthz_port: int
    volume_plugin_dir: Path
    healthz_address: str = "127.0.0.1"
    pod_logs_dir: Path | None = None  # None: the kubelet's default, /var/log/pods
    register_with_taints: tuple[Mapping[str, str], ...] = ()


# The node lease is the kubelet's heartbeat; it renews it every quarter of its duration. 12 s
# (renewed every 3 s) lets the controller-manager's 16 s grace (flags.NODE_MONITOR_GRACE) mark a
# lost node NotReady in seconds, where the defaults (40 s, 50 s) take most of a minute.
NODE_LEASE_SECONDS = 12


def kubelet_config(k: KubeletSettings) -> str:
    """KubeletConfiguration for a throwaway node on a VM we do not own.

    cgroup v1 hosts (these machines) need failCgroupV1: false from 1.35 on. No QoS cgroups,
    node-allocatable enforcement, eviction or image GC: a test node must not evict or delete
    what the tests made because the VM's disk looks full.
    """
    doc = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": k.runtime_endpoint,
        "runtimeRequestTimeout": "2m",
        "address": k.address,
        "port": k.port,
        "readOnlyPort": 0,
        "healthzBindAddress": k.healthz_address,
        "healthzPort": k.healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(k.client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # Keep its flexvolume dir inside the root dir so `down` removes it with the rest.
        "volumePluginDir": str(k.volume_plugin_dir),
        "failSwapOn": False,
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
    }
    if k.pod_logs_dir is not None:
        doc["podLogsDir"] = str(k.pod_logs_dir)
    if k.register_with_taints:
        doc["registerWithTaints"] = [dict(t) for t in k.register_with_taints]
    return yaml.safe_dump(doc, sort_keys=False)


def cni_conflist(*, bridge: str, subnet: str, name: str = "akri-trio") -> str:
    """bridge + loopback with host-local IPAM; no masquerade (pods only talk on this host).
    Each node has its own bridge, subnet and network `name` (host-local's leases are per name)."""
    doc = {
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }
    return json.dumps(doc, indent=2) + "\n"
