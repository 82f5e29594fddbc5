"""kubeconfig `exec` credential plugins: the section and answer parsing (pure), the refresh
decision, and real plugin programs run by `ExecAuth` (failures, hangs, floods, refresh)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.kube.config import ConfigError, KubeConfig, http_auth, parse_kubeconfig
from akri_trio.kube.exec_auth import EXEC_OUTPUT_LIMIT, ExecAuth
from akri_trio.kube.exec_credential import (
    V1,
    V1BETA1,
    Credential,
    ExecPlugin,
    exec_info,
    parse_exec_output,
    parse_exec_section,
    refresh_due,
)

PLUGIN = ExecPlugin(user="u", command="get-token", api_version=V1)


def doc_with_user(user: dict[str, Any]) -> dict[str, Any]:
    return {
        "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://k"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }


def test_an_exec_user_parses_into_a_plugin() -> None:
    section = {
        "apiVersion": V1,
        "command": "aws",
        "args": ["eks", "get-token", "--cluster-name", "edge"],
        "env": [{"name": "AWS_PROFILE", "value": "ops"}],
        "interactiveMode": "Never",
        "provideClusterInfo": True,
        "installHint": "install the aws CLI\nsee the docs",
    }
    cfg = parse_kubeconfig(doc_with_user({"exec": section}), base_dir=Path("/"))
    assert cfg.exec_plugin == ExecPlugin(
        user="u",
        command="aws",
        api_version=V1,
        args=("eks", "get-token", "--cluster-name", "edge"),
        env=(("AWS_PROFILE", "ops"),),
        provide_cluster_info=True,
        install_hint="install the aws CLI\nsee the docs",
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"apiVersion": V1, "interactiveMode": "Never"}, "command is required"),
        (
            {"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"},
            "v1alpha1' is not supported",
        ),
        ({"command": "x", "apiVersion": V1}, "interactiveMode is required"),
        ({"command": "x", "apiVersion": V1BETA1, "interactiveMode": "Always"}, "needs a terminal"),
        ({"command": "x", "apiVersion": V1BETA1, "interactiveMode": "Sometimes"}, "Sometimes"),
        ({"command": "x", "apiVersion": V1BETA1, "args": "-v"}, "args must be a list"),
        ({"command": "x", "apiVersion": V1BETA1, "env": [{"name": "A"}]}, "env entries"),
        ("aws", "must be a mapping"),
    ],
)
def test_bad_exec_sections_are_one_line_errors(section: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_exec_section(section, "u")
    assert "\n" not in str(err.value)


def test_v1beta1_without_interactive_mode_is_fine() -> None:
    plugin = parse_exec_section({"command": "x", "apiVersion": V1BETA1}, "u")
    assert plugin.api_version == V1BETA1


def test_auth_provider_is_refused_naming_exec() -> None:
    doc = doc_with_user({"auth-provider": {"name": "gcp", "config": {}}})
    with pytest.raises(ConfigError) as err:
        parse_kubeconfig(doc, base_dir=Path("/"))
    assert str(err.value) == (
        "kubeconfig: user 'u': auth-provider 'gcp' is not supported (removed from kubectl); "
        "use an exec credential plugin (users[].user.exec) instead"
    )


def test_a_relative_exec_command_resolves_against_its_kubeconfig(tmp_path: Path) -> None:
    from akri_trio.kube.config import load_kubeconfig

    exec_section = {"apiVersion": V1BETA1, "command": "bin/get-token"}
    bare = {"apiVersion": V1BETA1, "command": "get-token"}
    for section, expected in ((exec_section, str(tmp_path / "bin/get-token")), (bare, "get-token")):
        (tmp_path / "config").write_text(json.dumps(doc_with_user({"exec": section})))
        plugin = load_kubeconfig([tmp_path / "config"]).exec_plugin
        assert plugin is not None and plugin.command == expected


def answer(status: dict[str, Any], api_version: str = V1) -> bytes:
    doc = {"apiVersion": api_version, "kind": "ExecCredential", "status": status}
    return json.dumps(doc).encode()


def test_a_token_answer_with_expiry() -> None:
    cred = parse_exec_output(
        answer({"token": "t0k", "expirationTimestamp": "2030-01-01T00:00:00Z"}), PLUGIN, now=5.0
    )
    assert (cred.token, cred.obtained_at, cred.expires_at) == ("t0k", 5.0, 1893456000.0)


def test_a_client_certificate_answer() -> None:
    cred = parse_exec_output(
        answer({"clientCertificateData": "CERT", "clientKeyData": "KEY"}), PLUGIN, now=0
    )
    assert (cred.token, cred.client_cert_pem, cred.client_key_pem) == (None, b"CERT", b"KEY")
    assert cred.expires_at is None


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (b"Please log in", "printed no JSON"),
        (b'{"kind": "Status"}', "not an ExecCredential"),
        (answer({"token": "t"}, V1BETA1), "answered apiVersion .*v1beta1"),
        (json.dumps({"apiVersion": V1, "kind": "ExecCredential"}).encode(), "no status"),
        (answer({}), "neither status.token nor a client certificate"),
        (answer({"token": 7}), "not a string"),
        (answer({"clientCertificateData": "C"}), "together"),
        (answer({"token": "t", "expirationTimestamp": "tomorrow"}), "not RFC 3339"),
        (answer({"token": "t", "expirationTimestamp": "2030-01-01T00:00:00"}), "not RFC 3339"),
    ],
)
def test_bad_answers_are_one_line_errors_naming_the_plugin(out: bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_exec_output(out, PLUGIN, now=0)
    assert "user 'u': exec plugin 'get-token'" in str(err.value)
    assert "\n" not in str(err.value)


@given(
    obtained=st.floats(0, 1e9),
    life=st.floats(0, 1e5),
    at=st.floats(0, 1e9 + 2e5),
)
def test_refresh_is_due_before_expiry_and_never_long_before(
    obtained: float, life: float, at: float
) -> None:
    cred = Credential(token="t", obtained_at=obtained, expires_at=obtained + life)
    due = refresh_due(cred, at)
    if at >= obtained + life:
        assert due  # never sent expired
    if at < obtained + life - 30 or at < obtained + life / 2:
        assert not due  # at most 30 s early, and never in the first half of its life
    assert not refresh_due(Credential(token="t", obtained_at=obtained), at)  # no expiry
    assert refresh_due(None, at)


def test_exec_info_carries_cluster_info_only_when_asked() -> None:
    plain = exec_info(PLUGIN, server="https://k", ca_pem=b"CA", insecure=False)
    assert plain == {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}
    asked = ExecPlugin(user="u", command="c", api_version=V1, provide_cluster_info=True)
    info = exec_info(asked, server="https://k", ca_pem=b"CA", insecure=False)
    assert info["spec"]["cluster"] == {"server": "https://k", "certificate-authority-data": "Q0E="}


# --- real plugin programs --------------------------------------------------------------------


def script(tmp_path: Path, body: str) -> Path:
    """An executable Python plugin; it appends a line to `runs` each time it is started."""
    path = tmp_path / "plugin"
    runs = tmp_path / "runs"
    path.write_text(
        f"#!{sys.executable}\nimport json, os, sys, time\n"
        f"open({str(runs)!r}, 'a').write('run\\n')\n"
        f"n = len(open({str(runs)!r}).readlines())\n{body}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def auth_for(path: Path, clock: Any = None, **plugin: Any) -> ExecAuth:
    section = {"apiVersion": V1, "command": str(path), "interactiveMode": "Never", **plugin}
    cfg = KubeConfig(server="https://k", exec_plugin=parse_exec_section(section, "u"))
    auth = http_auth(cfg)
    assert isinstance(auth, ExecAuth)
    if clock is not None:
        auth._clock = clock
    return auth


PRINT_TOKEN = """
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["spec"] == {"interactive": False}, info
assert sys.stdin.read() == ""  # stdin is closed: nobody to ask
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": {
    "token": f"token-{n}-{os.environ['EXTRA']}", "expirationTimestamp": "2030-01-01T00:00:00Z"}}))
"""


async def test_the_plugin_runs_once_until_its_credential_is_due(tmp_path: Path) -> None:
    now = [1893456000.0 - 3600]  # an hour before the token expires
    auth = auth_for(
        script(tmp_path, PRINT_TOKEN), clock=lambda: now[0], env=[{"name": "EXTRA", "value": "x"}]
    )
    first = await auth.credential()
    assert first.token == "token-1-x"
    assert (await auth.credential()) is first and auth.runs == 1
    now[0] += 3600 - 10  # ten seconds left: refreshed before it expires
    assert (await auth.credential()).token == "token-2-x"
    assert (await auth.credential(stale=await auth.credential())).token == "token-3-x"  # a 401


async def test_concurrent_requests_share_one_run(tmp_path: Path) -> None:
    auth = auth_for(script(tmp_path, PRINT_TOKEN), env=[{"name": "EXTRA", "value": "y"}])
    tokens: list[str | None] = []

    async def one() -> None:
        tokens.append((await auth.credential()).token)

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(one)
    assert tokens == ["token-1-y"] * 5
    assert (tmp_path / "runs").read_text().count("run") == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("print('token endpoint unreachable', file=sys.stderr); sys.exit(3)",
         "failed with exit status 3: token endpoint unreachable$"),
        ("print('not json')", "printed no JSON ExecCredential$"),
        ("sys.stdout.write('x' * (2 << 20)); sys.stdout.flush(); time.sleep(60)",
         f"printed more than {EXEC_OUTPUT_LIMIT} bytes$"),
    ],
)  # fmt: skip
async def test_a_failing_plugin_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    auth = auth_for(script(tmp_path, body))
    with pytest.raises(ConfigError, match=message) as err:
        await auth.credential()
    assert str(err.value).startswith(f"kubeconfig: user 'u': exec plugin '{tmp_path}/plugin' ")
    assert "\n" not in str(err.value)


async def test_a_hung_plugin_times_out_and_is_killed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    auth = auth_for(script(tmp_path, "time.sleep(3600)"))
    with pytest.raises(ConfigError, match=r"did not answer within 60 s$"):
        await auth.credential()


async def test_a_missing_plugin_names_its_install_hint(tmp_path: Path) -> None:
    auth = auth_for(tmp_path / "nope", installHint="brew install kubelogin\nmore text")
    with pytest.raises(ConfigError, match=r"cannot run: .* \(brew install kubelogin\)$"):
        await auth.credential()
