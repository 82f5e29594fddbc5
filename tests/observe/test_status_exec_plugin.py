"""`akri-trio status` through a kubeconfig `exec` credential plugin, against the real API
server: the plugin is a small program written here that prints an ExecCredential holding a
token the API server accepts (the local cluster's admin token); `--context` picks the user."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from akri_trio.kube.exec_credential import V1
from tests.observe.conftest import Space

pytestmark = pytest.mark.k8s

PAST, FUTURE = "2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z"


def plugin(tmp_path: Path, answers: list[tuple[str, str]] | None, fail: str = "") -> Path:
    """A plugin whose n-th run answers `answers[n]` (token, expiry; the last one repeats), or
    fails with `fail` on stderr; every run appends a line to `runs`."""
    path, runs = tmp_path / "get-token", tmp_path / "runs"
    path.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"with open({str(runs)!r}, 'a') as f: f.write('run\\n')\n"
        f"n = len(open({str(runs)!r}).readlines())\n"
        f"if {fail!r}: sys.exit(print({fail!r}, file=sys.stderr) or 1)\n"
        f"token, expiry = {answers!r}[min(n, {len(answers or [0])}) - 1]\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "    'status': {'token': token, 'expirationTimestamp': expiry}}))\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def runs(tmp_path: Path) -> int:
    return (tmp_path / "runs").read_text().count("run")


def exec_kubeconfig(tmp_path: Path, admin_kubeconfig: str, command: Path) -> Path:
    """The admin kubeconfig's cluster with two users: `exec` (current, the plugin) and
    `broken` (a plugin that does not exist)."""
    admin: dict[str, Any] = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]
    exec_user = {"apiVersion": V1, "command": str(command), "interactiveMode": "Never"}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [
            {"name": "exec", "user": {"exec": exec_user}},
            {"name": "broken", "user": {"exec": {**exec_user, "command": "/nonexistent"}}},
        ],
        "contexts": [
            {"name": "via-exec", "context": {"cluster": cluster["name"], "user": "exec"}},
            {"name": "via-broken", "context": {"cluster": cluster["name"], "user": "broken"}},
        ],
        "current-context": "via-broken",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def admin_token(admin_kubeconfig: str) -> str:
    doc = yaml.safe_load(Path(admin_kubeconfig).read_text())
    token: str = doc["users"][0]["user"]["token"]
    return token


async def status(
    space: Space, kubeconfig: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "akri_trio", "status", "-n", space.name, "-o", "json",
            "--kubeconfig", str(kubeconfig), *args]  # fmt: skip
    with trio.fail_after(60):
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, check=False,
            env={"PATH": "/usr/bin:/bin", **(env or {})},
        )  # fmt: skip
    return subprocess.CompletedProcess(
        argv, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


async def test_status_through_an_exec_plugin_refreshes_after_expiry(
    space: Space, tmp_path: Path
) -> None:
    token = admin_token(space.kubeconfig)
    # First answer already expired, second good for a century: the second request re-runs the
    # plugin, every later one reuses its answer.
    command = plugin(tmp_path, [(token, PAST), (token, FUTURE)])
    done = await status(
        space, exec_kubeconfig(tmp_path, space.kubeconfig, command), "--context", "via-exec"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["configurations"] == []
    assert runs(tmp_path) == 2


async def test_a_refused_token_reruns_the_plugin_once(space: Space, tmp_path: Path) -> None:
    token = admin_token(space.kubeconfig)
    command = plugin(tmp_path, [("revoked", FUTURE), (token, FUTURE)])
    kubeconfig = exec_kubeconfig(tmp_path, space.kubeconfig, command)
    done = await status(
        space, kubeconfig, env={"AKRI_KUBECONTEXT": "via-exec"}
    )  # the flag's env var
    assert done.returncode == 0, done.stderr
    assert runs(tmp_path) == 2  # the 401 re-ran it, and its answer held from then on


async def test_a_failing_plugin_is_one_error_line(space: Space, tmp_path: Path) -> None:
    command = plugin(tmp_path, None, fail="cannot reach the token endpoint")
    kubeconfig = exec_kubeconfig(tmp_path, space.kubeconfig, command)
    done = await status(space, kubeconfig, "--context", "via-exec")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"akri-trio status: kubeconfig: user 'exec': exec plugin '{command}' failed "
        "with exit status 1: cannot reach the token endpoint"
    )
    assert runs(tmp_path) == 1
    done = await status(space, kubeconfig)  # the current context: a plugin that is not there
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "user 'broken': exec plugin '/nonexistent' cannot run: No such file" in line
