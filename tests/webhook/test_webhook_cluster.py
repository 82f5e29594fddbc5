"""The webhook end to end: a real `akri-trio webhook` process, registered with the real API
server (by loopback URL, with the caBundle `webhook certs` made), refuses bad Configurations
that `kubectl apply` sends, with its message naming the field, and admits good ones.

Where the CRD's own schema already refuses a mistake (capacity below 1, both broker kinds) the
API server answers before any validating webhook is called; those cases check that the refusal
names the field, whichever layer gives it.

One webhook process and registration serve the whole module; the registration selects only
this module's namespace (by a label carrying a random token), so it never judges anybody
else's Configurations, and it is deleted at the end, also after a failure.
"""

from __future__ import annotations

import contextlib
import copy
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

from akri_trio.kube import Client, NotFound, load_config
from akri_trio.model.resources import CONFIGURATIONS
from tests.support.akri_cluster import NAMESPACES, install_crds
from tests.support.polling import until
from tests.webhook import live

pytestmark = pytest.mark.k8s

LABEL = "akri-trio.test/webhook"
EXAMPLE = Path(__file__).parents[2] / "k8s" / "examples" / "debug-echo.yaml"


@attrs.frozen
class Webhook:
    namespace: str  # labelled: the webhook judges Configurations here
    unjudged: str  # not labelled: the webhook never sees these
    hook_name: str
    kubectl: str
    kubeconfig: str
    port: int = 0  # where the webhook process listens
    ca_pem: bytes = b""  # the CA its serving certificate is signed by

    def apply(self, obj: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.kubectl, "apply", *flags, "-f", "-"],
            input=yaml.safe_dump(obj),
            env={**os.environ, "KUBECONFIG": self.kubeconfig},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def refused(self, obj: dict[str, Any]) -> str:
        """kubectl's error for an apply that must fail."""
        done = self.apply(obj)
        assert done.returncode != 0, f"admitted: {done.stdout}"
        return done.stderr

    def refused_by_webhook(self, obj: dict[str, Any]) -> str:
        stderr = self.refused(obj)
        assert f'admission webhook "{self.hook_name}" denied the request' in stderr, stderr
        return stderr


def configuration(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": "descriptions: [a]\n"},
            "capacity": 1,
            **spec,
        },
    }


def refused_only_by_the_webhook(namespace: str, name: str) -> dict[str, Any]:
    """A Configuration the CRD's schema admits and the webhook refuses: it reads a Secret of
    another namespace."""
    config = configuration(namespace, name)
    ref = {"name": "admin", "key": "pw", "namespace": "kube-system"}
    config["spec"]["discoveryHandler"]["discoveryProperties"] = [
        {"name": "password", "valueFrom": {"secretKeyRef": ref}}
    ]
    return config


def pod_spec(**container: Any) -> dict[str, Any]:
    return {"containers": [{"name": "broker", "image": "nginx:stable-alpine", **container}]}


async def _namespace(api: Client, name: str, labels: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    await api.apply(NAMESPACES, body, field_manager="akri-trio-tests")


async def _register(
    cluster: dict[str, str], hook: Webhook, token: str, registration: dict[str, Any]
) -> None:
    async with Client.open(load_config(cluster["KUBECONFIG"])) as api:
        await install_crds(api)
        await _namespace(api, hook.namespace, {LABEL: token})
        await _namespace(api, hook.unjudged, {})
        await api.apply(
            live.WEBHOOK_CONFIGURATIONS, registration, field_manager="akri-trio-tests", force=True
        )
        await live.wait_enforced(api, refused_only_by_the_webhook(hook.namespace, "probe"))


async def _unregister(cluster: dict[str, str], hook: Webhook) -> None:
    async with Client.open(load_config(cluster["KUBECONFIG"])) as api:
        for res, name in (
            (live.WEBHOOK_CONFIGURATIONS, hook.hook_name),
            (NAMESPACES, hook.namespace),
            (NAMESPACES, hook.unjudged),
        ):
            with contextlib.suppress(NotFound):
                await api.delete(res, name)


@pytest.fixture(scope="module")
def webhook(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    token = secrets.token_hex(4)
    hook = Webhook(
        namespace=f"webhook-e2e-{token}",
        unjudged=f"webhook-e2e-{token}-free",
        hook_name=f"e2e-{token}.webhook.akri-trio.test",
        kubectl=cluster["KUBECTL"],
        kubeconfig=cluster["KUBECONFIG"],
    )
    certs = tmp_path_factory.mktemp("webhook-certs")
    registration = live.make_certs(certs, hook.hook_name)
    log = certs / "webhook.log"
    process = live.start_webhook(certs, Path(cluster["KUBECONFIG"]), log)
    try:
        port = trio.run(live.listening_port, process, log)
        trio.run(live.wait_ready, port, (certs / "ca.crt").read_bytes(), log)
        registration = live.by_url(registration, port, (LABEL, token))
        trio.run(_register, cluster, hook, token, registration)
        yield attrs.evolve(hook, port=port, ca_pem=(certs / "ca.crt").read_bytes())
    finally:
        trio.run(_unregister, cluster, hook)
        live.stop_webhook(process)
    assert process.returncode == 0, log.read_text()  # SIGTERM is a clean shutdown


def test_unknown_field_in_a_broker_container_is_refused(webhook: Webhook) -> None:
    bad = configuration(
        webhook.namespace,
        "typo",
        brokerSpec={"brokerPodSpec": pod_spec(imagePullPolcy="Always")},
    )
    stderr = webhook.refused_by_webhook(bad)
    assert "spec.brokerSpec.brokerPodSpec.containers[0].imagePullPolcy: unknown field" in stderr


def test_mistyped_broker_port_and_quantity_are_refused(webhook: Webhook) -> None:
    container = {
        "ports": [{"containerPort": "80"}],
        "resources": {"limits": {"memory": "lots"}},
    }
    bad = configuration(
        webhook.namespace, "types", brokerSpec={"brokerPodSpec": pod_spec(**container)}
    )
    stderr = webhook.refused_by_webhook(bad)
    where = "spec.brokerSpec.brokerPodSpec.containers[0]"
    assert f"{where}.ports[0].containerPort: expected an integer, got a string" in stderr
    assert f"{where}.resources.limits.memory: expected a quantity" in stderr


def test_both_broker_kinds_are_refused(webhook: Webhook) -> None:
    both = {"brokerPodSpec": pod_spec(), "brokerJobSpec": {"template": {"spec": pod_spec()}}}
    stderr = webhook.refused(configuration(webhook.namespace, "both", brokerSpec=both))
    assert "spec.brokerSpec" in stderr


def test_capacity_zero_is_refused(webhook: Webhook) -> None:
    stderr = webhook.refused(configuration(webhook.namespace, "zero", capacity=0))
    assert "spec.capacity" in stderr


def test_capacity_over_the_maximum_is_refused(webhook: Webhook) -> None:
    # By the CRD's schema first (its maximum is the webhook's and the agent's).
    stderr = webhook.refused(configuration(webhook.namespace, "huge", capacity=5000))
    assert "spec.capacity" in stderr and "1024" in stderr


def test_secret_in_another_namespace_is_refused(webhook: Webhook) -> None:
    stderr = webhook.refused_by_webhook(refused_only_by_the_webhook(webhook.namespace, "steal"))
    assert (
        "spec.discoveryHandler.discoveryProperties[0].valueFrom.secretKeyRef.namespace: "
        "'kube-system' is not the Configuration's namespace" in stderr
    )


def test_bad_udev_details_are_refused(webhook: Webhook) -> None:
    bad = configuration(webhook.namespace, "udev-bad")
    bad["spec"]["discoveryHandler"] = {
        "name": "udev",
        "discoveryDetails": "udevRules: ['KERNEL==\"video0\"']\npermissions: xyz\n",
    }
    stderr = webhook.refused_by_webhook(bad)
    assert "spec.discoveryHandler.discoveryDetails.permissions: " in stderr


def test_changing_the_handler_name_on_update_is_refused(webhook: Webhook) -> None:
    first = configuration(webhook.namespace, "renamed")
    created = webhook.apply(first)
    assert created.returncode == 0, created.stderr
    renamed = copy.deepcopy(first)
    renamed["spec"]["discoveryHandler"] = {
        "name": "udev",
        "discoveryDetails": "udevRules: ['SUBSYSTEM==\"video4linux\"']\n",
    }
    stderr = webhook.refused_by_webhook(renamed)
    assert (
        "spec.discoveryHandler.name: cannot change ('debugEcho' -> 'udev'); create a new "
        "Configuration instead" in stderr
    )


def test_upstream_debug_echo_example_is_admitted(webhook: Webhook) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    example["metadata"]["namespace"] = webhook.namespace
    done = webhook.apply(example)
    assert done.returncode == 0, done.stderr
    assert "configuration.akri.sh/akri-debug-echo-foo created" in done.stdout
    # An update that keeps the handler is admitted too.
    example["spec"]["capacity"] = 3
    done = webhook.apply(example)
    assert done.returncode == 0, done.stderr


def test_namespaces_outside_the_selector_are_not_judged(webhook: Webhook) -> None:
    done = webhook.apply(refused_only_by_the_webhook(webhook.unjudged, "unjudged"))
    assert done.returncode == 0, done.stderr


def test_configurations_refused_are_not_stored(webhook: Webhook) -> None:
    webhook.refused_by_webhook(refused_only_by_the_webhook(webhook.namespace, "never"))

    async def absent() -> None:
        async with Client.open(load_config(webhook.kubeconfig)) as api:
            with pytest.raises(NotFound):
                await api.get(CONFIGURATIONS, "never", namespace=webhook.namespace)

    trio.run(absent)


def test_a_name_another_namespace_uses_is_refused(webhook: Webhook) -> None:
    # The unjudged namespace gets it first (admitted unseen), then the judged one asks.
    done = webhook.apply(configuration(webhook.unjudged, "taken"))
    assert done.returncode == 0, done.stderr
    second = configuration(webhook.namespace, "taken")

    def seen() -> bool:  # the webhook's watch has the first one (a dry run stores nothing)
        return webhook.apply(second, "--dry-run=server").returncode != 0

    until(seen, seconds=30, what="the webhook to see the first Configuration")
    stderr = webhook.refused_by_webhook(second)
    assert (
        f"metadata.name: a Configuration taken already exists in namespace {webhook.unjudged}"
        in stderr
    )


async def test_the_api_servers_review_is_answered_while_512_connections_are_open(
    webhook: Webhook,
) -> None:
    """Idle keep-alive and slow TLS connections, sixteen times the webhook's connection cap,
    held open while the API server sends a review: the webhook still answers it (a denial
    naming the reason), so writes are not refused for want of an answer."""
    trusted = live.trusting(webhook.ca_pem)
    with trio.fail_after(180):  # a hang guard for 512 handshakes on a loaded machine
        held = await live.hold_idle_and_slow(webhook.port, trusted, 512)
        try:
            bad = refused_only_by_the_webhook(webhook.namespace, "flooded")
            stderr = await trio.to_thread.run_sync(webhook.refused_by_webhook, bad)
            assert "'kube-system' is not the Configuration's namespace" in stderr
        finally:
            for stream in held:
                await trio.aclose_forcefully(stream)
