"""`akri-trio agent` flags and their upstream environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from akri_trio.agent.cli import parse_args
from akri_trio.model.limits import (
    MAX_CAPACITY,
    MAX_DEVICES_PER_CONFIGURATION,
    MAX_DEVICES_PER_HANDLER,
)

REPO = Path(__file__).resolve().parents[2]


def test_embedded_debug_echo_honours_the_availability_env_var_like_the_standalone_one() -> None:
    env = {"AGENT_NODE_NAME": "n1", "DEBUG_ECHO_AVAILABILITY_PATH": "/run/n1-availability"}
    assert parse_args([], env).debug_echo_availability == Path("/run/n1-availability")
    flag = ["--debug-echo-availability", "/x"]
    assert parse_args(flag, env).debug_echo_availability == Path("/x")  # the flag wins
    assert parse_args([], {"AGENT_NODE_NAME": "n1"}).debug_echo_availability is None


def test_limits_and_least_privilege_flags() -> None:
    env = {"AGENT_NODE_NAME": "n1"}
    default = parse_args([], env)
    assert default.limits.max_capacity == MAX_CAPACITY
    assert default.limits.devices.max_devices == MAX_DEVICES_PER_HANDLER
    assert default.limits.devices.max_configuration_devices == MAX_DEVICES_PER_CONFIGURATION
    assert default.limits.devices.refused_host_dirs == (
        "/var/lib/kubelet",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
    )
    assert (default.metrics_host, default.handler_group, default.enable_debug_echo) == (
        "0.0.0.0",
        None,
        False,
    )
    flags = [
        "--max-capacity", "8",
        "--max-devices-per-handler", "3",
        "--max-devices-per-configuration", "5",
        "--metrics-host", "127.0.0.1",
        "--handler-group", "65532",
        "--configuration-selector", "team=a",
        "--device-plugin-dir", "/k/dp",
    ]  # fmt: skip
    given = parse_args(flags, env)
    assert given.limits.max_capacity == 8
    assert given.limits.devices.max_devices == 3
    assert given.limits.devices.max_configuration_devices == 5
    assert "/k/dp" in given.limits.devices.refused_host_dirs
    assert (given.metrics_host, given.handler_group, given.configuration_selector) == (
        "127.0.0.1",
        65532,
        "team=a",
    )
    from_env = parse_args([], {**env, "METRICS_HOST": "::1", "AKRI_HANDLER_GROUP": "7"})
    assert (from_env.metrics_host, from_env.handler_group) == ("::1", 7)


def test_a_limit_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--max-capacity", "0"], {"AGENT_NODE_NAME": "n1"})
    assert exit_.value.code == 2
    assert "--max-capacity must be at least 1" in capsys.readouterr().err


def test_the_crd_maximum_is_the_agents_and_the_webhooks_capacity_limit() -> None:
    crd = yaml.safe_load((REPO / "k8s" / "crds" / "configuration.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["capacity"]["maximum"] == MAX_CAPACITY


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
