"""`akri-trio agent` flags and their upstream environment variables."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml

from akri_trio.agent.cli import parse_args
from akri_trio.discovery.device_rules import check_devices
from akri_trio.model.device import Device, DeviceSpec, Mount
from akri_trio.model.limits import (
    MAX_CAPACITY,
    MAX_DEVICES_PER_CONFIGURATION,
    MAX_DEVICES_PER_HANDLER,
)
from akri_trio.rpc.uds import IDLE_TIMEOUT_S, MAX_CONCURRENT_STREAMS, ServerLimits

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
        "/var/run/cdi",
        "/var/lib/akri",
    )
    assert default.limits.devices.mount_dirs == ()
    assert (default.metrics_host, default.handler_group, default.enable_debug_echo) == (
        "0.0.0.0",
        None,
        False,
    )
    flags = [
        "--max-capacity", "8",
        "--max-devices-per-handler", "3",
        "--max-devices-per-configuration", "5",
        "--max-properties-per-device", "6",
        "--max-device-bytes", "1000",
        "--metrics-max-connections", "9",
        "--event-loop-lag-threshold", "0.5",
        "--metrics-host", "127.0.0.1",
        "--handler-group", "65532",
        "--configuration-selector", "team=a",
        "--device-plugin-dir", "/k/dp",
    ]  # fmt: skip
    given = parse_args(flags, env)
    assert given.limits.max_capacity == 8
    assert given.limits.devices.max_devices == 3
    assert given.limits.devices.max_configuration_devices == 5
    assert (given.limits.devices.max_properties, given.limits.devices.max_device_bytes) == (6, 1000)
    assert (given.metrics_max_connections, default.metrics_max_connections) == (9, 64)
    assert (given.lag_threshold, default.lag_threshold) == (0.5, 5.0)
    assert (default.limits.devices.max_properties, default.limits.devices.max_device_bytes) == (
        256,
        65536,
    )
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


def test_the_grpc_flags_are_the_limits_the_agent_hands_its_servers() -> None:
    env = {"AGENT_NODE_NAME": "n1"}
    assert parse_args([], env).grpc == ServerLimits(IDLE_TIMEOUT_S, MAX_CONCURRENT_STREAMS)
    flags = ["--grpc-idle-timeout", "30", "--grpc-max-streams", "8"]
    assert parse_args(flags, env).grpc == ServerLimits(idle_timeout=30.0, max_streams=8)
    from_env = parse_args([], {**env, "AKRI_GRPC_MAX_STREAMS": "16"})
    assert from_env.grpc == ServerLimits(IDLE_TIMEOUT_S, 16)


@pytest.mark.parametrize("kind", ["configuration", "instance"])
def test_the_crd_maximum_is_the_agents_and_the_webhooks_capacity_limit(kind: str) -> None:
    crd = yaml.safe_load((REPO / "k8s" / "crds" / f"{kind}.yaml").read_text())
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


def test_every_path_the_agent_is_given_is_refused_to_handlers() -> None:
    """A non-default kubelet root, CDI, handlers or brokerInfo directory is refused as a
    handler's mount or device node, not only the defaults."""
    given = {
        "--kubelet-root-dir": "/data/kubelet",
        "--device-plugin-dir": "/data/dp",
        "--pod-resources-socket": "/data/pr/kubelet.sock",
        "--cdi-dir": "/data/cdi",
        "--discovery-handlers-directory": "/data/akri/",
        "--broker-info-dir": "/data/broker-info",
    }
    flags = [arg for pair in given.items() for arg in pair] + ["--handler-mount-dir", "/srv"]
    rules = parse_args(flags, {"AGENT_NODE_NAME": "n1"}).limits.devices
    assert rules.mount_dirs == ("/srv",)
    rules = attrs.evolve(rules, mount_dirs=("/",))  # only the refusals decide
    for path in given.values():
        path = path.rstrip("/")
        devices = [
            Device("mount", mounts=(Mount("/m", path),)),
            Device("inside", mounts=(Mount("/m", f"{path}/x"),)),
            Device("node", device_specs=(DeviceSpec("/dev/x", path),)),
        ]
        kept, problems = check_devices(
            [*devices, Device("fine", mounts=(Mount("/m", "/data/ok"),))], rules
        )
        assert [d.id for d in kept] == ["fine"]
        assert all(f"would give the container {path}" in p for p in problems), problems


@pytest.mark.parametrize("directory", ["/", "/var", "/var/lib/akri/x", "/proc/1/root", "srv"])
def test_a_mount_directory_that_holds_the_node_keys_is_a_usage_error(
    directory: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--handler-mount-dir", directory], {"AGENT_NODE_NAME": "n1"})
    assert exit_.value.code == 2
    assert f"--handler-mount-dir {directory!r}" in capsys.readouterr().err


def test_mount_directories_from_the_environment() -> None:
    env = {"AGENT_NODE_NAME": "n1", "AKRI_HANDLER_MOUNT_DIRS": "/srv/a,/srv/b"}
    assert parse_args([], env).limits.devices.mount_dirs == ("/srv/a", "/srv/b")


def test_every_periodic_wake_up_is_a_flag_with_an_idle_default() -> None:
    env = {"AGENT_NODE_NAME": "n1"}
    default = parse_args([], env)
    # one wake-up every 2 s at most while nothing changes
    assert (default.lag_period, default.kubelet_poll_period) == (2.0, 2.0)
    assert (default.debug_echo_poll_period, default.reclaim_period) == (2.0, 10.0)
    given = parse_args(
        [
            "--event-loop-lag-period", "0.1",
            "--kubelet-poll-period", "0.2",
            "--debug-echo-poll-period", "0.3",
        ],
        env,
    )  # fmt: skip
    assert (given.lag_period, given.kubelet_poll_period, given.debug_echo_poll_period) == (
        0.1,
        0.2,
        0.3,
    )
    from_env = parse_args(
        [], {**env, "AKRI_KUBELET_POLL_PERIOD": "5", "DEBUG_ECHO_POLL_PERIOD": "3"}
    )
    assert (from_env.kubelet_poll_period, from_env.debug_echo_poll_period) == (5.0, 3.0)
    for flag in ("--event-loop-lag-period", "--kubelet-poll-period", "--debug-echo-poll-period"):
        with pytest.raises(SystemExit):
            parse_args([flag, "0"], env)
