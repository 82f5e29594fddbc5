"""`akri-trio agent` flags and their upstream environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from akri_trio.agent.cli import parse_args


def test_embedded_debug_echo_honours_the_availability_env_var_like_the_standalone_one() -> None:
    env = {"AGENT_NODE_NAME": "n1", "DEBUG_ECHO_AVAILABILITY_PATH": "/run/n1-availability"}
    assert parse_args([], env).debug_echo_availability == Path("/run/n1-availability")
    flag = ["--debug-echo-availability", "/x"]
    assert parse_args(flag, env).debug_echo_availability == Path("/x")  # the flag wins
    assert parse_args([], {"AGENT_NODE_NAME": "n1"}).debug_echo_availability is None


def test_allocation_mode_and_the_dra_paths() -> None:
    env = {"AGENT_NODE_NAME": "n1"}
    default = parse_args([], env)
    assert default.allocation == "device-plugin"
    assert default.kubelet_root_dir == Path("/var/lib/kubelet")
    assert default.cdi_dir == Path("/var/run/cdi")
    flags = ["--allocation", "dra", "--kubelet-root-dir", "/k", "--cdi-dir", "/c"]
    dra = parse_args(flags, env)
    assert (dra.allocation, dra.kubelet_root_dir, dra.cdi_dir) == ("dra", Path("/k"), Path("/c"))
    with pytest.raises(SystemExit):
        parse_args(["--allocation", "classic"], env)
