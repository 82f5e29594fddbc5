"""The chart's `agent.allowHostDevices` reaches the agent as AKRI_ALLOW_HOST_DEVICES, and the
agent's own parser accepts what the chart renders."""

from __future__ import annotations

from akri_trio.agent.cli import parse_args
from tests.support.chart import env_of, one, pod_spec, render


def test_allow_host_devices_reaches_the_agent() -> None:
    values = {"agent": {"allowHostDevices": ["storage-ops:block", "*:console"]}}
    (agent,) = pod_spec(one(render(values), "DaemonSet", "akri-agent-daemonset"))["containers"]
    env = env_of(agent)
    assert env["AKRI_ALLOW_HOST_DEVICES"] == "storage-ops:block,*:console"
    plain = {k: v for k, v in env.items() if isinstance(v, str)}  # not the valueFrom ones
    settings = parse_args([], {**plain, "AGENT_NODE_NAME": "n"})
    assert settings.limits.devices.host_allowances == {
        "storage-ops": frozenset({"block"}),
        "*": frozenset({"console"}),
    }
    (default,) = pod_spec(one(render(), "DaemonSet", "akri-agent-daemonset"))["containers"]
    assert "AKRI_ALLOW_HOST_DEVICES" not in env_of(default)
