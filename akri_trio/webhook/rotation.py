"""Keeping the webhook's serving certificate valid while it serves: the edge of certs.plan_certs.

A certificate made once at install expires under a running install, and one made by a chart
render (`helm template`, a GitOps tool) changes on every render. So the certificate lives in a
Secret that the webhook itself looks after (`manage`): every `period` seconds each replica reads
it, and when `plan_certs` says so writes a renewed one (an update with the resourceVersion it
read, so two replicas racing write once; the loser reads the winner's next time) after putting
its CA into the ValidatingWebhookConfiguration's caBundle. Without `manage` (cert-manager's
Secret, or one the user keeps) it only follows the Secret, or the mounted files.

Whatever the source, the replica loads a changed certificate into the SSLContext it serves
with: new handshakes use it, open connections finish with the old one, so a renewal costs no
failed request. A failed look is logged and retried next period; the certificate already
loaded keeps serving.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from akri_trio.address import ObjectKey
from akri_trio.kube import AlreadyExists, ApiError, Client, Conflict, NotFound, Resource
from akri_trio.model.resources import SECRETS
from akri_trio.webhook.certs import (
    CertSpec,
    certs_of_secret,
    plan_certs,
    secret_data,
    trusted_bundle,
)

log = logging.getLogger(__name__)

WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
CHECK_PERIOD_S = 60.0

# (certificate PEM, key PEM), or None while there is none
Source = Callable[[], Awaitable[tuple[bytes, bytes] | None]]


@attrs.frozen
class Managed:
    """The webhook's own certificate: what it must be, and the ValidatingWebhookConfiguration
    whose caBundle trusts it."""

    spec: CertSpec
    webhook_configuration: str


def load_into(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Make `context` serve this certificate from its next handshake on (ssl reads files only:
    they go to a private directory that is removed at once)."""
    with tempfile.TemporaryDirectory(prefix="akri-webhook-tls-") as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        context.load_cert_chain(cert, key)


def _read_pair(cert_file: Path, key_file: Path) -> tuple[bytes, bytes]:
    return cert_file.read_bytes(), key_file.read_bytes()


def files_source(cert_file: Path, key_file: Path) -> Source:
    """The mounted files (the kubelet rewrites them when their Secret changes). Two small
    local files once a period: read in place, no thread needed."""

    async def read() -> tuple[bytes, bytes]:
        return _read_pair(cert_file, key_file)

    return read


def _owners_of(secret: dict[str, object] | None) -> list[object]:
    """The ownerReferences `secret` has (kept when it is renewed)."""
    meta = secret.get("metadata") if secret else None
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    return list(owners) if isinstance(owners, list) else []


class SecretKeeper:
    """The Secret `secret`: read it (a Source), and with `manage` make and renew it."""

    def __init__(self, api: Client, secret: ObjectKey, manage: Managed | None = None) -> None:
        self.api = api
        self.secret = secret
        self.manage = manage

    async def _get(self) -> dict[str, object] | None:
        try:
            found: dict[str, object] = await self.api.get(
                SECRETS, self.secret.name, namespace=self.secret.namespace
            )
        except NotFound:
            return None
        return found

    async def read(self) -> tuple[bytes, bytes] | None:
        secret = await self._get()
        if self.manage is not None:
            secret = await self._renewed(secret)
        data = secret.get("data") if secret else None
        held = certs_of_secret(data if isinstance(data, dict) else None)
        return None if held is None else (held.cert_pem, held.key_pem)

    async def _renewed(self, secret: dict[str, object] | None) -> dict[str, object] | None:
        m = self.manage
        assert m is not None
        data = secret.get("data") if secret else None
        held = certs_of_secret(data if isinstance(data, dict) else None)
        new = plan_certs(held, m.spec, dt.datetime.now(dt.UTC))
        if new is None:
            await self._trust(held.ca_pem if held else b"")
            return secret
        await self._trust(new.ca_pem)  # trusted before anyone serves it
        metadata: dict[str, object] = {
            "name": self.secret.name,
            "namespace": self.secret.namespace,
            # owned by the release's ValidatingWebhookConfiguration: uninstalling deletes it, and
            # the garbage collector then deletes this Secret, which no chart render made
            "ownerReferences": _owners_of(secret) or [await self._owner()],
        }
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata}
        body |= {"type": "kubernetes.io/tls", "data": secret_data(new)}
        try:
            if secret is None:
                written = await self.api.create(SECRETS, body, namespace=self.secret.namespace)
            else:
                # only over the Secret read: a replica that renewed meanwhile wins (Conflict)
                meta = secret.get("metadata")
                version = meta.get("resourceVersion") if isinstance(meta, dict) else None
                metadata["resourceVersion"] = version
                written = await self.api.replace(SECRETS, body, namespace=self.secret.namespace)
        except (AlreadyExists, Conflict):
            log.info("another replica renewed the webhook certificate first; reading it")
            return await self._get()
        log.info("webhook certificate %s in %s", "made" if held is None else "renewed", self.secret)
        return dict(written)

    async def _owner(self) -> dict[str, object]:
        m = self.manage
        assert m is not None
        vwc = await self.api.get(WEBHOOK_CONFIGURATIONS, m.webhook_configuration)
        return {
            "apiVersion": f"{WEBHOOK_CONFIGURATIONS.group}/{WEBHOOK_CONFIGURATIONS.version}",
            "kind": WEBHOOK_CONFIGURATIONS.kind,
            "name": m.webhook_configuration,
            "uid": vwc["metadata"]["uid"],
        }

    async def _trust(self, ca_pem: bytes) -> None:
        """Every webhook of the ValidatingWebhookConfiguration trusts `ca_pem`'s CA
        (certs.trusted_bundle: the CAs it trusted stay beside it)."""
        m = self.manage
        if m is None or not ca_pem:
            return
        vwc = await self.api.get(WEBHOOK_CONFIGURATIONS, m.webhook_configuration)
        ops = []
        for i, hook in enumerate(vwc.get("webhooks") or []):
            current = base64.b64decode((hook.get("clientConfig") or {}).get("caBundle") or "")
            bundle = trusted_bundle(current, ca_pem)
            if bundle is not None:
                value = base64.b64encode(bundle).decode()
                ops.append(
                    {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": value}
                )
        if ops:
            await self.api.json_patch(WEBHOOK_CONFIGURATIONS, m.webhook_configuration, ops)
            log.info("caBundle of %s now trusts the webhook's CA", m.webhook_configuration)


async def keep_serving_cert(
    context: ssl.SSLContext,
    source: Source,
    *,
    period: float = CHECK_PERIOD_S,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load what `source` gives into `context` now and whenever it changes; started once the
    first certificate is loaded (retrying every `period` until there is one)."""
    loaded: tuple[bytes, bytes] | None = None
    started = False
    while True:
        try:
            current = await source()
        except (ApiError, OSError, ValueError) as exc:
            log.warning(
                "reading the webhook certificate failed (%s); retrying in %.0fs", exc, period
            )
            current = None
        if current is not None and current != loaded:
            try:
                load_into(context, *current)
            except (ssl.SSLError, ValueError) as exc:
                log.warning("the webhook certificate does not load (%s); keeping the old", exc)
            else:
                loaded = current
                log.info("serving the webhook certificate")
        if loaded is not None and not started:
            task_status.started()
            started = True
        await trio.sleep(period)
