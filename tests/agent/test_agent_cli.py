"""`akri-trio agent` flags and their upstream environment variables."""

from __future__ import annotations

from pathlib import Path

from akri_trio.agent.cli import parse_args


def test_embedded_debug_echo_honours_the_availability_env_var_like_the_standalone_one() -> None:
    env = {"AGENT_NODE_NAME": "n1", "DEBUG_ECHO_AVAILABILITY_PATH": "/run/n1-availability"}
    assert parse_args([], env).debug_echo_availability == Path("/run/n1-availability")
    flag = ["--debug-echo-availability", "/x"]
    assert parse_args(flag, env).debug_echo_availability == Path("/x")  # the flag wins
    assert parse_args([], {"AGENT_NODE_NAME": "n1"}).debug_echo_availability is None
