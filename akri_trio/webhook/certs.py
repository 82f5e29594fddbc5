"""The webhook's TLS identity and its registration with the API server, as bytes and JSON.

The API server calls admission webhooks over HTTPS only, checking the serving certificate
against the `caBundle` of the ValidatingWebhookConfiguration. The webhook can therefore make
its own CA, sign a serving certificate for its Service's DNS names with it, and publish the CA
in the configuration it renders here: no cert-manager and no certificate Job (upstream's Helm
chart runs one before install and another to patch the caBundle).

A certificate must outlive the install: `plan_certs` decides, from what a Secret holds, whether
to keep it, to sign a new serving certificate with the same CA (a third of its validity left,
or names missing: the caBundle does not change, so nothing else must), or to make a new CA
(none yet, or the CA itself near its end). The CA is valid ten times as long as the serving
certificate it signs.

Pure: the clock is an argument and nothing is written; the edges store the PEM files or the
Secret and apply the configuration. Keys are ECDSA P-256, which the API server accepts and
which is generated in milliseconds.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY: Final = dt.timedelta(days=365)
CA_VALIDITY_FACTOR: Final = 10
# not before a little in the past: a node whose clock lags still accepts a fresh certificate
BACKDATE: Final = dt.timedelta(minutes=5)
SECRET_KEYS: Final = ("ca.crt", "ca.key", "tls.crt", "tls.key")
PATH: Final = "/validate"
REVIEW_VERSIONS: Final = ("v1", "v1beta1")


@attrs.frozen
class ServingCerts:
    ca_pem: bytes  # goes into caBundle: the signing CA first, then the one it replaced
    cert_pem: bytes  # the webhook serves this ...
    key_pem: bytes  # ... with this key
    ca_key_pem: bytes = b""  # signs the next serving certificate (empty: not kept)


def service_dns_names(name: str, namespace: str) -> tuple[str, str, str]:
    """The names the API server may use for a Service: NAME, NAME.NS and NAME.NS.svc."""
    return name, f"{name}.{namespace}", f"{name}.{namespace}.svc"


def _certificate(
    subject: str,
    issuer: x509.Name | None,
    public_key: ec.EllipticCurvePublicKey,
    signer: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
    validity: dt.timedelta,
) -> x509.CertificateBuilder:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - min(BACKDATE, validity))
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _new_ca(
    name: str, now: dt.datetime, validity: dt.timedelta
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _certificate(f"{name}-ca", None, ca_key.public_key(), ca_key, now, validity)
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
    return ca, ca_key


def _sans(
    name: str, namespace: str, dns: Sequence[str], ips: Sequence[str]
) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = [
        x509.DNSName(d) for d in dict.fromkeys([*service_dns_names(name, namespace), *dns])
    ]
    return sans + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]


def serving_certs(
    name: str,
    namespace: str,
    now: dt.datetime,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    validity: dt.timedelta = VALIDITY,
    ca: ServingCerts | None = None,
) -> ServingCerts:
    """A serving certificate for the Service `name` in `namespace` (plus any extra `dns` names
    and `ips`, e.g. 127.0.0.1 for a webhook reached by URL), valid for `validity`, signed by
    `ca`'s CA (which must carry its key) or by a fresh CA valid ten times as long."""
    if ca is not None and ca.ca_key_pem:
        ca_cert = x509.load_pem_x509_certificate(ca.ca_pem)
        loaded = serialization.load_pem_private_key(ca.ca_key_pem, password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an ECDSA key")
        ca_key = loaded
    else:
        ca_cert, ca_key = _new_ca(name, now, validity * CA_VALIDITY_FACTOR)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        _certificate(
            f"{name}.{namespace}.svc", ca_cert.subject, key.public_key(), ca_key, now, validity
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(_sans(name, namespace, dns, ips)), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return ServingCerts(
        ca_cert.public_bytes(serialization.Encoding.PEM),
        leaf.public_bytes(serialization.Encoding.PEM),
        _pem_key(key),
        _pem_key(ca_key),
    )


def _due(cert: x509.Certificate, now: dt.datetime, renew_before: dt.timedelta) -> bool:
    return cert.not_valid_after_utc - now < renew_before


def _covers(cert: x509.Certificate, wanted: list[x509.GeneralName]) -> bool:
    try:
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(wanted) <= set(have)


@attrs.frozen
class CertSpec:
    """What a serving certificate must be: for the Service `service` in `namespace` (and the
    extra `dns` names and `ips`), valid for `validity`."""

    service: str
    namespace: str
    dns: Sequence[str] = ()
    ips: Sequence[str] = ()
    validity: dt.timedelta = VALIDITY

    def make(self, now: dt.datetime, ca: ServingCerts | None = None) -> ServingCerts:
        return serving_certs(
            self.service,
            self.namespace,
            now,
            dns=self.dns,
            ips=self.ips,
            validity=self.validity,
            ca=ca,
        )


def plan_certs(held: ServingCerts | None, spec: CertSpec, now: dt.datetime) -> ServingCerts | None:
    """What to store instead of `held` (a Secret's contents, None without one): None to keep
    it; a serving certificate signed by the same CA when it has a third of its validity left or
    lacks a name; a new CA and certificate when there is none, it cannot be read, or the CA
    itself has a third of its own validity left."""
    renew_before = spec.validity / 3
    try:
        if held is None or not held.ca_key_pem:
            raise ValueError("nothing to renew from")
        ca = x509.load_pem_x509_certificate(held.ca_pem)
        leaf = x509.load_pem_x509_certificate(held.cert_pem)
    except ValueError:
        return spec.make(now)
    if _due(ca, now, renew_before * CA_VALIDITY_FACTOR):
        fresh = spec.make(now)
        # the caBundle keeps the old CA beside the new one (the new one first, the one that
        # signs), so a replica still serving the old certificate stays trusted meanwhile
        old = ca.public_bytes(serialization.Encoding.PEM)
        return attrs.evolve(fresh, ca_pem=fresh.ca_pem + old)
    wanted = _sans(spec.service, spec.namespace, spec.dns, spec.ips)
    if _due(leaf, now, renew_before) or not _covers(leaf, wanted):
        return spec.make(now, ca=held)
    return None


MAX_BUNDLE: Final = 3


def _pem_certs(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem) if pem.strip() else []
    except ValueError:
        return []


def trusted_bundle(current: bytes, ca_pem: bytes) -> bytes | None:
    """The caBundle to set so that `ca_pem`'s signing CA (its first) is trusted, or None when
    `current` already trusts it. The CAs `current` trusted stay after it (at most MAX_BUNDLE in
    all): a replica still serving a certificate of the old CA is trusted until it loads the new
    one. A bundle never shrinks otherwise, so replicas that renew a moment apart never drop
    each other's CA."""
    wanted = _pem_certs(ca_pem)
    if not wanted:
        return None
    have = _pem_certs(current)
    if wanted[0] in have:
        return None
    bundle = list(dict.fromkeys([*wanted, *have]))[:MAX_BUNDLE]
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in bundle)


def secret_data(certs: ServingCerts) -> dict[str, str]:
    """The Secret `data` holding `certs` (kubernetes.io/tls keys, plus the CA and its key)."""
    pems = (certs.ca_pem, certs.ca_key_pem, certs.cert_pem, certs.key_pem)
    return {k: base64.b64encode(v).decode() for k, v in zip(SECRET_KEYS, pems, strict=True)}


def certs_of_secret(data: Mapping[str, str] | None) -> ServingCerts | None:
    """The inverse of `secret_data`; None when a serving key or certificate is missing (a
    Secret of cert-manager's has no `ca.key`: that is kept empty)."""
    if not data or "tls.crt" not in data or "tls.key" not in data:
        return None
    try:
        pem = {k: base64.b64decode(data.get(k, ""), validate=True) for k in SECRET_KEYS}
    except ValueError:
        return None
    return ServingCerts(pem["ca.crt"], pem["tls.crt"], pem["tls.key"], pem["ca.key"])


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
