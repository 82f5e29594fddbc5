"""Where the local cluster keeps its files, and which ports it listens on.

One value object (`Layout`) names every path the cluster touches, so the process shell, the
config writers, `env` and `down` cannot disagree about where something lives. Nothing here does
I/O: `Layout.default()` only reads the environment and the home directory's name.

State lives under ``$AKRI_TRIO_HOME`` (default ``~/.cache/akri-trio``):

    build/<component>-<version>/bin/   binaries built by gobuild/build.sh (kept across `down`;
                       one directory per version: switching releases never rebuilds, and a
                       version change in gobuild/versions.env builds into a new directory)
    build/durations.json   how long each step of the last build took (for the next one's ETA)
    go/                the Go module and build caches of those builds
    run/pki/           CA, serving/client certs, service-account keys (kept across `down`)
    run/*.kubeconfig   admin, restricted, controller-manager, scheduler, kubelet (kept)
    run/pids/, run/logs/   one PID file and one log per process
    run/etcd/, run/containerd/, run/cni/, run/cdi/   runtime state (removed by `down`)

The first node's kubelet uses the standard --root-dir=/var/lib/kubelet, so its device-plugin
and pod-resources sockets are where every tool expects them. Nodes 2..N (`up --nodes N`) are
named by their own loopback address, 127.0.0.<n>, and keep their state apart (`NodeLayout`):

    run/nodes/<name>/  containerd/, cni/net.d/, cdi/, kubelet-config.yaml, kubelet.kubeconfig,
                       admin.kubeconfig (the API server through the node's own address)
    /var/lib/kubelet-<name>/   its kubelet root dir (device-plugins/, pod-resources/, plugins/)
    /var/log/pods-<name>/      its Pods' logs (a kubelet deletes log directories of Pods it
                       does not know, so two kubelets cannot share one)
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
# The supported Kubernetes releases, both built and tested: the newest (the default, which the
# whole suite runs on) and the oldest (`up --version 1.34`, `scripts/just test-compat`).
K8S_VERSION = VERSIONS["KUBERNETES"]
K8S_OLDEST = VERSIONS["KUBERNETES_OLDEST"]
K8S_RELEASES = (K8S_OLDEST, K8S_VERSION)
# Which release `up` starts when --version is not given (default: the newest).
VERSION_ENV = "AKRI_TRIO_K8S_VERSION"


def minor_of(version: str) -> int:
    """v1.34.4 (or 1.34) -> 34."""
    parts = version.removeprefix("v").split(".")
    if len(parts) < 2 or parts[0] != "1" or not parts[1].isdigit():
        raise ValueError(f"{version!r} is not a Kubernetes 1.x version")
    return int(parts[1])


def resolve_release(text: str) -> str:
    """The pinned release `text` names: its minor (1.34, v1.34), its exact version (v1.34.4),
    or `oldest` / `newest`. ValueError names the supported ones."""
    wanted = text.strip()
    named = {"oldest": K8S_OLDEST, "newest": K8S_VERSION}
    if wanted in named:
        return named[wanted]
    bare = wanted.removeprefix("v")
    for release in K8S_RELEASES:
        if bare in (release.removeprefix("v"), release.removeprefix("v").rsplit(".", 1)[0]):
            return release
    supported = ", ".join(f"{r.rsplit('.', 1)[0].removeprefix('v')} ({r})" for r in K8S_RELEASES)
    raise ValueError(f"Kubernetes {text!r} is not a supported release; supported: {supported}")


@attrs.frozen
class Component:
    """One wrapper module of gobuild/ and the binaries it builds."""

    name: str
    version: str
    binaries: tuple[str, ...]


KUBERNETES_BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
)


def components_for(k8s_version: str) -> tuple[Component, ...]:
    """What a cluster of Kubernetes `k8s_version` runs: that release, and the one etcd and
    containerd every supported release shares."""
    return (
        Component("kubernetes", k8s_version, KUBERNETES_BINARIES),
        Component("etcd", VERSIONS["ETCD"], ("etcd",)),
        Component(
            "containerd", VERSIONS["CONTAINERD"], ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
    )


COMPONENTS = components_for(K8S_VERSION)

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
# Nodes are numbered from 1; node n > 1 is 127.0.0.<n>, with bridge cni<n-1> and 10.244.<n-1>.0/24.
MAX_NODES = 9

# Paths the kubelet and the CNI plugins own; fixed by convention, not by our state dir.
KUBELET_ROOT = Path("/var/lib/kubelet")
HOST_DIRS_TO_REMOVE = (
    KUBELET_ROOT,
    Path("/var/lib/cni"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
)
NETNS_DIR = Path("/run/netns")
# Extra nodes register with this NoExecute taint: the single-node tests, the chart's DaemonSets
# and every Pod that does not tolerate it stay on node 1, as they expect; a test that means to
# spread over the nodes tolerates it (`EXTRA_NODE_TOLERATION`).
EXTRA_NODE_TAINT = {"key": "akri-trio.dev/extra-node", "effect": "NoExecute"}
EXTRA_NODE_TOLERATION = {"key": "akri-trio.dev/extra-node", "operator": "Exists"}
# Extra nodes' kubelet root dirs and Pod log dirs: /var/lib/kubelet-<name>, /var/log/pods-<name>.
EXTRA_ROOT_PREFIX = "/var/lib/kubelet-"
EXTRA_POD_LOGS_PREFIX = "/var/log/pods-"


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
    k8s_version: str = K8S_VERSION  # the release whose binaries this cluster runs

    @classmethod
    def default(cls, k8s_version: str | None = None) -> Layout:
        """The cluster home of $AKRI_TRIO_HOME, for release `k8s_version` (default: the one
        $AKRI_TRIO_K8S_VERSION names, else the newest)."""
        env = os.environ.get("AKRI_TRIO_HOME")
        home = Path(env) if env else Path.home() / ".cache" / "akri-trio"
        wanted = k8s_version or os.environ.get(VERSION_ENV) or K8S_VERSION
        return cls(home=home, k8s_version=resolve_release(wanted))

    # -- binaries ------------------------------------------------------------------------
    @property
    def components(self) -> tuple[Component, ...]:
        return components_for(self.k8s_version)

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
        for component in self.components:
            if name in component.binaries:
                return self.build_dir(component) / "bin" / name
        raise KeyError(f"no component builds {name}")

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
    def containerd_socket(self) -> Path:
        """The first node's containerd."""
        return self.node(1).containerd_socket

    @property
    def images_dir(self) -> Path:
        return self.run / "images"

    @property
    def nodes_dir(self) -> Path:
        """One directory per extra node (2..N), named for it."""
        return self.run / "nodes"

    def node(self, index: int, name: str = DEFAULT_NODE_NAME) -> NodeLayout:
        """Node `index` (1-based). Node 1 is the single-node cluster's node, named `name`, at
        the paths it always had; node n > 1 is named 127.0.0.<n> and `name` is ignored."""
        if not 1 <= index <= MAX_NODES:
            raise ValueError(f"node index {index} outside 1..{MAX_NODES}")
        if index == 1:
            return NodeLayout(
                index=1,
                name=name,
                address="127.0.0.1",
                state=self.run,
                root_dir=KUBELET_ROOT,
                pod_logs_dir=None,
                process_suffix="",
                apiserver_url=self.apiserver_url,
                admin_kubeconfig=self.kubeconfig("admin"),
            )
        address = f"127.0.0.{index}"
        state = self.nodes_dir / address
        return NodeLayout(
            index=index,
            name=address,
            address=address,
            state=state,
            root_dir=Path(EXTRA_ROOT_PREFIX + address),
            pod_logs_dir=Path(EXTRA_POD_LOGS_PREFIX + address),
            process_suffix=f"-{address}",
            apiserver_url=f"https://{address}:{self.ports.apiserver}",
            admin_kubeconfig=state / "admin.kubeconfig",
        )

    def node_named(self, name: str) -> NodeLayout:
        """The extra node called `name` (127.0.0.<n>, n > 1), or ValueError."""
        parts = name.split(".")
        if parts[:3] != ["127", "0", "0"] or len(parts) != 4 or not parts[3].isdigit():
            raise ValueError(f"{name!r} is not an extra node's name (127.0.0.2 .. 127.0.0.9)")
        index = int(parts[3])
        if not 2 <= index <= MAX_NODES or name != f"127.0.0.{index}":
            raise ValueError(f"{name!r} is not an extra node's name (127.0.0.2 .. 127.0.0.9)")
        return self.node(index)

    @property
    def node_name_file(self) -> Path:
        """Written by `up --node`: which node name the running kubelet registered."""
        return self.run / "node-name"

    @property
    def runtime_dirs(self) -> tuple[Path, ...]:
        """State `down` deletes (the PKI, kubeconfigs and binaries stay)."""
        certs = tuple(self.run / d for d in ("apiserver-certs", "kcm-certs", "scheduler-certs"))
        first = self.node(1)
        node = (first.containerd_dir, first.cni_dir, first.cdi_dir, self.images_dir)
        return (self.etcd_data, *node, *certs, self.nodes_dir)

    # -- endpoints -----------------------------------------------------------------------
    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.etcd_client}"


@attrs.frozen
class NodeLayout:
    """One node's files, processes and addresses.

    Extra nodes share the host's network namespace and are told apart by address: each
    kubelet serves on its own 127.0.0.<n> (so `kubectl logs` reaches it like node 1), and
    reaches the API server at https://127.0.0.<n>:<apiserver port>, which a NAT rule sends to
    the real one on 127.0.0.1 (netrules.py). Cutting that one address cuts the node, its Pods
    and an agent given its `admin_kubeconfig` off from the control plane, and nothing else.
    """

    index: int
    name: str
    address: str
    state: Path
    root_dir: Path
    pod_logs_dir: Path | None  # None: the kubelet's default, /var/log/pods
    process_suffix: str
    apiserver_url: str
    admin_kubeconfig: Path

    @property
    def is_first(self) -> bool:
        return self.index == 1

    @property
    def taints(self) -> tuple[dict[str, str], ...]:
        return () if self.is_first else (EXTRA_NODE_TAINT,)

    @property
    def containerd_process(self) -> str:
        return "containerd" + self.process_suffix

    @property
    def kubelet_process(self) -> str:
        return "kubelet" + self.process_suffix

    @property
    def containerd_dir(self) -> Path:
        return self.state / "containerd"

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
    def cni_dir(self) -> Path:
        return self.state / "cni"

    @property
    def cni_conf_dir(self) -> Path:
        return self.cni_dir / "net.d"

    @property
    def cdi_dir(self) -> Path:
        return self.state / "cdi"

    @property
    def kubelet_config(self) -> Path:
        return self.state / "kubelet-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.state / "kubelet.kubeconfig"

    @property
    def device_plugin_dir(self) -> Path:
        return self.root_dir / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def bridge(self) -> str:
        return f"cni{self.index - 1}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index - 1}.0/24"

    def env_pairs(self) -> dict[str, object]:
        """How to reach this node, under the names `cluster env` prints: for node 1 the keys
        tests and tools always read; `cluster env --node NAME` prints them for node NAME."""
        return {
            "AKRI_TRIO_NODE_NAME": self.name,
            "AKRI_TRIO_DEVICE_PLUGIN_DIR": self.device_plugin_dir,
            "AKRI_TRIO_POD_RESOURCES_SOCKET": self.pod_resources_socket,
            "AKRI_TRIO_CONTAINERD_SOCKET": self.containerd_socket,
            "AKRI_TRIO_KUBELET_ROOT_DIR": self.root_dir,
            "AKRI_TRIO_CDI_DIR": self.cdi_dir,
            "AKRI_TRIO_NODE_ADDRESS": self.address,
            # The API server through this node's link (cut by `node partition`).
            "AKRI_TRIO_NODE_KUBECONFIG": self.admin_kubeconfig,
        }

    @property
    def cni_network(self) -> str:
        """The CNI network's name; host-local keeps its leases per name, so one per node."""
        return "akri-trio" if self.is_first else f"akri-trio-{self.index}"
