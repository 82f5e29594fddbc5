"""The webhook keeps its own certificate, against the real API server: a real `akri-trio
webhook --tls-secret --manage-certs` process makes its CA and serving certificate in a Secret,
puts the CA into its ValidatingWebhookConfiguration's caBundle, and renews the certificate as
it nears its end (here it lasts 12 seconds) — while Configurations are sent through the API
server to it all along, each one admitted: no renewal costs a request."""

from __future__ import annotations

import base64
import contextlib
import secrets
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography import x509

from akri_trio.kube import Client, NotFound, load_config
from akri_trio.model.resources import SECRETS
from akri_trio.webhook.certs import webhook_configuration
from tests.support.akri_cluster import NAMESPACES, install_crds
from tests.support.kubectl import free_port
from tests.support.polling import until_api
from tests.webhook import live
from tests.webhook.test_webhook_cluster import configuration

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[2]
LABEL = "akri-trio.test/cert-rotation"
VALIDITY_S = 12.0
SECRET = "hook-tls"


def _served_serial(port: int) -> int:
    """The serial of the certificate the webhook serves a new connection now."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _start(cluster: dict[str, str], log: Path, namespace: str, hook: str, port: int) -> Any:
    args = ["--tls-secret", SECRET, "--namespace", namespace, "--manage-certs"]
    args += ["--webhook-configuration", hook, "--service", "akri-webhook", "--cert-ip", "127.0.0.1"]
    args += ["--cert-days", str(VALIDITY_S / 86400), "--cert-check-period", "0.5"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--kubeconfig", cluster["KUBECONFIG"]]
    return live.run_webhook(args, log)


@contextlib.asynccontextmanager
async def _webhook(
    api: Client, cluster: dict[str, str], tmp: Path, namespace: str, hook: str, port: int
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """The process, once it serves a certificate the Secret's CA signed and is ready."""
    log = tmp / "webhook.log"
    process: subprocess.Popen[bytes] = _start(cluster, log, namespace, hook, port)
    try:

        async def issued() -> dict[str, Any] | None:
            with contextlib.suppress(NotFound):
                return await api.get(SECRETS, SECRET, namespace=namespace)
            return None

        secret = await until_api(issued, 30, f"Secret {SECRET}")
        await live.wait_ready(port, base64.b64decode(secret["data"]["ca.crt"]), log)
        yield process
    finally:
        live.stop_webhook(process)
        print(log.read_text())


async def test_an_expiring_certificate_is_renewed_with_every_configuration_admitted(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    namespace, hook = f"cert-rot-{token}", f"rot-{token}.webhook.akri-trio.test"
    port = free_port()
    registration = webhook_configuration(
        hook, b"", url=f"https://127.0.0.1:{port}/validate", timeout_seconds=5
    )
    (entry,) = registration["webhooks"]
    del entry["clientConfig"]["caBundle"]  # the webhook puts its CA there
    entry["namespaceSelector"] = {"matchLabels": {LABEL: token}}
    async with Client.open(load_config(cluster["KUBECONFIG"])) as api:
        await install_crds(api)
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        ns["metadata"]["labels"] = {LABEL: token}  # type: ignore[index]
        await api.create(NAMESPACES, ns)
        await api.create(live.WEBHOOK_CONFIGURATIONS, registration)
        try:
            async with _webhook(api, cluster, tmp_path, namespace, hook, port) as process:
                bad = configuration(namespace, "bad")  # refused by the webhook only
                bad["spec"]["discoveryHandler"]["discoveryDetails"] = "descriptions: 3\n"
                await live.wait_enforced(api, bad)
                first = await api.get(SECRETS, SECRET, namespace=namespace)
                bundle = (await api.get(live.WEBHOOK_CONFIGURATIONS, hook))["webhooks"][0][
                    "clientConfig"
                ]["caBundle"]
                assert base64.b64decode(bundle) == base64.b64decode(first["data"]["ca.crt"])
                serials: list[int] = []
                admitted = 0
                path = f"/apis/akri.sh/v0/namespaces/{namespace}/configurations"
                # Until the certificate has been renewed twice (each after 8 of its 12 s), a
                # Configuration every 0.2 s, each through the webhook: every one admitted.
                with trio.fail_after(120):
                    while len(set(serials)) < 3:
                        assert process.poll() is None, "the webhook exited"
                        body = configuration(namespace, f"c{admitted}")
                        await api.request("POST", path, params={"dryRun": "All"}, body=body)
                        admitted += 1
                        serials.append(await trio.to_thread.run_sync(_served_serial, port))
                        await trio.sleep(0.2)
                last = await api.get(SECRETS, SECRET, namespace=namespace)
                assert last["data"]["ca.crt"] == first["data"]["ca.crt"]  # the same CA
                assert last["data"]["tls.crt"] != first["data"]["tls.crt"]
                # a refusal still comes from the webhook after the renewals
                await live.wait_enforced(api, bad)
                # the Secret belongs to the registration, renewals kept: uninstalling the
                # registration takes the Secret that no chart render made with it
                vwc = await api.get(live.WEBHOOK_CONFIGURATIONS, hook)
                (owner,) = last["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["name"]) == ("ValidatingWebhookConfiguration", hook)
                assert owner["uid"] == vwc["metadata"]["uid"]
            await api.delete(live.WEBHOOK_CONFIGURATIONS, hook)

            async def secret_gone() -> bool:
                try:
                    await api.get(SECRETS, SECRET, namespace=namespace)
                except NotFound:
                    return True
                return False

            await until_api(secret_gone, what="the webhook's Secret collected with its owner")
        finally:
            for res, name, ns_name in (
                (live.WEBHOOK_CONFIGURATIONS, hook, None),
                (NAMESPACES, namespace, None),
            ):
                with contextlib.suppress(NotFound):
                    await api.delete(res, name, namespace=ns_name)
