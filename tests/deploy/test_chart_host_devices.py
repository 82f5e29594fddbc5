"""The chart's `agent.allowHostDevices` reaches the agent as AKRI_ALLOW_HOST_DEVICES and
`webhookConfiguration.handlerNamespaces` the webhook as AKRI_HANDLER_NAMESPACES, and each
command's own parser accepts what the chart renders."""

from __future__ import annotations

import pytest

from akri_trio.agent.cli import parse_args
from akri_trio.webhook.cli import parse_serve_args
from akri_trio.webhook.validate import parse_handler_namespaces
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


def test_handler_namespaces_reach_the_webhook(monkeypatch: pytest.MonkeyPatch) -> None:
    """`webhookConfiguration.handlerNamespaces` becomes AKRI_HANDLER_NAMESPACES, which the
    webhook's own parser reads as its --handler-namespace list."""
    values = {"webhookConfiguration": {"handlerNamespaces": ["udev:device-ops", "udev:lab"]}}
    deployment = one(render(values), "Deployment", "akri-webhook-configuration")
    (webhook,) = pod_spec(deployment)["containers"]
    assert env_of(webhook)["AKRI_HANDLER_NAMESPACES"] == "udev:device-ops,udev:lab"
    monkeypatch.setenv("AKRI_HANDLER_NAMESPACES", "udev:device-ops,udev:lab")
    args = parse_serve_args(["--tls-cert-file", "c", "--tls-key-file", "k"])
    assert args.handler_namespaces == parse_handler_namespaces(["udev:device-ops", "udev:lab"])
    default = one(render(), "Deployment", "akri-webhook-configuration")
    assert "AKRI_HANDLER_NAMESPACES" not in env_of(pod_spec(default)["containers"][0])
