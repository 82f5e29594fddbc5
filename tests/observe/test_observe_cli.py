"""The command line: --version, and a one-line error instead of a traceback."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from akri_trio.cli import main
from akri_trio.observe.cli import status_main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"akri-trio {importlib.metadata.version('akri-trio')}\n"


def test_status_without_a_kubeconfig_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert status_main(["--kubeconfig", "/nonexistent/kubeconfig"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("akri-trio status: ") and err.count("\n") == 1
    assert "hint: --kubeconfig" in err


def problem(exc: BaseException) -> str | None:
    from akri_trio.cli import _user_problem

    return _user_problem(exc)


def test_missing_crds_forbidden_and_unreachable_are_one_line_hints() -> None:
    import json

    import httpx

    from akri_trio.kube.errors import error_from_response

    missing_type = error_from_response(404, b"404 page not found\n")
    assert "hint: the akri.sh CRDs are not installed" in (problem(missing_type) or "")
    missing_object = error_from_response(
        404,
        json.dumps(
            {
                "kind": "Status",
                "reason": "NotFound",
                "message": "x not found",
                "details": {"name": "x"},
            }
        ),
    )
    assert problem(missing_object) is None  # a real bug somewhere: keep its traceback
    forbidden = error_from_response(
        403,
        json.dumps(
            {
                "kind": "Status",
                "reason": "Forbidden",
                "message": 'configurations.akri.sh is forbidden: User "u" cannot list resource',
            }
        ),
    )
    text = problem(ExceptionGroup("nursery", [forbidden]))
    assert text is not None and text.startswith("configurations.akri.sh is forbidden")
    assert "hint: RBAC forbids it" in text and "auth can-i" in text and "\n" not in text
    unreachable = problem(httpx.ConnectError("[Errno 111] Connection refused"))
    assert unreachable is not None and "cannot reach the API server" in unreachable
    assert problem(ExceptionGroup("two", [forbidden, ValueError()])) is None
    assert problem(ValueError("bug")) is None


def test_status_against_an_unreachable_server_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    assert main(["status", "--kubeconfig", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("akri-trio status: error: cannot reach the API server")
    assert err.count("\n") == 1
