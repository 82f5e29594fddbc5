"""`akri-trio discovery-handler` argument handling (the serving itself is in test_discovery_e2e)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from akri_trio.discovery.cli import POD_IP_PORT, _host_port, build_parser, main, serving_endpoint
from akri_trio.discovery.handlers import BUILTIN


def test_host_port() -> None:
    assert _host_port("0.0.0.0:10000") == ("0.0.0.0", 10000)
    assert _host_port("[::1]:0") == ("::1", 0)
    for bad in ("nohost", ":1", "h:x", "h:70000"):
        with pytest.raises(argparse.ArgumentTypeError):
            _host_port(bad)


def test_socket_and_network_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["debugEcho", "--socket", "/x.sock", "--network", "h:1"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_unknown_handler_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["nope"], env={})
    assert info.value.code == 2
    known = ", ".join(sorted(BUILTIN))
    assert f"unknown discovery handler 'nope' (known: {known})" in capsys.readouterr().err


def test_serving_endpoint_flags_then_pod_ip_then_socket() -> None:
    default = Path("/var/lib/akri/debugEcho.sock")
    given = Path("/x.sock")
    # flags win over POD_IP
    assert serving_endpoint(given, None, None, "10.1.2.3", default) == (given, None, None)
    assert serving_endpoint(None, ("0.0.0.0", 9), "h", "10.1.2.3", default) == (
        None,
        ("0.0.0.0", 9),
        "h",
    )
    # POD_IP: upstream's network registration on port 10000
    assert serving_endpoint(None, None, None, "10.1.2.3", default) == (
        None,
        ("10.1.2.3", POD_IP_PORT),
        None,
    )
    assert POD_IP_PORT == 10000
    # neither: the socket beside the agent's
    assert serving_endpoint(None, None, None, "", default) == (default, None, None)
