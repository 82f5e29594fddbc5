"""`akri-trio webhook certs` and the server command's start-up checks (akri_trio.webhook.cli)."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from akri_trio.webhook.cli import CERTS_FILES, main, parse_serve_args
from akri_trio.webhook.server import IDLE_TIMEOUT, MAX_CONNECTIONS


def run_certs(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    argv = ["certs", "--service", "akri-webhook", "--namespace", "akri", "--out", str(tmp_path)]
    assert main([*argv, *extra]) == 0
    return capsys.readouterr().out


def test_certs_writes_the_files_and_prints_the_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_certs(tmp_path, capsys, "--ip", "127.0.0.1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(CERTS_FILES)
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
    assert out == (tmp_path / "validatingwebhookconfiguration.yaml").read_text()
    config = yaml.safe_load(out)
    (hook,) = config["webhooks"]
    assert (hook["failurePolicy"], hook["sideEffects"]) == ("Fail", "None")
    assert hook["clientConfig"]["service"] == {
        "name": "akri-webhook",
        "namespace": "akri",
        "path": "/validate",
        "port": 443,
    }
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem
    leaf = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "akri-webhook.akri.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_certs_by_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_certs(tmp_path, capsys, "--url", "https://10.1.2.3:8443/validate")
    client = yaml.safe_load(out)["webhooks"][0]["clientConfig"]
    assert client["url"] == "https://10.1.2.3:8443/validate"
    assert "service" not in client


def test_certs_rewritten_key_stays_private(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tls.key").write_text("old")
    (tmp_path / "tls.key").chmod(0o644)
    run_certs(tmp_path, capsys)
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
    assert (tmp_path / "tls.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


def test_serve_fails_at_once_on_a_missing_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.crt"
    code = main(["--tls-cert-file", str(missing), "--tls-key-file", str(missing)])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("akri-trio webhook: ")
    assert "No such file or directory" in err


def test_certs_days_sets_the_validity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_certs(tmp_path, capsys, "--days", "30")
    leaf = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days == 30
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days == 300  # ten times as long


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give --tls-cert-file and --tls-key-file, or --tls-secret"),
        (["--tls-secret", "s", "--tls-cert-file", "c"], "exclude each other"),
        (["--tls-secret", "s", "--namespace", "ns", "--manage-certs"], "--manage-certs needs"),
        (["--tls-secret", "s", "--namespace", "ns", "--cert-days", "0"], "must be positive"),
    ],
)
def test_serve_refuses_an_incomplete_certificate_source(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_connection_limits_are_flags_with_the_servers_defaults() -> None:
    base = ["--tls-cert-file", "c", "--tls-key-file", "k"]
    default = parse_serve_args(base)
    assert (default.idle_timeout, default.max_connections) == (IDLE_TIMEOUT, MAX_CONNECTIONS)
    given = parse_serve_args([*base, "--idle-timeout", "2.5", "--max-connections", "7"])
    assert (given.idle_timeout, given.max_connections) == (2.5, 7)
