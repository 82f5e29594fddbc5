"""The webhook's TLS identity and its registration with the API server, as bytes and JSON.

The API server calls admission webhooks over HTTPS only, checking the serving certificate
against the `caBundle` of the ValidatingWebhookConfiguration. The webhook can therefore make
its own CA at start, sign a serving certificate for its Service's DNS names with it, and
publish the CA in the configuration it renders here: no cert-manager and no certificate Job
(upstream's Helm chart runs one before install and another to patch the caBundle).

Pure: the clock is an argument and nothing is written; the edge stores the PEM files and
applies the configuration. Keys are ECDSA P-256, which the API server accepts and which is
generated in milliseconds, so a restart costs nothing.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from typing import Any, Final

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY: Final = dt.timedelta(days=365)
PATH: Final = "/validate"
REVIEW_VERSIONS: Final = ("v1", "v1beta1")


@attrs.frozen
class ServingCerts:
    ca_pem: bytes  # goes into caBundle
    cert_pem: bytes  # the webhook serves this ...
    key_pem: bytes  # ... with this key


def service_dns_names(name: str, namespace: str) -> tuple[str, str, str]:
    """The names the API server may use for a Service: NAME, NAME.NS and NAME.NS.svc."""
    return name, f"{name}.{namespace}", f"{name}.{namespace}.svc"


def _certificate(
    subject: str,
    issuer: x509.Name | None,
    public_key: ec.EllipticCurvePublicKey,
    signer: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
) -> x509.CertificateBuilder:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
    )


def serving_certs(
    name: str,
    namespace: str,
    now: dt.datetime,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
) -> ServingCerts:
    """A fresh CA and a serving certificate for the Service `name` in `namespace` (plus any
    extra `dns` names and `ips`, e.g. 127.0.0.1 for a webhook reached by URL)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _certificate(f"{name}-ca", None, ca_key.public_key(), ca_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName(d) for d in dict.fromkeys([*service_dns_names(name, namespace), *dns])
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    leaf = (
        _certificate(f"{name}.{namespace}.svc", ca.subject, key.public_key(), ca_key, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ServingCerts(
        ca.public_bytes(serialization.Encoding.PEM),
        leaf.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def webhook_configuration(
    name: str,
    ca_pem: bytes,
    *,
    service: tuple[str, str] | None = None,
    port: int = 443,
    url: str | None = None,
    timeout_seconds: int = 10,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration `name` sending Configuration CREATE and UPDATE to the
    webhook, reached through `service` (name, namespace) on `port`, or at `url`.

    `name` is also the webhook's name, which the API server requires to be fully qualified
    (e.g. `akri-webhook-configuration.akri.sh`). Failing closed (`failurePolicy: Fail`) means
    no Configuration is admitted unchecked while the webhook is down."""
    if (service is None) == (url is None):
        raise ValueError("give exactly one of service, url")
    client: dict[str, Any] = {"caBundle": base64.b64encode(ca_pem).decode()}
    if service is not None:
        svc_name, svc_namespace = service
        client["service"] = {
            "name": svc_name,
            "namespace": svc_namespace,
            "path": PATH,
            "port": port,
        }
    else:
        client["url"] = url
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": name,
                "clientConfig": client,
                "rules": [
                    {
                        "apiGroups": ["akri.sh"],
                        "apiVersions": ["v0"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["configurations"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": list(REVIEW_VERSIONS),
                "timeoutSeconds": timeout_seconds,
            }
        ],
    }
