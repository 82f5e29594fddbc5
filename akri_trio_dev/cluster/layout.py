"""Where the local cluster keeps its files, and which ports it listens on.

One value object (`Layout`) names every path the cluster touches, so the process shell, the
config writers, `env` and `down` cannot disagree about where something lives. Nothing here does
I/O: `Layout.default()` only reads the environment and the home directory's name.

State lives under ``$AKRI_TRIO_HOME`` (default ``~/.cache/akri-trio``):

    build/<component>-<version>/bin/   binaries built by gobuild/build.sh (kept across `down`;
                       a version change in gobuild/versions.env builds into a new directory)
    build/durations.json   how long each step of the last build took (for the next one's ETA)
    go/                the Go module and build caches of those builds
    run/pki/           CA, serving/client certs, service-account keys (kept across `down`)
    run/*.kubeconfig   admin, restricted, controller-manager, scheduler, kubelet (kept)
    run/pids/, run/logs/   one PID file and one log per process
    run/etcd/, run/containerd/, run/cni/, run/cdi/   runtime state (removed by `down`)

The kubelet uses the standard --root-dir=/var/lib/kubelet, so device-plugin and pod-resources
sockets are where every tool expects them.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

VERSIONS_FILE = Path(__file__).with_name("gobuild") / "versions.env"


def parse_versions(text: str) -> dict[str, str]:
    """KEY=value lines of versions.env (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs if not k.lstrip().startswith("#")}


VERSIONS = parse_versions(VERSIONS_FILE.read_text())
K8S_VERSION = VERSIONS["KUBERNETES"]


@attrs.frozen
class Component:
    """One wrapper module of gobuild/ and the binaries it builds."""

    name: str
    version: str
    binaries: tuple[str, ...]


COMPONENTS = (
    Component(
        "kubernetes",
        K8S_VERSION,
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"),
    ),
    Component("etcd", VERSIONS["ETCD"], ("etcd",)),
    Component(
        "containerd", VERSIONS["CONTAINERD"], ("containerd", "containerd-shim-runc-v2", "ctr")
    ),
)
_PROVIDER = {b: c for c in COMPONENTS for b in c.binaries}

# Control-plane processes in start order; `down` stops them in reverse.
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE_PROCESSES = ("containerd", "kubelet")

DEFAULT_NODE_NAME = "127.0.0.1"
# The sandbox image kubeadm pairs with this release; built locally (oci.py), never pulled.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
BUSYBOX_IMAGE = "docker.io/library/busybox:latest"
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/24"
CNI_BRIDGE = "cni0"

# Paths the kubelet and the CNI plugins own; fixed by convention, not by our state dir.
KUBELET_ROOT = Path("/var/lib/kubelet")
HOST_DIRS_TO_REMOVE = (
    KUBELET_ROOT,
    Path("/var/lib/cni"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
)
NETNS_DIR = Path("/run/netns")


@attrs.frozen
class Ports:
    """Loopback ports; fixed so that kubeconfigs stay valid across `down` / `up`."""

    etcd_client: int = 12379
    etcd_peer: int = 12380
    apiserver: int = 16443
    controller_manager: int = 10257
    scheduler: int = 10259
    kubelet: int = 10250
    kubelet_healthz: int = 10248

    def for_process(self, name: str) -> dict[str, int]:
        """The ports `name` binds, labelled for error messages."""
        table: dict[str, dict[str, int]] = {
            "etcd": {"etcd client": self.etcd_client, "etcd peer": self.etcd_peer},
            "kube-apiserver": {"kube-apiserver": self.apiserver},
            "kube-controller-manager": {"kube-controller-manager": self.controller_manager},
            "kube-scheduler": {"kube-scheduler": self.scheduler},
            "kubelet": {"kubelet": self.kubelet, "kubelet healthz": self.kubelet_healthz},
        }
        return table.get(name, {})


@attrs.frozen
class Layout:
    home: Path
    ports: Ports = Ports()

    @classmethod
    def default(cls) -> Layout:
        env = os.environ.get("AKRI_TRIO_HOME")
        home = Path(env) if env else Path.home() / ".cache" / "akri-trio"
        return cls(home=home)

    # -- binaries ------------------------------------------------------------------------
    def build_dir(self, component: Component) -> Path:
        return self.home / "build" / f"{component.name}-{component.version}"

    @property
    def go_cache(self) -> Path:
        return self.home / "go"

    def build_log(self, component: Component) -> Path:
        return self.build_dir(component) / "build.log"

    @property
    def build_durations(self) -> Path:
        """Each component's step durations in its last finished build (progress.py)."""
        return self.home / "build" / "durations.json"

    def binary(self, name: str) -> Path:
        return self.build_dir(_PROVIDER[name]) / "bin" / name

    @property
    def kubectl(self) -> Path:
        return self.binary("kubectl")

    # -- state ---------------------------------------------------------------------------
    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def pki(self) -> Path:
        return self.run / "pki"

    @property
    def pids(self) -> Path:
        return self.run / "pids"

    @property
    def logs(self) -> Path:
        return self.run / "logs"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def kubeconfig(self, who: str) -> Path:
        return self.run / f"{who}.kubeconfig"

    @property
    def tokens_json(self) -> Path:
        return self.pki / "tokens.json"

    @property
    def tokens_csv(self) -> Path:
        return self.pki / "tokens.csv"

    @property
    def etcd_data(self) -> Path:
        return self.run / "etcd"

    @property
    def containerd_dir(self) -> Path:
        return self.run / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def containerd_root(self) -> Path:
        return self.containerd_dir / "root"

    @property
    def containerd_state(self) -> Path:
        return self.containerd_dir / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.run / "cni" / "net.d"

    @property
    def cdi_dir(self) -> Path:
        """Where containerd reads CDI specs (and where tests and a DRA driver write them)."""
        return self.run / "cdi"

    @property
    def kubelet_config(self) -> Path:
        return self.run / "kubelet-config.yaml"

    @property
    def images_dir(self) -> Path:
        return self.run / "images"

    @property
    def node_name_file(self) -> Path:
        """Written by `up --node`: which node name the running kubelet registered."""
        return self.run / "node-name"

    @property
    def runtime_dirs(self) -> tuple[Path, ...]:
        """State `down` deletes (the PKI, kubeconfigs and binaries stay)."""
        certs = tuple(self.run / d for d in ("apiserver-certs", "kcm-certs", "scheduler-certs"))
        node = (self.containerd_dir, self.run / "cni", self.cdi_dir, self.images_dir)
        return (self.etcd_data, *node, *certs)

    # -- endpoints -----------------------------------------------------------------------
    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.etcd_client}"

    @property
    def device_plugin_dir(self) -> Path:
        return KUBELET_ROOT / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return KUBELET_ROOT / "pod-resources" / "kubelet.sock"
