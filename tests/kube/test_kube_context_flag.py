"""`--context` reaches the kubeconfig loader of every command that takes `--kubeconfig`: each
command, run for real, names the context it was given when the kubeconfig lacks it (before it
contacts anything), and AKRI_KUBECONTEXT does the same as the flag."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from akri_trio.webhook.certs import serving_certs

COMMANDS = {
    "agent": ["agent", "--node-name", "n", "--metrics-port", "-1"],
    "controller": ["controller", "--metrics-port", "-1"],
    "status": ["status"],
    "dashboard": ["dashboard"],
    "teardown": ["teardown"],
    "webhook": ["webhook"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("context")
    doc = {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "here",
    }
    (d / "kubeconfig").write_text(yaml.safe_dump(doc))
    made = serving_certs("akri-webhook", "akri", dt.datetime.now(dt.UTC))
    (d / "tls.crt").write_bytes(made.cert_pem)
    (d / "tls.key").write_bytes(made.key_pem)
    return {"kubeconfig": d / "kubeconfig", "crt": d / "tls.crt", "key": d / "tls.key", "dir": d}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("via", ["flag", "env"])
def test_every_command_uses_the_context_it_is_given(
    command: str, via: str, files: dict[str, Path]
) -> None:
    argv = [*COMMANDS[command], "--kubeconfig", str(files["kubeconfig"])]
    if command == "agent":
        argv += ["--discovery-handlers-directory", str(files["dir"])]
    if command == "webhook":
        argv += ["--tls-cert-file", str(files["crt"]), "--tls-key-file", str(files["key"])]
    env = {"PATH": "/usr/bin:/bin"}
    if via == "flag":
        argv += ["--context", "elsewhere"]
    else:
        env["AKRI_KUBECONTEXT"] = "elsewhere"
    done = subprocess.run(
        [sys.executable, "-m", "akri_trio", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "kubeconfig: context 'elsewhere' not found" in line
