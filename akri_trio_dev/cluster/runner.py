"""The I/O shell of `python -m akri_trio_dev cluster`: build, install, write files, start, wait,
stop, clean.

Synchronous on purpose: `up` is a short-lived script that starts detached daemons and polls a
few health endpoints with deadlines of its own; there is no concurrency to structure. All the
decisions (flags, file contents, images, PKI, cleanup order) live in the pure modules beside it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import queue
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import httpx

from akri_trio_dev.cluster import (
    cleanup,
    configs,
    flags,
    iptables,
    netrules,
    oci,
    pki,
    procs,
    progress,
)
from akri_trio_dev.cluster.exports import export_lines
from akri_trio_dev.cluster.layout import (
    BUSYBOX_IMAGE,
    CNI_BRIDGE,
    CONTROL_PLANE,
    HOST_DIRS_TO_REMOVE,
    KUBELET_ROOT,
    NETNS_DIR,
    NODE_PROCESSES,
    PAUSE_IMAGE,
    Layout,
    NodeLayout,
)

# etcd and containerd are built from Go modules with Kubernetes (gobuild/); runc and the CNI
# plugins come from Debian.
NODE_PACKAGES = (
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "iproute2",
    "iptables",
    "mount",
)
BUILD_SCRIPT = Path(__file__).with_name("gobuild") / "build.sh"


def build_script() -> Path:
    """gobuild/build.sh, unless AKRI_TRIO_BUILD_SCRIPT names another (e.g. one that fetches
    prebuilt binaries from a CI cache; tests use it to exercise a failing build)."""
    return Path(os.environ.get("AKRI_TRIO_BUILD_SCRIPT") or BUILD_SCRIPT)


class ClusterError(Exception):
    """A failure `up`/`down` explains to the user in one message (no traceback)."""


def say(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


def _wait(what: str, check: Callable[[], bool], timeout: float, log: Path | None = None) -> float:
    """Poll `check` until true; returns the seconds it took or raises ClusterError."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            pass
        if time.monotonic() - start > timeout:
            hint = f"; last lines of {log}:\n{_tail(log, 25)}" if log else ""
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{hint}")
        time.sleep(0.2)


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# -- prerequisites -------------------------------------------------------------------------
def missing_packages(dpkg_query_out: str, wanted: Sequence[str]) -> list[str]:
    """Packages in `wanted` that `dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n'`
    does not report as installed ("ii")."""
    installed = set()
    for line in dpkg_query_out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] == "ii":
            installed.add(parts[0].split(":")[0])
    return [p for p in wanted if p not in installed]


def ensure_packages(wanted: Sequence[str]) -> None:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", *wanted],
        capture_output=True,
        text=True,
    ).stdout
    missing = missing_packages(out, wanted)
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(f"missing Debian packages {' '.join(missing)}; install them as root")
    say(f"apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        output = proc.stdout[-2000:] + proc.stderr[-2000:]
        raise ClusterError(f"apt-get install {' '.join(missing)} failed:\n{output}")


# While a step compiles in silence, a progress line this often.
PROGRESS_EVERY_S = 60.0


def ensure_binaries(
    lay: Layout,
    *,
    clock: Callable[[], float] = time.monotonic,
    progress_every: float = PROGRESS_EVERY_S,
) -> None:
    """Build every component whose binaries are missing, one after the other (2 cores),
    showing each step, the time elapsed and an estimate of the rest from the last build."""
    todo = [c for c in lay.components if not all(lay.binary(b).is_file() for b in c.binaries)]
    durations = progress.load_durations(_read_text(lay.build_durations))
    for n, comp in enumerate(todo, 1):
        build_dir, log_path = lay.build_dir(comp), lay.build_log(comp)
        say(
            f"building {n}/{len(todo)}: {comp.name} {comp.version} into {build_dir} "
            f"(minutes on a new machine; log {log_path})"
        )
        build_dir.mkdir(parents=True, exist_ok=True)
        meter = progress.BuildMeter(
            comp.name,
            started=clock(),
            last=durations.get(comp.name),
            after=progress.total_of(durations, [c.name for c in todo[n:]]),
        )
        with log_path.open("a") as log:
            proc = subprocess.Popen(
                [
                    "bash",
                    str(build_script()),
                    comp.name,
                    str(build_dir),
                    str(lay.go_cache),
                    comp.version,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert proc.stdout is not None
            for line in _lines_or_silence(proc.stdout, progress_every):
                if line is None:  # nothing for `progress_every` seconds
                    say(meter.report(clock()))
                    continue
                log.write(line)
                log.flush()
                print(f"  {line.rstrip()}", flush=True)
                if (report := meter.feed(line, clock())) is not None:
                    say(report)
            rc = proc.wait()
        if rc != 0:
            raise ClusterError(
                f"building {comp.name} failed (exit {rc}); last lines of {log_path}:\n"
                f"{_tail(log_path, 30)}"
            )
        now = clock()
        steps = meter.finish(now)
        if steps is not None:
            durations = {**durations, comp.name: steps}
            _write(lay.build_durations, progress.dump_durations(durations))
        say(f"built {comp.name} {comp.version} in {progress.format_seconds(now - meter.started)}")


def _lines_or_silence(stream: IO[str], every: float) -> Iterator[str | None]:
    """The stream's lines, with a None after each `every` seconds without one. A thread reads
    (a pipe has no timeout); it ends with the stream."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="build-output", daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=every)
        except queue.Empty:
            yield None
            continue
        if line is None:
            return
        yield line


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# -- files ---------------------------------------------------------------------------------
def _write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write only when the content changes, atomically, so running readers never see half a file."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        if path.read_bytes() == raw:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(raw)
    tmp.chmod(mode)
    tmp.replace(path)


def ensure_pki(lay: Layout) -> None:
    if (lay.pki / "ca.crt").is_file() and (lay.pki / "sa.pub").is_file():
        return
    say(f"creating CA and certificates in {lay.pki}")
    now = dt.datetime.now(dt.UTC)
    for name, data in pki.control_plane_pki(now).items():
        _write(lay.pki / name, data, 0o600 if name.endswith(".key") else 0o644)


def _read_tokens(lay: Layout) -> dict[str, str] | None:
    try:
        tokens: dict[str, str] = json.loads(lay.tokens_json.read_text())
    except (OSError, ValueError):
        return None
    return tokens if set(tokens) >= set(configs.TOKEN_USERS) else None


def _tokens(lay: Layout) -> dict[str, str]:
    """The static tokens, created once: kubeconfigs stay valid across `down` and `up`."""
    tokens = _read_tokens(lay)
    if tokens is not None:
        return tokens
    tokens = configs.new_tokens()
    _write(lay.tokens_json, json.dumps(tokens, indent=2), 0o600)
    return tokens


def write_control_plane_files(lay: Layout) -> None:
    tokens = _tokens(lay)
    _write(lay.tokens_csv, configs.tokens_csv(tokens), 0o600)
    ca = lay.pki / "ca.crt"
    for who in configs.TOKEN_USERS:
        user = configs.TOKEN_USERS[who][0]
        text = configs.kubeconfig(
            server=lay.apiserver_url, ca=ca, user=user, creds=configs.Credentials(token=tokens[who])
        )
        _write(lay.kubeconfig(who), text, 0o600)


def write_node_files(lay: Layout, node: NodeLayout, node_ip: str | None) -> None:
    crt, key = lay.pki / f"kubelet-{node.name}.crt", lay.pki / f"kubelet-{node.name}.key"
    if not (crt.is_file() and key.is_file()):
        ca = pki.KeyCert((lay.pki / "ca.key").read_bytes(), (lay.pki / "ca.crt").read_bytes())
        kc = pki.node_client(ca, dt.datetime.now(dt.UTC), node.name)
        _write(key, kc.key_pem, 0o600)
        _write(crt, kc.cert_pem)
    # An extra node dials its own address, which the serving cert does not name.
    server_name = None if node.is_first else pki.APISERVER_DNS[0]
    creds = configs.Credentials(client_certificate=crt, client_key=key)
    text = configs.kubeconfig(
        server=node.apiserver_url,
        ca=lay.pki / "ca.crt",
        user=f"system:node:{node.name}",
        creds=creds,
        tls_server_name=server_name,
    )
    _write(node.kubelet_kubeconfig, text, 0o600)
    if not node.is_first:
        admin = configs.Credentials(token=_tokens(lay)["admin"])
        text = configs.kubeconfig(
            server=node.apiserver_url,
            ca=lay.pki / "ca.crt",
            user=configs.TOKEN_USERS["admin"][0],
            creds=admin,
            tls_server_name=server_name,
        )
        _write(node.admin_kubeconfig, text, 0o600)
    _write(
        node.containerd_config,
        configs.containerd_config(
            root=node.containerd_root,
            state=node.containerd_state,
            socket=node.containerd_socket,
            cni_conf_dir=node.cni_conf_dir,
            cdi_dir=node.cdi_dir,
            sandbox_image=PAUSE_IMAGE,
        ),
    )
    settings = configs.KubeletSettings(
        runtime_endpoint=f"unix://{node.containerd_socket}",
        client_ca=lay.pki / "ca.crt",
        address=flags.kubelet_address(node.name, node_ip),
        port=lay.ports.kubelet,
        healthz_port=lay.ports.kubelet_healthz,
        volume_plugin_dir=node.root_dir / "volumeplugins",
        healthz_address=node.address,
        pod_logs_dir=node.pod_logs_dir,
        register_with_taints=node.taints,
    )
    _write(node.kubelet_config, configs.kubelet_config(settings))
    node.cdi_dir.mkdir(parents=True, exist_ok=True)
    _write(
        node.cni_conf_dir / "10-akri-trio.conflist",
        configs.cni_conflist(bridge=node.bridge, subnet=node.pod_cidr, name=node.cni_network),
    )


# -- API access ----------------------------------------------------------------------------
def _client(lay: Layout, who: str = "admin") -> httpx.Client:
    tokens = _read_tokens(lay)
    if tokens is None:
        raise ClusterError(
            f"no tokens in {lay.tokens_json}: run `python -m akri_trio_dev cluster up`"
        )
    token = tokens[who]
    ctx = ssl.create_default_context(cafile=str(lay.pki / "ca.crt"))
    return httpx.Client(
        base_url=lay.apiserver_url,
        verify=ctx,
        headers={"Authorization": f"Bearer {token}"},
        timeout=5.0,
    )


def apiserver_ready(lay: Layout) -> bool:
    try:
        with _client(lay) as c:
            return c.get("/readyz").text == "ok"
    except (httpx.HTTPError, OSError, KeyError, ValueError, ClusterError):
        return False


def _pods_can_start(c: httpx.Client) -> bool:
    """A Pod's ServiceAccount token volume needs the default ServiceAccount and the
    kube-root-ca.crt ConfigMap, both made by the controller-manager shortly after start."""
    ns = "/api/v1/namespaces/default"
    return all(
        c.get(f"{ns}/{path}").status_code == 200
        for path in ("serviceaccounts/default", "configmaps/kube-root-ca.crt")
    )


def _node_ready(c: httpx.Client, node: str, since: dt.datetime | None = None) -> bool:
    """The node's Ready condition is True (and, with `since`, was posted at or after it: a
    node started again must not pass on the status its previous kubelet left)."""
    r = c.get(f"/api/v1/nodes/{node}")
    if r.status_code != 200:
        return False
    conds = (r.json().get("status") or {}).get("conditions") or []
    ready = [x for x in conds if x["type"] == "Ready" and x["status"] == "True"]
    if not ready or since is None:
        return bool(ready)
    beat = dt.datetime.fromisoformat(ready[0]["lastHeartbeatTime"].replace("Z", "+00:00"))
    return beat >= since.replace(microsecond=0)


def _https_ok(port: int) -> bool:
    """kcm and scheduler serve /healthz with self-signed certs and no auth."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with httpx.Client(verify=ctx, timeout=2.0) as c:
        return c.get(f"https://127.0.0.1:{port}/healthz").text == "ok"


# -- processes -----------------------------------------------------------------------------
def _start(
    lay: Layout,
    name: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    *,
    kind: str | None = None,
    host: str = "127.0.0.1",
) -> bool:
    """Start `name` unless it runs; True when started now. Names the port when one is taken:
    the ports of `kind` (default: `name`, e.g. "kubelet") on `host`."""
    rec = procs.running(lay.pid_file(name))
    if rec is not None:
        say(f"{name} already running (pid {rec.pid})")
        return False
    orphan = procs.find_exact(argv)
    if orphan is not None:
        lay.pid_file(name).write_text(orphan.render())
        say(f"{name} already running (pid {orphan.pid}, adopted: its PID file was missing)")
        return False
    conflicts = procs.port_conflicts(lay.ports.for_process(kind or name), host)
    if conflicts:
        raise ClusterError(f"cannot start {name}: " + "; ".join(conflicts))
    rec = procs.spawn(argv, pid_file=lay.pid_file(name), log_file=lay.log_file(name), env=env)
    say(f"started {name} (pid {rec.pid}, log {lay.log_file(name)})")
    return True


def _check_alive(lay: Layout, name: str) -> bool:
    if procs.running(lay.pid_file(name)) is None:
        raise ClusterError(
            f"{name} exited; last lines of {lay.log_file(name)}:\n{_tail(lay.log_file(name), 25)}"
        )
    return True


def running_version(lay: Layout) -> str | None:
    """The Kubernetes release of the running control plane (its kube-apiserver's binary lives
    in build/kubernetes-<version>/), or None when none runs here."""
    rec = procs.running(lay.pid_file("kube-apiserver"))
    if rec is None:
        return None
    try:
        exe = os.readlink(f"/proc/{rec.pid}/exe")
    except OSError:
        return None
    return release_of_binary(Path(exe))


def release_of_binary(path: Path) -> str | None:
    """v1.34.4 for .../build/kubernetes-v1.34.4/bin/kube-apiserver; None for another path."""
    build_dir = path.parent.parent.name
    prefix = "kubernetes-"
    return build_dir.removeprefix(prefix) if build_dir.startswith(prefix) else None


def check_release(lay: Layout) -> None:
    """`up` of one release on a cluster home where another one runs is refused: its etcd data,
    nodes and Pods belong to the running one, and other sessions may be using it."""
    running = running_version(lay)
    if running is not None and running != lay.k8s_version:
        raise ClusterError(
            f"the cluster here runs Kubernetes {running}, not {lay.k8s_version}: "
            "`python -m akri_trio_dev cluster down` first (or ask for --version "
            f"{running.removeprefix('v').rsplit('.', 1)[0]})"
        )


def up_control_plane(lay: Layout) -> None:
    t0 = time.monotonic()
    check_release(lay)
    ensure_binaries(lay)
    ensure_pki(lay)
    write_control_plane_files(lay)
    for d in (lay.pids, lay.logs, lay.etcd_data):
        d.mkdir(parents=True, exist_ok=True)
    lay.etcd_data.chmod(0o700)

    started_any = False
    if _start(lay, "etcd", flags.etcd(lay)):
        started_any = True
        _wait(
            "etcd /health",
            lambda: _check_alive(lay, "etcd") and _etcd_healthy(lay),
            15,
            lay.log_file("etcd"),
        )
    for name in CONTROL_PLANE[1:]:
        started_any |= _start(lay, name, flags.control_plane_argv(lay, name))
    took = _wait(
        "kube-apiserver /readyz",
        lambda: _check_alive(lay, "kube-apiserver") and apiserver_ready(lay),
        60,
        lay.log_file("kube-apiserver"),
    )
    if started_any:
        say(f"kube-apiserver ready ({took:.1f} s)")
    _wait(
        "kube-controller-manager /healthz",
        lambda: (
            _check_alive(lay, "kube-controller-manager") and _https_ok(lay.ports.controller_manager)
        ),
        30,
        lay.log_file("kube-controller-manager"),
    )
    _wait(
        "kube-scheduler /healthz",
        lambda: _check_alive(lay, "kube-scheduler") and _https_ok(lay.ports.scheduler),
        30,
        lay.log_file("kube-scheduler"),
    )
    with _client(lay) as c:
        _wait(
            "the default ServiceAccount and kube-root-ca.crt in namespace default",
            lambda: _pods_can_start(c),
            60,
            lay.log_file("kube-controller-manager"),
        )
    say(
        f"control plane (Kubernetes {lay.k8s_version}) ready at {lay.apiserver_url} "
        f"({time.monotonic() - t0:.1f} s)"
    )


def _etcd_healthy(lay: Layout) -> bool:
    with httpx.Client(timeout=2.0) as c:
        return bool(c.get(f"{lay.etcd_url}/health").json().get("health") == "true")


def default_route_ip() -> str | None:
    """The source address of the default route (no packet is sent by a UDP connect)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("198.51.100.1", 9))  # TEST-NET-2: any address via the default route
        ip: str = s.getsockname()[0]
        return None if ip.startswith("127.") or ip == "0.0.0.0" else ip
    except OSError:
        return None
    finally:
        s.close()


def _ctr(
    lay: Layout, node: NodeLayout, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(lay.binary("ctr")), "--address", str(node.containerd_socket), "-n", "k8s.io", *args],
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        raise ClusterError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _busybox_applets() -> list[str]:
    out = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def _image_tar(lay: Layout, ref: str) -> Path:
    return lay.images_dir / (ref.replace("/", "_").replace(":", "_") + ".tar")


def ensure_images(lay: Layout, node: NodeLayout) -> None:
    """The pause and busybox images in the node's containerd, made once (oci.py) and imported
    into each node's."""
    have = set(_ctr(lay, node, "images", "ls", "-q").stdout.split())
    wanted = (PAUSE_IMAGE, BUSYBOX_IMAGE)
    if set(wanted) <= have:
        return
    if not all(_image_tar(lay, ref).is_file() for ref in wanted):
        images = oci.pause_and_busybox(
            Path("/bin/busybox").read_bytes(),
            _busybox_applets(),
            pause_ref=PAUSE_IMAGE,
            busybox_ref=BUSYBOX_IMAGE,
        )
        for ref, data in images.items():
            _write(_image_tar(lay, ref), data)
    for ref in wanted:
        if ref in have:
            continue
        # One tar per call: ctr silently ignores a second file argument.
        _ctr(lay, node, "images", "import", str(_image_tar(lay, ref)))
        say(f"imported image {ref} into {node.name}'s containerd")


def running_node(lay: Layout) -> str | None:
    if procs.running(lay.pid_file("kubelet")) is None:
        return None
    try:
        return lay.node_name_file.read_text().strip() or None
    except OSError:
        return None


def extra_nodes(lay: Layout) -> list[NodeLayout]:
    """The extra nodes `up --nodes` made (their state directories), running or stopped."""
    if not lay.nodes_dir.is_dir():
        return []
    found = []
    for d in lay.nodes_dir.iterdir():
        try:
            found.append(lay.node_named(d.name))
        except ValueError:
            continue
    return sorted(found, key=lambda n: n.index)


def _start_runtime(lay: Layout, node: NodeLayout) -> None:
    # containerd starts its runc shim by name: ours, built beside it.
    shim_path = f"{lay.binary('containerd-shim-runc-v2').parent}:{os.environ.get('PATH', '')}"
    name = node.containerd_process
    node.device_plugin_dir.mkdir(parents=True, exist_ok=True)
    if _start(lay, name, flags.containerd(lay, node), env={**os.environ, "PATH": shim_path}):
        _wait(
            f"{name} socket",
            lambda: (
                _check_alive(lay, name) and _ctr(lay, node, "version", check=False).returncode == 0
            ),
            20,
            lay.log_file(name),
        )
    elif not node.is_first:
        _ensure_binds(lay, node)
    ensure_images(lay, node)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _ensure_binds(lay: Layout, node: NodeLayout) -> None:
    """An extra node's running containerd, started by an older tree, may lack a bind that
    `flags.node_binds` names now: add it in its mount namespace, which its kubelet shares.
    (/proc/<pid>/root resolves a path as that process sees it.)"""
    rec = procs.running(lay.pid_file(node.containerd_process))
    if rec is None:
        return
    root = Path(f"/proc/{rec.pid}/root")
    for target, source in flags.node_binds(node):
        if _same_dir(root / target.lstrip("/"), Path(source)):
            continue
        script = 'mkdir -p "$1" "$2" && mount --bind "$2" "$1"'
        argv = flags.join_mounts(rec.pid, ["sh", "-c", script, "sh", target, source])
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"binding {source} at {target} for {node.name}: {proc.stderr}")
        say(f"bound {source} at {target} in {node.name}'s mounts")


def _start_kubelet(lay: Layout, node: NodeLayout, node_ip: str | None) -> bool:
    """Start the node's kubelet unless it runs; True when started now."""
    if not node.is_first:
        iptables.add(netrules.api_link(node.address, lay.ports.apiserver))
    runtime = procs.running(lay.pid_file(node.containerd_process))
    if runtime is None:
        raise ClusterError(f"{node.containerd_process} is not running")
    return _start(
        lay,
        node.kubelet_process,
        flags.kubelet_argv(lay, node, node_ip, runtime.pid),
        kind="kubelet",
        host=node.address,
    )


def _wait_ready(
    lay: Layout, nodes: Sequence[NodeLayout], since: dt.datetime | None = None
) -> float:
    with _client(lay) as c:
        return _wait(
            f"node(s) {', '.join(n.name for n in nodes)} Ready",
            lambda: all(
                _check_alive(lay, n.kubelet_process) and _node_ready(c, n.name, since)
                for n in nodes
            ),
            90,
            lay.log_file(nodes[-1].kubelet_process),
        )


def up_nodes(lay: Layout, first_name: str, count: int) -> None:
    """Node 1 (named `first_name`) and nodes 2..`count`, each with its own containerd and
    kubelet; the runtimes start first, then every kubelet, then one wait for all to be Ready."""
    t0 = time.monotonic()
    if os.geteuid() != 0:
        raise ClusterError("`up --node` needs root (containerd, kubelet, mounts and CNI)")
    current = running_node(lay)
    if current is not None and current != first_name:
        raise ClusterError(
            f"a node named {current!r} is running; `python -m akri_trio_dev cluster down` first"
        )
    ensure_packages(NODE_PACKAGES)
    node_ip = None
    if not flags.is_ip_node_name(first_name):
        node_ip = default_route_ip()
        if node_ip is None:
            raise ClusterError(
                f"node name {first_name!r} needs a non-loopback IPv4 address; "
                "use --node-name=127.0.0.1"
            )
    nodes = [lay.node(i, first_name) for i in range(1, count + 1)]
    for node in nodes:
        write_node_files(lay, node, node_ip if node.is_first else None)
        _start_runtime(lay, node)
    lay.node_name_file.write_text(first_name + "\n")
    for node in nodes:
        _heal_leftover_partition(lay, node)
        _start_kubelet(lay, node, node_ip if node.is_first else None)
    took = _wait_ready(lay, nodes)
    names = ", ".join(n.name for n in nodes)
    say(f"node(s) {names} Ready ({took:.1f} s; total {time.monotonic() - t0:.1f} s)")


# -- down ----------------------------------------------------------------------------------
def _kubectl(lay: Layout, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(lay.kubectl), f"--kubeconfig={lay.kubeconfig('admin')}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _drain(lay: Layout, node: str) -> None:
    """Delete the node's pods through the API while the kubelet runs, so it unmounts their
    volumes and tears down their sandboxes; cordon first so nothing lands there meanwhile."""
    if not lay.kubectl.is_file() or not apiserver_ready(lay):
        return
    _kubectl(lay, "cordon", node)
    sel = f"--field-selector=spec.nodeName={node}"
    out = _kubectl(lay, "get", "pods", "-A", sel, "-o", "name").stdout.split()
    if not out:
        return
    say(f"deleting {len(out)} pod(s) on {node}")
    _kubectl(lay, "delete", "pods", "-A", sel, "--grace-period=1", "--wait=false")
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        if not _kubectl(lay, "get", "pods", "-A", sel, "-o", "name").stdout.split():
            return
        time.sleep(0.5)
    say("pods still present after 45 s; forcing")
    _kubectl(lay, "delete", "pods", "-A", sel, "--grace-period=0", "--force")


def _kill_containers(lay: Layout, node: NodeLayout) -> None:
    """Whatever the kubelet left: SIGKILL every task and delete it, so its shim exits."""
    tasks = _ctr(lay, node, "tasks", "ls", "-q", check=False).stdout.split()
    for t in tasks:
        _ctr(lay, node, "tasks", "kill", "-s", "SIGKILL", t, check=False)
    for t in tasks:
        for _ in range(20):
            if _ctr(lay, node, "tasks", "delete", t, check=False).returncode == 0:
                break
            time.sleep(0.1)


def _kill_shims(node: NodeLayout) -> None:
    """Shims of the node's containerd that outlived it: their containers first, then the shim."""
    needle = f"{node.containerd_socket} "
    for shim in procs.find_processes("containerd-shim-runc-v2", needle):
        for child in _children(shim.pid):
            procs.stop(child, grace=0)
        procs.stop(shim, grace=2)


def _stop_node_processes(lay: Layout, node: NodeLayout) -> None:
    """The node's kubelet, then its containers, containerd and shims: the node is off."""
    rec = procs.running(lay.pid_file(node.kubelet_process))
    if rec is not None:
        say(f"stopping {node.kubelet_process} (pid {rec.pid})")
        procs.stop(rec, grace=15)
    rec = procs.running(lay.pid_file(node.containerd_process))
    if rec is not None:
        _kill_containers(lay, node)
        say(f"stopping {node.containerd_process} (pid {rec.pid})")
        procs.stop(rec, grace=15)
    _kill_shims(node)


def _remove_extra_node(lay: Layout, node: NodeLayout) -> None:
    """`down` for one extra node: its Pods, processes, mounts, bridge and host directories."""
    if procs.running(lay.pid_file(node.kubelet_process)) is not None:
        _drain(lay, node.name)
    _stop_node_processes(lay, node)
    left = _unmount_all([node.root_dir, node.containerd_root, node.containerd_state])
    if left:
        say(f"still mounted: {' '.join(left)}")
    _remove_bridge(node.bridge)
    shutil.rmtree(node.root_dir, ignore_errors=True)
    if node.pod_logs_dir is not None:
        shutil.rmtree(node.pod_logs_dir, ignore_errors=True)
    for name in (node.kubelet_process, node.containerd_process):
        lay.pid_file(name).unlink(missing_ok=True)


def _remove_bridge(bridge: str) -> None:
    if Path(f"/sys/class/net/{bridge}").exists():
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _children(pid: int) -> list[procs.ProcRecord]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            rec = procs.record_for(int(entry.name))
            if rec is not None:
                kids.append(rec)
    return kids


def _unmount_all(roots: Sequence[Path]) -> list[str]:
    """Unmount per the pure plan until nothing is left; returns what stayed mounted."""
    left: list[str] = []
    for _ in range(5):
        plan = cleanup.unmount_plan(
            Path("/proc/self/mountinfo").read_text(), [str(r) for r in roots], str(NETNS_DIR)
        )
        if not plan:
            return []
        for mp in plan:
            if subprocess.run(["umount", mp], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", mp], capture_output=True)
        left = plan
    return left


def down(lay: Layout) -> None:
    if os.geteuid() == 0:
        extras = extra_nodes(lay)
        for extra in reversed(extras):
            _remove_extra_node(lay, extra)
        # The rules are the host's, not the home's: only the home whose nodes they serve
        # removes them (another home's `down` would cut a running cluster's nodes).
        if extras:
            iptables.remove_all()
    running = [n for n in cleanup.STOP_ORDER if procs.running(lay.pid_file(n)) is not None]
    # Host paths (/var/lib/kubelet, cni0, ...) are shared by every cluster home on the machine:
    # touch them only when this home ran a node (its PID files or node name remain).
    had_node = lay.node_name_file.exists() or any(lay.pid_file(n).exists() for n in NODE_PROCESSES)
    node = running_node(lay)
    if node is not None:
        _drain(lay, node)
    for name in cleanup.stop_plan(running):
        rec = procs.running(lay.pid_file(name))
        if rec is None:
            continue
        if name == "containerd":
            _kill_containers(lay, lay.node(1))
        say(f"stopping {name} (pid {rec.pid})")
        procs.stop(rec, grace=15)
    _kill_shims(lay.node(1))
    if had_node and os.geteuid() == 0:
        first = lay.node(1)
        left = _unmount_all([KUBELET_ROOT, first.containerd_root, first.containerd_state])
        if left:
            say(f"still mounted: {' '.join(left)}")
        for ns in NETNS_DIR.glob("cni-*") if NETNS_DIR.is_dir() else ():
            ns.unlink(missing_ok=True)
        _remove_bridge(CNI_BRIDGE)
        for d in HOST_DIRS_TO_REMOVE:
            shutil.rmtree(d, ignore_errors=True)
        # containerd keeps shim sockets in /run/containerd/s whatever its config says; remove
        # the directories only when empty, as another containerd may use them.
        for d in (Path("/run/containerd/s"), Path("/run/containerd")):
            with contextlib.suppress(OSError):
                d.rmdir()
    for d in lay.runtime_dirs:
        shutil.rmtree(d, ignore_errors=True)
    for name in cleanup.STOP_ORDER:
        lay.pid_file(name).unlink(missing_ok=True)
    lay.node_name_file.unlink(missing_ok=True)
    say("down: nothing of the cluster is running")


@contextlib.contextmanager
def state_lock(lay: Layout) -> Iterator[None]:
    """One `up` or `down` at a time per cluster home: tests in several sessions call `up`
    concurrently, and an `up` racing a `down` would leave processes without PID files."""
    lay.run.mkdir(parents=True, exist_ok=True)
    with (lay.run / ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for another `python -m akri_trio_dev cluster up/down` to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- status / env --------------------------------------------------------------------------
def status(lay: Layout) -> bool:
    ok = True
    for name in CONTROL_PLANE:
        rec = procs.running(lay.pid_file(name))
        print(f"{name:<24} {'running, pid ' + str(rec.pid) if rec else 'stopped'}")
        ok &= rec is not None
    for node in (lay.node(1), *extra_nodes(lay)):
        for name in (node.containerd_process, node.kubelet_process):
            rec = procs.running(lay.pid_file(name))
            print(f"{name:<24} {'running, pid ' + str(rec.pid) if rec else 'stopped'}")
        if not node.is_first and _partitioned(lay, node):
            print(f"{node.name:<24} partitioned from the API server")
    ready = apiserver_ready(lay)
    print(f"{'apiserver /readyz':<24} {'ok' if ready else 'not ready'}")
    node_name = running_node(lay)
    if node_name is not None:
        print(f"{'node':<24} {node_name}")
    return ok and ready


def env_lines(lay: Layout, node_name: str | None = None) -> list[str]:
    """The cluster's `export` lines; the node keys describe node 1, or `node_name`'s node."""
    pairs: dict[str, object] = {
        "KUBECONFIG": lay.kubeconfig("admin"),
        "AKRI_TRIO_RESTRICTED_KUBECONFIG": lay.kubeconfig("restricted"),
        "ETCD_ENDPOINT": lay.etcd_url,
        "KUBECTL": lay.kubectl,
        "AKRI_TRIO_APISERVER": lay.apiserver_url,
        "AKRI_TRIO_CA_CERT": lay.pki / "ca.crt",
        "AKRI_TRIO_CA_KEY": lay.pki / "ca.key",
        "AKRI_TRIO_WEBHOOK_CERT": lay.pki / "webhook.crt",
        "AKRI_TRIO_WEBHOOK_KEY": lay.pki / "webhook.key",
        "AKRI_TRIO_CLUSTER_DIR": lay.run,
        # The release the control plane runs (tests skip what it lacks: tests/support/releases.py).
        "AKRI_TRIO_K8S_VERSION": running_version(lay) or lay.k8s_version,
    }
    first = running_node(lay)
    extras = extra_nodes(lay)
    if first is not None:
        node = lay.node(1, first) if node_name in (None, first) else _extra(lay, node_name)
        pairs |= node.env_pairs()
        pairs["AKRI_TRIO_NODES"] = " ".join([first, *(n.name for n in extras)])
    elif node_name is not None:
        raise ClusterError("no node runs: `python -m akri_trio_dev cluster up --node` first")
    return export_lines(pairs)


# -- one extra node ------------------------------------------------------------------------
def _extra(lay: Layout, name: str) -> NodeLayout:
    try:
        node = lay.node_named(name)
    except ValueError as exc:
        raise ClusterError(f"{exc}; node 1 is shared by every session and stays up") from exc
    if not node.state.is_dir():
        raise ClusterError(f"no node {name}: `python -m akri_trio_dev cluster up --nodes N` first")
    return node


def _partitioned(lay: Layout, node: NodeLayout) -> bool:
    rule = netrules.partition(node.address, lay.ports.apiserver, lay.ports.kubelet)
    return iptables.present(rule)


def _heal_leftover_partition(lay: Layout, node: NodeLayout) -> None:
    """`up` wants every node it names reachable: a partition left by a `node partition` whose
    `heal` never ran (its test or session was killed) is lifted, or the node's kubelet could
    never register or renew its lease."""
    if not node.is_first and _partitioned(lay, node):
        iptables.remove(netrules.partition(node.address, lay.ports.apiserver, lay.ports.kubelet))
        say(f"healed a leftover partition of node {node.name}")


def node_stop(lay: Layout, name: str) -> None:
    """Power the extra node off: kubelet, containers, containerd; its Node object stays."""
    _stop_node_processes(lay, _extra(lay, name))
    say(f"node {name} stopped")


def node_start(lay: Layout, name: str) -> None:
    """Start the extra node's containerd and kubelet again and wait for it to be Ready."""
    node = _extra(lay, name)
    since = dt.datetime.now(dt.UTC)
    write_node_files(lay, node, None)
    _start_runtime(lay, node)
    started = _start_kubelet(lay, node, None)
    took = _wait_ready(lay, [node], since if started else None)
    say(f"node {name} Ready ({took:.1f} s)")


def node_remove(lay: Layout, name: str) -> None:
    """`down` for one extra node: its Pods, processes, mounts, bridge, link and state, and its
    Node object; `up --nodes N` adds it again."""
    node = _extra(lay, name)
    _remove_extra_node(lay, node)
    iptables.remove(netrules.partition(node.address, lay.ports.apiserver, lay.ports.kubelet))
    iptables.remove(netrules.api_link(node.address, lay.ports.apiserver))
    if lay.kubectl.is_file() and apiserver_ready(lay):
        _kubectl(lay, "delete", "node", node.name, "--ignore-not-found")
    shutil.rmtree(node.state, ignore_errors=True)
    say(f"node {name} removed")


def node_partition(lay: Layout, name: str) -> None:
    """Cut the extra node's link to the API server (both ways); its processes keep running."""
    node = _extra(lay, name)
    iptables.add(netrules.partition(node.address, lay.ports.apiserver, lay.ports.kubelet))
    say(f"node {name} partitioned from the API server")


def node_heal(lay: Layout, name: str) -> None:
    node = _extra(lay, name)
    iptables.remove(netrules.partition(node.address, lay.ports.apiserver, lay.ports.kubelet))
    say(f"node {name} reconnected to the API server")


def main_error(exc: ClusterError) -> int:
    print(f"[cluster] error: {exc}", file=sys.stderr, flush=True)
    return 1
