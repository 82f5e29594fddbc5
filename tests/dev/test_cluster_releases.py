"""Every supported Kubernetes release: `cluster up --version` picks one of the two pinned in
versions.env, each runs its own binaries (built once, kept per version), a running cluster of
another release is never replaced behind its users' backs, and tests of features a release
lacks skip on it with a reason naming both. No cluster: the CLI runs against empty homes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from akri_trio_dev import ROOT, run_cluster_command
from akri_trio_dev.cluster import cli as cluster_cli
from akri_trio_dev.cluster import flags, procs, releases, runner
from akri_trio_dev.cluster.exports import parse_exports
from akri_trio_dev.cluster.layout import (
    K8S_OLDEST,
    K8S_RELEASES,
    K8S_VERSION,
    VERSIONS,
    Layout,
    minor_of,
    resolve_release,
)
from tests.support.releases import is_compat_module

OLDEST = Layout(home=Path("/h"), k8s_version=K8S_OLDEST)
NEWEST = Layout(home=Path("/h"))


def test_the_supported_releases_are_the_oldest_and_the_newest_pinned() -> None:
    assert (VERSIONS["KUBERNETES_OLDEST"], VERSIONS["KUBERNETES"]) == K8S_RELEASES
    assert minor_of(K8S_OLDEST) == 34 and minor_of(K8S_VERSION) == 37
    assert NEWEST.k8s_version == K8S_VERSION  # the default


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("1.34", K8S_OLDEST),
        ("v1.34", K8S_OLDEST),
        (K8S_OLDEST, K8S_OLDEST),
        (K8S_OLDEST.removeprefix("v"), K8S_OLDEST),
        ("oldest", K8S_OLDEST),
        ("1.37", K8S_VERSION),
        ("newest", K8S_VERSION),
    ],
)
def test_a_release_is_named_by_its_minor_or_its_exact_version(text: str, release: str) -> None:
    assert resolve_release(text) == release


@pytest.mark.parametrize("text", ["1.33", "1.35", "v1.34.3", "1.3", "latest", ""])
def test_an_unsupported_release_is_refused_naming_the_supported_ones(text: str) -> None:
    with pytest.raises(ValueError, match=r"supported: 1\.34 \(v1\.34\.\d+\), 1\.37 \(v1\.37"):
        resolve_release(text)


def test_each_release_runs_its_own_kubernetes_binaries_and_shares_etcd_and_containerd() -> None:
    for name in ("kube-apiserver", "kubelet", "kubectl"):
        assert OLDEST.binary(name) == Path(f"/h/build/kubernetes-{K8S_OLDEST}/bin/{name}")
        assert NEWEST.binary(name) == Path(f"/h/build/kubernetes-{K8S_VERSION}/bin/{name}")
    for name in ("etcd", "containerd", "ctr"):
        assert OLDEST.binary(name) == NEWEST.binary(name)
    assert flags.kube_apiserver(OLDEST)[0] == str(OLDEST.binary("kube-apiserver"))
    assert OLDEST.kubectl != NEWEST.kubectl
    assert OLDEST.run == NEWEST.run  # one cluster home: one release runs in it at a time


def test_the_command_lines_are_the_same_for_every_release_but_the_binaries() -> None:
    """No flag differs between the supported releases (releases.py says why): only the
    binary paths do."""
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        old, new = flags.control_plane_argv(OLDEST, name), flags.control_plane_argv(NEWEST, name)
        assert old[1:] == new[1:] and old[0] != new[0]


def test_layout_default_takes_the_release_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AKRI_TRIO_HOME", "/h")
    monkeypatch.delenv("AKRI_TRIO_K8S_VERSION", raising=False)
    assert Layout.default() == NEWEST
    monkeypatch.setenv("AKRI_TRIO_K8S_VERSION", "1.34")
    assert Layout.default() == OLDEST
    assert Layout.default("newest") == NEWEST  # an explicit --version wins


def test_the_running_release_is_read_from_the_apiserver_binarys_directory() -> None:
    assert runner.release_of_binary(OLDEST.binary("kube-apiserver")) == K8S_OLDEST
    assert runner.release_of_binary(Path("/usr/bin/kube-apiserver")) is None


def _cli(home: Path, *args: str, version: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AKRI_TRIO_HOME": str(home)}
    env.pop("AKRI_TRIO_K8S_VERSION", None)
    if version is not None:
        env["AKRI_TRIO_K8S_VERSION"] = version
    return run_cluster_command(*args, capture_output=True, env=env)


def test_env_names_the_release_and_its_kubectl(tmp_path: Path) -> None:
    """Nothing runs in this home: `env` describes the release asked for (else the newest)."""
    for version, release in ((None, K8S_VERSION), ("1.34", K8S_OLDEST)):
        pairs = parse_exports(_cli(tmp_path, "env", version=version).stdout)
        assert pairs["AKRI_TRIO_K8S_VERSION"] == release
        assert pairs["KUBECTL"] == str(tmp_path / "build" / f"kubernetes-{release}/bin/kubectl")


def test_an_unsupported_release_in_the_environment_is_an_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    proc = _cli(tmp_path, "status", version="1.20")
    assert proc.returncode == 1
    assert "error: Kubernetes '1.20' is not a supported release" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_up_refuses_an_unsupported_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cluster_cli.main(["up", "--version", "1.33"])
    assert "not a supported release" in capsys.readouterr().err


def test_up_of_another_release_than_the_running_one_is_refused(tmp_path: Path) -> None:
    """A stand-in kube-apiserver (a copy of sleep) runs from the newest release's build
    directory in this home: `up --version 1.34` stops at once, naming both releases and the
    way out, and leaves it running; `status` and `env` describe the running release."""
    lay = Layout(home=tmp_path)
    fake = lay.binary("kube-apiserver")
    fake.parent.mkdir(parents=True)
    shutil.copy("/bin/sleep", fake)
    sleeper = subprocess.Popen([str(fake), "300"])
    try:
        rec = procs.record_for(sleeper.pid)
        assert rec is not None
        lay.pids.mkdir(parents=True)
        lay.pid_file("kube-apiserver").write_text(rec.render())
        assert runner.running_version(lay) == K8S_VERSION
        proc = _cli(tmp_path, "up", "--version", "1.34")
        assert proc.returncode == 1
        assert f"runs Kubernetes {K8S_VERSION}, not {K8S_OLDEST}" in proc.stderr
        assert "cluster down` first (or ask for --version 1.37)" in proc.stderr
        assert procs.is_alive(rec)
        pairs = parse_exports(_cli(tmp_path, "env", version="1.34").stdout)
        assert pairs["AKRI_TRIO_K8S_VERSION"] == K8S_VERSION
        assert pairs["KUBECTL"] == str(lay.kubectl)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(
    ("version", "gate", "has"),
    [
        (K8S_OLDEST, "DynamicResourceAllocation", True),
        (K8S_OLDEST, "DRAExtendedResource", False),
        (K8S_OLDEST, "DRAConsumableCapacity", False),
        (K8S_OLDEST, "DRADeviceTaints", False),
        ("v1.35.4", "DRAExtendedResource", False),
        ("v1.36.1", "DRAExtendedResource", True),
        (K8S_VERSION, "DRAExtendedResource", True),
        (K8S_VERSION, "DRADeviceTaints", True),
        (K8S_VERSION, "DRAConsumableCapacity", True),
    ],
)
def test_which_release_has_which_feature_on_by_default(version: str, gate: str, has: bool) -> None:
    assert releases.has_feature(version, gate) is has


def test_the_reason_a_test_cannot_run_names_the_gate_its_release_and_the_clusters() -> None:
    assert releases.lacks_reason(K8S_VERSION, ["DRAExtendedResource", "DRADeviceTaints"]) is None
    assert releases.lacks_reason(K8S_OLDEST, ["DynamicResourceAllocation", "DRADeviceTaints"]) == (
        f"needs DRADeviceTaints (on by default from 1.36); the cluster runs Kubernetes {K8S_OLDEST}"
    )


@pytest.mark.parametrize(
    ("module", "compat"),
    [
        ("deploy/test_chart.py", True),
        ("node/test_dra_node.py", True),
        ("controller/test_controller_dra.py", True),
        ("dev/test_cluster_live.py", True),
        ("controller/test_brokers.py", False),
        ("dev/test_cluster_pure.py", False),
    ],
)
def test_the_compat_modules_are_the_deploy_tier_dra_and_the_live_cluster(
    module: str, compat: bool
) -> None:
    assert is_compat_module(ROOT / "tests" / module) is compat


CONFTEST = """
import pytest
from tests.support.releases import marked_features, restore_skip_reason, skip_without

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    restore_skip_reason(report)
    return report

def pytest_configure(config):
    config.addinivalue_line("markers", "k8s_feature: gates")

@pytest.fixture(scope="session")
def cluster():
    return {"AKRI_TRIO_K8S_VERSION": "%s"}

@pytest.fixture(autouse=True)
def _k8s_features(request):
    gates = marked_features(request.node)
    if gates:
        skip_without(request.getfixturevalue("cluster"), *gates)
"""

TESTS = """
import pytest
from tests.support.releases import skip_without

@pytest.mark.k8s_feature("DRAExtendedResource")
def test_extended(cluster): pass

@pytest.mark.k8s_feature("DynamicResourceAllocation")
def test_dra(cluster): pass

def test_plain(): pass

async def test_async_part(cluster):  # pytest-trio drops a skip's reason; it is put back
    skip_without(cluster, "DRADeviceTaints")
"""


@pytest.mark.parametrize(("version", "skipped"), [(K8S_OLDEST, 2), (K8S_VERSION, 0)])
def test_a_test_marked_with_a_feature_skips_on_a_release_without_it(
    tmp_path: Path, version: str, skipped: int
) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST % version))
    (tmp_path / "test_gated.py").write_text(textwrap.dedent(TESTS))
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"),
            *("-o", "trio_mode=true", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{4 - skipped} passed" in proc.stdout
    if skipped:
        assert f"{skipped} skipped" in proc.stdout
        for gate in ("DRAExtendedResource", "DRADeviceTaints"):
            reason = (
                f"needs {gate} (on by default from 1.36); the cluster runs Kubernetes {version}"
            )
            assert reason in proc.stdout
    else:
        assert "skipped" not in proc.stdout


# ---- gobuild/build.sh with a stand-in go that records where and how it was asked to build ----

RECORDING_GO = """#!/bin/bash
# Stands in for `go build ... -o DIR/ PACKAGE`: makes DIR/<name> and records its wrapper module
# (the working directory) and the release the -X flags stamp.
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
pkg=${*: -1}; name=${pkg##*/}
case $name in v[0-9]*) name=${pkg%/*}; name=${name##*/} ;; esac  # go.etcd.io/etcd/server/v3
printf '#!/bin/sh\\n' > "$out$name"; chmod +x "$out$name"
stamp=$(printf '%s\\n' "$@" | grep -o 'component-base/version.gitVersion=[^ ]*' | head -1)
echo "$name ${PWD##*/} ${stamp##*=}" >> "$GO_RECORD"
"""


def test_each_release_builds_from_its_own_wrapper_into_its_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    go = tmp_path / "go"
    go.write_text(RECORDING_GO)
    go.chmod(0o755)
    record = tmp_path / "record"
    monkeypatch.setenv("AKRI_TRIO_GO", str(go))
    monkeypatch.setenv("GO_RECORD", str(record))
    monkeypatch.delenv("AKRI_TRIO_BUILD_SCRIPT", raising=False)
    home = tmp_path / "home"
    for release in K8S_RELEASES:
        runner.ensure_binaries(Layout(home=home, k8s_version=release), progress_every=3600)
    lines = record.read_text().splitlines()
    for release in K8S_RELEASES:
        wrapper = "kubernetes-" + release.removeprefix("v").rsplit(".", 1)[0]
        assert f"kube-apiserver {wrapper} {release}" in lines
        assert (home / "build" / f"kubernetes-{release}" / "bin" / "kubelet").is_file()
    # etcd and containerd are shared: built once, from their own wrappers.
    assert [line.split()[1] for line in lines].count("etcd") == 1
    # Switching back and forth builds nothing.
    record.unlink()
    capsys.readouterr()
    for release in (*K8S_RELEASES, *K8S_RELEASES):
        runner.ensure_binaries(Layout(home=home, k8s_version=release), progress_every=3600)
    assert not record.exists() and "building" not in capsys.readouterr().out


def test_build_refuses_a_release_no_wrapper_module_pins(tmp_path: Path) -> None:
    script = ROOT / "akri_trio_dev" / "cluster" / "gobuild" / "build.sh"
    proc = subprocess.run(
        ["bash", str(script), "kubernetes", str(tmp_path / "out"), str(tmp_path), "v1.34.3"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "no wrapper module pins k8s.io/kubernetes v1.34.3" in proc.stdout
    assert not (tmp_path / "out").exists()
