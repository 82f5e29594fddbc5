"""`python -m akri_trio_dev cluster` against the real thing: the control plane it starts must be
usable.

These share the session's cluster (conftest `cluster` fixture) and never stop it.
"""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster import cli as cluster_cli
from akri_trio_dev.cluster import netrules
from akri_trio_dev.cluster.layout import CONTROL_PLANE, K8S_RELEASES, Layout

pytestmark = pytest.mark.k8s


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cluster_command(*args, capture_output=True, env=env, timeout=300)


def _our_nat_rules() -> str:
    """The extra nodes' API links as iptables lists them (empty without extra nodes)."""
    argv = ["iptables", "-w", "-t", "nat", "-S", netrules.NAT_CHAIN]
    return subprocess.run(argv, capture_output=True, text=True).stdout


def _client_from(kubeconfig: str) -> httpx.Client:
    """A client built from the kubeconfig alone, as any consumer would."""
    doc: dict[str, Any] = yaml.safe_load(Path(kubeconfig).read_text())
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    return httpx.Client(
        base_url=cluster["server"],
        verify=tls,
        headers={"Authorization": f"Bearer {user['token']}"},
        timeout=10,
    )


def _pids(lay: Layout) -> dict[str, str]:
    return {name: lay.pid_file(name).read_text() for name in CONTROL_PLANE}


def test_status_exits_0_and_readyz_ok_with_admin_kubeconfig(cluster: dict[str, str]) -> None:
    proc = _run_cli("status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in CONTROL_PLANE:
        assert re.search(rf"^{name}\s+running, pid \d+", proc.stdout, re.M), proc.stdout
    with _client_from(cluster["KUBECONFIG"]) as c:
        r = c.get("/readyz")
        assert (r.status_code, r.text) == (200, "ok")


def test_second_up_is_quick_and_keeps_the_same_processes(cluster: dict[str, str]) -> None:
    lay = Layout.default()
    before = _pids(lay)
    t0 = time.monotonic()
    proc = _run_cli("up")
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already running" in proc.stdout and "started" not in proc.stdout
    assert _pids(lay) == before
    assert took < 5, f"second up took {took:.1f} s"


def test_restricted_user_is_authenticated_but_forbidden(cluster: dict[str, str]) -> None:
    with _client_from(cluster["AKRI_TRIO_RESTRICTED_KUBECONFIG"]) as c:
        assert c.get("/version").status_code == 200  # the token is valid...
        r = c.get("/api/v1/namespaces/default/pods")
        assert r.status_code == 403  # ...but bound to nothing
        assert r.json()["reason"] == "Forbidden"


def test_pod_can_be_created_right_after_up(cluster: dict[str, str]) -> None:
    """ServiceAccount admission is on: this only works once the default SA exists, and the Pod
    gets a projected ServiceAccount token volume."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cluster-test-unscheduled", "namespace": "default"},
        # A node selector nothing matches: the pod must never run anywhere.
        "spec": {
            "nodeSelector": {"akri-trio/none": "none"},
            "containers": [{"name": "c", "image": "docker.io/library/busybox:latest"}],
        },
    }
    with _client_from(cluster["KUBECONFIG"]) as c:
        c.delete(
            "/api/v1/namespaces/default/pods/cluster-test-unscheduled",
            params={"gracePeriodSeconds": 0},
        )
        r = c.post("/api/v1/namespaces/default/pods", json=pod)
        try:
            assert r.status_code == 201, r.text
            volumes = r.json()["spec"].get("volumes", [])
            sources = [x for v in volumes for x in (v.get("projected") or {}).get("sources", [])]
            assert any("serviceAccountToken" in x for x in sources), volumes
        finally:
            c.delete(
                "/api/v1/namespaces/default/pods/cluster-test-unscheduled",
                params={"gracePeriodSeconds": 0},
            )


def test_env_points_at_existing_files_and_a_live_etcd_gateway(cluster: dict[str, str]) -> None:
    for key in ("KUBECONFIG", "AKRI_TRIO_RESTRICTED_KUBECONFIG", "KUBECTL", "AKRI_TRIO_CA_CERT"):
        assert Path(cluster[key]).is_file(), key
    r = httpx.post(f"{cluster['ETCD_ENDPOINT']}/v3/kv/range", json={"key": "AA=="}, timeout=5)
    assert r.status_code == 200 and int(r.json()["header"]["revision"]) > 0


def test_kubectl_matches_the_server(cluster: dict[str, str]) -> None:
    proc = subprocess.run(
        [cluster["KUBECTL"], "version"],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]},
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    release = cluster["AKRI_TRIO_K8S_VERSION"]  # the newest, or the oldest under test-compat
    assert release in K8S_RELEASES
    assert f"Client Version: {release}" in proc.stdout
    assert f"Server Version: {release}" in proc.stdout


def test_up_names_a_port_that_is_taken(cluster: dict[str, str], tmp_path: Path) -> None:
    """A second cluster home (binaries shared) collides with the running etcd's port."""
    real = Layout.default()
    (tmp_path / "build").symlink_to(real.home / "build")
    proc = _run_cli("up", env={**os.environ, "AKRI_TRIO_HOME": str(tmp_path)})
    assert proc.returncode == 1
    assert f"port {real.ports.etcd_client} (etcd client) is already in use" in proc.stderr
    assert not (tmp_path / "run" / "pids" / "etcd.pid").exists()


def test_up_node_refuses_without_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before anything starts. Simulated in-process (a real unprivileged process
    cannot even read a checkout made with `mktemp -d`, as CI's is)."""
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    assert cluster_cli.main(["up", "--node"]) == 1
    assert "needs root" in capsys.readouterr().err


def test_down_stops_only_its_own_home_and_keeps_the_pki(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """`down` on another cluster home: its processes stop, runtime state goes, PKI stays,
    and the shared cluster (and its node's host paths) is untouched."""
    from akri_trio_dev.cluster import procs

    lay = Layout(home=tmp_path)
    (lay.pki).mkdir(parents=True)
    (lay.pki / "ca.crt").write_text("kept")
    lay.etcd_data.mkdir(parents=True)
    recs = [
        procs.spawn(["sleep", "300"], pid_file=lay.pid_file(n), log_file=lay.log_file(n))
        for n in ("etcd", "kube-scheduler")
    ]
    env = {**os.environ, "AKRI_TRIO_HOME": str(tmp_path)}
    rules = _our_nat_rules()
    for _ in range(2):  # idempotent
        proc = _run_cli("down", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(procs.is_alive(r) for r in recs)
    assert not lay.pid_file("etcd").exists() and not lay.etcd_data.exists()
    assert (lay.pki / "ca.crt").read_text() == "kept"
    assert _run_cli("status").returncode == 0
    assert _our_nat_rules() == rules  # the shared cluster's extra nodes keep their API link
    if cluster.get("AKRI_TRIO_NODE_NAME"):
        assert Path("/var/lib/kubelet/device-plugins/kubelet.sock").exists()


def test_failed_build_shows_the_log_tail(tmp_path: Path) -> None:
    script = tmp_path / "fail.sh"
    script.write_text(
        "echo '[build] compiling'\nfor i in $(seq 1 40); do echo line-$i; done\n"
        "echo 'FATAL: no Go today'\nexit 3\n"
    )
    env = {**os.environ, "AKRI_TRIO_HOME": str(tmp_path), "AKRI_TRIO_BUILD_SCRIPT": str(script)}
    proc = _run_cli("up", env=env)
    assert proc.returncode == 1
    assert "[build] compiling" in proc.stdout  # progress is streamed
    assert "building kubernetes failed (exit 3)" in proc.stderr
    assert "FATAL: no Go today" in proc.stderr and "line-40" in proc.stderr
    assert "line-1\n" not in proc.stderr  # a tail, not the whole log


def test_dynamic_resource_allocation_v1_is_served(cluster: dict[str, str]) -> None:
    """What a DRA mode stands on: the GA resource.k8s.io/v1 API."""
    with _client_from(cluster["KUBECONFIG"]) as c:
        r = c.get("/apis/resource.k8s.io/v1")
    assert r.status_code == 200, r.text
    served = {res["name"] for res in r.json()["resources"]}
    assert {"resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"} <= served
