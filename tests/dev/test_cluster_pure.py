"""The pure parts of `python -m akri_trio_dev cluster`: config text, flags, PKI, OCI images, cleanup
plans.

No cluster needed; these run in well under a second (PKI generation aside).
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import socket
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from akri_trio_dev.cluster import cleanup, configs, flags, oci, pki, procs, runner
from akri_trio_dev.cluster.exports import export_lines, parse_exports
from akri_trio_dev.cluster.layout import (
    COMPONENTS,
    K8S_VERSION,
    VERSIONS,
    VERSIONS_FILE,
    Layout,
    parse_versions,
)

LAY = Layout(home=Path("/h"))


# -- configs ---------------------------------------------------------------------------------
def test_kubeconfig_with_token_points_at_server_ca_and_token() -> None:
    text = configs.kubeconfig(
        server="https://127.0.0.1:16443",
        ca=Path("/p/ca.crt"),
        user="admin",
        creds=configs.Credentials(token="t0k"),
    )
    doc = yaml.safe_load(text)
    ctx_name = doc["current-context"]
    (ctx,) = [c["context"] for c in doc["contexts"] if c["name"] == ctx_name]
    (cluster,) = [c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"]]
    (user,) = [u["user"] for u in doc["users"] if u["name"] == ctx["user"]]
    assert cluster == {"server": "https://127.0.0.1:16443", "certificate-authority": "/p/ca.crt"}
    assert user == {"token": "t0k"}


def test_kubeconfig_with_client_cert() -> None:
    creds = configs.Credentials(client_certificate=Path("/c.crt"), client_key=Path("/c.key"))
    doc = yaml.safe_load(
        configs.kubeconfig(server="https://s", ca=Path("/ca"), user="system:node:n", creds=creds)
    )
    assert doc["users"][0]["user"] == {"client-certificate": "/c.crt", "client-key": "/c.key"}


def test_kubeconfig_without_credentials_is_refused() -> None:
    with pytest.raises(ValueError):
        configs.kubeconfig(
            server="https://s", ca=Path("/ca"), user="u", creds=configs.Credentials()
        )


def test_tokens_csv_rows_give_admin_masters_and_restricted_no_groups() -> None:
    tokens = {who: f"tok-{who}" for who in configs.TOKEN_USERS}
    rows = {r[1]: r for r in csv.reader(io.StringIO(configs.tokens_csv(tokens)))}
    assert rows["admin"][0] == "tok-admin" and rows["admin"][3] == "system:masters"
    assert rows["akri-restricted"][0] == "tok-restricted" and len(rows["akri-restricted"]) == 3
    # names that the bootstrap RBAC policy already binds
    assert rows["system:kube-controller-manager"][0] == "tok-controller-manager"
    assert rows["system:kube-scheduler"][0] == "tok-scheduler"


def test_new_tokens_are_distinct_and_cover_every_user() -> None:
    tokens = configs.new_tokens()
    assert set(tokens) == set(configs.TOKEN_USERS)
    assert len(set(tokens.values())) == len(tokens)


def test_containerd_config_restricts_oom_score_adj_stays_in_its_dirs_and_reads_cdi() -> None:
    text = configs.containerd_config(
        root=Path("/r/root"),
        state=Path("/r/state"),
        socket=Path("/r/c.sock"),
        cni_conf_dir=Path("/r/net.d"),
        cdi_dir=Path("/r/cdi"),
        sandbox_image="registry.k8s.io/pause:3.10.2",
    )
    doc = tomllib.loads(text)
    runtime = doc["plugins"]["io.containerd.cri.v1.runtime"]
    images = doc["plugins"]["io.containerd.cri.v1.images"]
    assert doc["version"] == 3
    assert (doc["root"], doc["state"], doc["grpc"]["address"]) == (
        "/r/root",
        "/r/state",
        "/r/c.sock",
    )
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["enable_cdi"] is True and runtime["cdi_spec_dirs"] == ["/r/cdi"]
    assert images["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10.2"
    assert runtime["cni"] == {"bin_dirs": ["/usr/lib/cni"], "conf_dir": "/r/net.d"}
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["Root"] == "/r/state/runc"


def _kubelet_settings(address: str) -> configs.KubeletSettings:
    return configs.KubeletSettings(
        runtime_endpoint="unix:///r/c.sock",
        client_ca=Path("/p/ca.crt"),
        address=address,
        port=10250,
        healthz_port=10248,
        volume_plugin_dir=Path("/var/lib/kubelet/volumeplugins"),
    )


def test_kubelet_config_runs_on_cgroup_v1_and_never_evicts() -> None:
    doc = yaml.safe_load(configs.kubelet_config(_kubelet_settings("127.0.0.1")))
    assert doc["kind"] == "KubeletConfiguration"
    assert doc["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert doc["failCgroupV1"] is False and doc["cgroupDriver"] == "cgroupfs"
    assert doc["evictionHard"] == {} and doc["imageGCHighThresholdPercent"] == 100
    assert doc["containerRuntimeEndpoint"] == "unix:///r/c.sock"
    assert doc["address"] == "127.0.0.1" and doc["readOnlyPort"] == 0
    assert doc["authentication"]["anonymous"] == {"enabled": False}
    assert doc["authentication"]["x509"] == {"clientCAFile": "/p/ca.crt"}


def test_cni_conflist_is_bridge_with_host_local_then_loopback() -> None:
    doc = json.loads(configs.cni_conflist(bridge="cni0", subnet="10.244.0.0/24"))
    bridge, loopback = doc["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == "cni0" and not bridge["ipMasq"]
    assert bridge["ipam"]["type"] == "host-local"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.0.0/24"}]]
    assert loopback == {"type": "loopback"}


# -- flags -----------------------------------------------------------------------------------
def _opts(argv: list[str]) -> dict[str, str]:
    out = {}
    for a in argv[1:]:
        key, _, value = a.partition("=")
        out[key] = value
    return out


def test_apiserver_flags_secure_loopback_node_rbac_and_sa_admission_on() -> None:
    o = _opts(flags.kube_apiserver(LAY))
    assert o["--bind-address"] == "127.0.0.1"
    assert o["--secure-port"] == "16443"
    assert o["--authorization-mode"] == "Node,RBAC"
    assert "--disable-admission-plugins" not in o  # ServiceAccount admission stays on
    assert "NodeRestriction" in o["--enable-admission-plugins"]
    assert o["--token-auth-file"] == "/h/run/pki/tokens.csv"
    assert o["--client-ca-file"] == "/h/run/pki/ca.crt"
    assert o["--etcd-servers"] == "http://127.0.0.1:12379"
    assert o["--kubelet-preferred-address-types"].startswith("InternalIP")


def test_etcd_listens_on_loopback_only() -> None:
    o = _opts(flags.etcd(LAY))
    for key in ("--listen-client-urls", "--listen-peer-urls"):
        assert o[key].startswith("http://127.0.0.1:")


def test_controller_manager_and_scheduler_listen_on_loopback() -> None:
    for argv in (flags.kube_controller_manager(LAY), flags.kube_scheduler(LAY)):
        o = _opts(argv)
        assert o["--bind-address"] == "127.0.0.1"
    kcm = _opts(flags.kube_controller_manager(LAY))
    assert kcm["--service-account-private-key-file"] == "/h/run/pki/sa.key"
    assert kcm["--controllers"] == "*"  # GC, Jobs, ServiceAccount tokens, ...


def test_controller_manager_credentials_cover_all_its_controllers() -> None:
    """Without per-controller ServiceAccounts, the kcm's own user must be allowed everything."""
    kcm = _opts(flags.kube_controller_manager(LAY))
    if kcm["--use-service-account-credentials"] == "false":
        assert "system:masters" in configs.TOKEN_USERS["controller-manager"][1]


def test_kubelet_ip_node_uses_hostname_override_and_standard_root_dir() -> None:
    o = _opts(flags.kubelet_argv(LAY, LAY.node(1), None))
    assert o["--root-dir"] == "/var/lib/kubelet"
    assert o["--hostname-override"] == "127.0.0.1"
    assert flags.kubelet_address("127.0.0.1", None) == "127.0.0.1"
    assert "--node-ip" not in o  # the kubelet refuses a loopback --node-ip
    assert o["--config"] == "/h/run/kubelet-config.yaml"
    assert o["--kubeconfig"] == "/h/run/kubelet.kubeconfig"


def test_kubelet_named_node_needs_and_uses_a_node_ip() -> None:
    with pytest.raises(ValueError):
        flags.kubelet_argv(LAY, LAY.node(1, "akri-node"), None)
    o = _opts(flags.kubelet_argv(LAY, LAY.node(1, "akri-node"), "192.0.2.2"))
    assert o["--hostname-override"] == "akri-node"
    assert o["--node-ip"] == "192.0.2.2"
    assert flags.kubelet_address("akri-node", "192.0.2.2") == "192.0.2.2"


@pytest.mark.parametrize(
    ("name", "is_ip"),
    [("127.0.0.1", True), ("10.0.0.300", False), ("node-a", False), ("1.2.3", False)],
)
def test_is_ip_node_name(name: str, is_ip: bool) -> None:
    assert flags.is_ip_node_name(name) is is_ip


# -- PKI -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pki_files() -> dict[str, bytes]:
    return pki.control_plane_pki(dt.datetime.now(dt.UTC))


def test_apiserver_cert_is_signed_by_ca_and_names_loopback_and_service_ip(
    pki_files: dict[str, bytes],
) -> None:
    ca = x509.load_pem_x509_certificate(pki_files["ca.crt"])
    cert = x509.load_pem_x509_certificate(pki_files["apiserver.crt"])
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert {"127.0.0.1", "10.0.0.1"} <= ips
    assert "kubernetes.default.svc" in san.get_values_for_type(x509.DNSName)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku


def test_kubelet_client_cert_of_apiserver_is_a_master(pki_files: dict[str, bytes]) -> None:
    cert = x509.load_pem_x509_certificate(pki_files["apiserver-kubelet-client.crt"])
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]


def test_node_client_cert_subject_matches_node_authorizer(pki_files: dict[str, bytes]) -> None:
    ca = pki.KeyCert(pki_files["ca.key"], pki_files["ca.crt"])
    kc = pki.node_client(ca, dt.datetime.now(dt.UTC), "n1")
    cert = x509.load_pem_x509_certificate(kc.cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(pki_files["ca.crt"]))
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    org = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    assert (cn, org) == ("system:node:n1", "system:nodes")
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


# -- OCI images ------------------------------------------------------------------------------
FAKE_BUSYBOX = b"\x7fELF fake busybox"


def _members(tar_bytes: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return {m.name: m for m in tar.getmembers()}


def _read(tar_bytes: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


def _blob(tar_bytes: bytes, desc: dict[str, Any]) -> bytes:
    algo, hexd = desc["digest"].split(":")
    data = _read(tar_bytes, f"blobs/{algo}/{hexd}")
    assert hashlib.sha256(data).hexdigest() == hexd
    assert len(data) == desc["size"]
    return data


def test_oci_tar_digests_and_sizes_match_their_blobs() -> None:
    layer = oci.busybox_layer(FAKE_BUSYBOX, ["sh", "sleep", "echo"])
    tar = oci.image_tar(ref="docker.io/library/busybox:latest", layer=layer, cmd=["sh"])
    assert json.loads(_read(tar, "oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(_read(tar, "index.json"))
    (mdesc,) = index["manifests"]
    assert mdesc["annotations"]["io.containerd.image.name"] == "docker.io/library/busybox:latest"
    assert mdesc["annotations"]["org.opencontainers.image.ref.name"] == "latest"
    manifest = json.loads(_blob(tar, mdesc))
    assert manifest["mediaType"] == oci.MEDIA_MANIFEST == mdesc["mediaType"]
    config = json.loads(_blob(tar, manifest["config"]))
    (ldesc,) = manifest["layers"]
    layer_back = _blob(tar, ldesc)
    assert layer_back == layer
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Cmd"] == ["sh"] and "Entrypoint" not in config["config"]


def test_busybox_layer_has_executable_and_applet_symlinks() -> None:
    layer = oci.busybox_layer(FAKE_BUSYBOX, ["sh", "sleep", "busybox", "cat"])
    members = _members(layer)
    exe = members["bin/busybox"]
    assert exe.isfile() and exe.mode == 0o755 and _read(layer, "bin/busybox") == FAKE_BUSYBOX
    for applet in ("sh", "sleep", "cat"):
        assert members[f"bin/{applet}"].issym() and members[f"bin/{applet}"].linkname == "busybox"
    assert all(m.mtime == 0 and m.uid == 0 for m in members.values())


def test_images_are_reproducible_and_pause_sleeps_forever() -> None:
    a = oci.pause_and_busybox(
        FAKE_BUSYBOX, ["sh", "sleep"], pause_ref="r/p:3.6", busybox_ref="r/b:1"
    )
    b = oci.pause_and_busybox(
        FAKE_BUSYBOX, ["sleep", "sh"], pause_ref="r/p:3.6", busybox_ref="r/b:1"
    )
    assert a == b
    index = json.loads(_read(a["r/p:3.6"], "index.json"))
    manifest = json.loads(_blob(a["r/p:3.6"], index["manifests"][0]))
    config = json.loads(_blob(a["r/p:3.6"], manifest["config"]))
    assert config["config"]["Entrypoint"][0] == "/bin/sleep"


# -- cleanup plan ----------------------------------------------------------------------------
MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:5 / /proc rw - proc proc rw
40 22 8:1 /var/lib/kubelet /var/lib/kubelet rw shared:10 - ext4 /dev/vda rw
41 40 8:1 /var/lib/kubelet /var/lib/kubelet rw shared:10 - ext4 /dev/vda rw
42 41 0:50 / /var/lib/kubelet/pods/uid/volumes/kubernetes.io~secret/tok rw - tmpfs tmpfs rw
43 22 0:51 / /run/netns/cni-1234 rw - nsfs nsfs rw
44 22 0:52 / /run/netns/other rw - nsfs nsfs rw
45 22 0:53 / /h/run/containerd/state/io.containerd.runtime.v2.task/k8s.io/abc/rootfs rw - o o rw
46 22 0:54 / /var/lib/kubelet-other rw - tmpfs tmpfs rw
47 22 0:55 / /var/lib/kubelet/pods/with\\040space rw - tmpfs tmpfs rw
"""


def test_unmount_plan_is_deepest_first_and_repeats_stacked_mounts() -> None:
    plan = cleanup.unmount_plan(MOUNTINFO, ["/var/lib/kubelet", "/h/run/containerd/state"])
    assert plan == [
        "/h/run/containerd/state/io.containerd.runtime.v2.task/k8s.io/abc/rootfs",
        "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~secret/tok",
        "/var/lib/kubelet/pods/with space",
        "/run/netns/cni-1234",
        "/var/lib/kubelet",
        "/var/lib/kubelet",
    ]


def test_unmount_plan_leaves_other_mounts_alone() -> None:
    plan = cleanup.unmount_plan(MOUNTINFO, ["/var/lib/kubelet"])
    assert "/var/lib/kubelet-other" not in plan and "/run/netns/other" not in plan
    assert "/" not in plan and "/proc" not in plan


def test_stop_plan_stops_node_before_control_plane_and_etcd_last() -> None:
    assert cleanup.stop_plan(["etcd", "kube-apiserver", "kubelet", "containerd"]) == [
        "kubelet",
        "containerd",
        "kube-apiserver",
        "etcd",
    ]
    assert cleanup.STOP_ORDER[-1] == "etcd" and cleanup.STOP_ORDER[0] == "kubelet"


def test_runtime_dirs_never_include_the_pki_binaries_or_go_cache() -> None:
    kept = [LAY.pki, LAY.go_cache, *(LAY.build_dir(c) for c in COMPONENTS)]
    for d in LAY.runtime_dirs:
        for k in kept:
            assert not (k == d or d in k.parents)


def test_binaries_live_in_a_directory_named_by_their_component_version() -> None:
    assert LAY.binary("kubelet") == Path(f"/h/build/kubernetes-{K8S_VERSION}/bin/kubelet")
    assert LAY.binary("etcd").parent.parent.name == f"etcd-{VERSIONS['ETCD']}"
    assert LAY.binary("ctr").parent.parent.name == f"containerd-{VERSIONS['CONTAINERD']}"


def test_versions_file_parses_and_every_wrapper_module_requires_its_pinned_version() -> None:
    assert parse_versions("# c\nA = v1\n\nB=v2 \n") == {"A": "v1", "B": "v2"}
    gobuild = VERSIONS_FILE.parent
    required = {
        "etcd": f"go.etcd.io/etcd/server/v3 {VERSIONS['ETCD']}",
        "containerd": f"github.com/containerd/containerd/v2 {VERSIONS['CONTAINERD']}",
    }
    # One Kubernetes wrapper per supported release, named by its minor.
    for release in (VERSIONS["KUBERNETES"], VERSIONS["KUBERNETES_OLDEST"]):
        minor = release.removeprefix("v").rsplit(".", 1)[0]
        required[f"kubernetes-{minor}"] = f"k8s.io/kubernetes {release}"
    for wrapper, requirement in required.items():
        mod = (gobuild / wrapper / "go.mod").read_text()
        assert f"require {requirement}\n" in mod, wrapper
        assert (gobuild / wrapper / "go.sum").stat().st_size > 0
        if wrapper.startswith("kubernetes-"):
            staging = "v0." + requirement.split()[-1].removeprefix("v1.")
            assert f"k8s.io/api => k8s.io/api {staging}\n" in mod, wrapper
    modules = {p.parent.name for p in gobuild.glob("*/go.mod")}
    assert modules == set(required)  # no wrapper of a release versions.env no longer names


# -- processes, ports, packages --------------------------------------------------------------
def test_port_conflict_names_the_port() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        (msg,) = procs.port_conflicts({"kube-apiserver": port})
        assert f"port {port} (kube-apiserver)" in msg
    finally:
        s.close()
    assert procs.port_conflicts({"kube-apiserver": port}) == []


def test_proc_record_round_trip_and_garbage() -> None:
    rec = procs.ProcRecord(123, 456)
    assert procs.ProcRecord.parse(rec.render()) == rec
    assert procs.ProcRecord.parse("nonsense") is None


def test_parse_stat_survives_parentheses_in_comm() -> None:
    fields = " ".join(str(i) for i in range(4, 23))
    text = f"77 (we) ird) S {fields} 99"
    state, start = procs.parse_stat(text)
    assert state == "S" and start == 22


def test_spawn_stop_and_stale_pid_file(tmp_path: Path) -> None:
    pid_file, log = tmp_path / "p.pid", tmp_path / "p.log"
    rec = procs.spawn(["sleep", "60"], pid_file=pid_file, log_file=log)
    assert procs.running(pid_file) == rec
    procs.stop(rec, grace=5)
    assert not procs.is_alive(rec)
    assert procs.running(pid_file) is None  # same PID file, now stale
    # a recycled PID with another start time is not ours
    assert not procs.is_alive(procs.ProcRecord(rec.pid, rec.start_time + 1))


def test_missing_packages_reads_dpkg_query() -> None:
    out = "etcd-server ii \ncontainerd rc \nrunc:amd64 ii \n"
    assert runner.missing_packages(out, ["etcd-server", "containerd", "runc", "iproute2"]) == [
        "containerd",
        "iproute2",
    ]


def test_env_lines_name_the_documented_keys() -> None:
    keys = set(parse_exports("\n".join(runner.env_lines(LAY))))
    assert {"KUBECONFIG", "AKRI_TRIO_RESTRICTED_KUBECONFIG", "ETCD_ENDPOINT", "KUBECTL"} <= keys
    assert "AKRI_TRIO_NODE_NAME" not in keys  # no kubelet runs under /h


def test_env_lines_are_quoted_exports_that_read_back() -> None:
    pairs = {"A": "/p/with space", "B": "it's", "C": "$HOME `x` \\n", "D": ""}
    lines = export_lines(pairs)
    assert lines[0] == "export A='/p/with space'"
    assert parse_exports("\n".join(["# note", "", *lines, "junk line", "E=bare"])) == {
        **pairs,
        "E": "bare",
    }
    proc = subprocess.run(
        ["sh", "-c", "\n".join(lines) + '\nprintf "%s|%s|%s|%s" "$A" "$B" "$C" "$D"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout == "|".join(pairs.values())
