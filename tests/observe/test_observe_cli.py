"""The command line: --version, and a one-line error instead of a traceback."""

from __future__ import annotations

import importlib.metadata

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
