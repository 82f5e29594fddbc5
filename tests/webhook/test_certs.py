"""The webhook's certificates and registration (akri_trio.webhook.certs)."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from akri_trio.webhook import serving_certs, webhook_configuration
from akri_trio.webhook.certs import ServingCerts

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def certs() -> ServingCerts:
    return serving_certs("akri-webhook", "akri", NOW, ips=("127.0.0.1",))


def test_serving_cert_names_the_service(certs: ServingCerts) -> None:
    leaf = x509.load_pem_x509_certificate(certs.cert_pem)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "akri-webhook",
        "akri-webhook.akri",
        "akri-webhook.akri.svc",
    ]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    ca = x509.load_pem_x509_certificate(certs.ca_pem)
    assert leaf.issuer == ca.subject
    leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def _handshake(certs: ServingCerts, tmp_path: Path, server_name: str) -> None:
    """A TLS handshake in memory: the API server's side trusts only the caBundle."""
    (tmp_path / "tls.crt").write_bytes(certs.cert_pem)
    (tmp_path / "tls.key").write_bytes(certs.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_ctx = ssl.create_default_context(cadata=certs.ca_pem.decode())
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(to_server, to_client, server_side=True)
    to_server2, to_client2 = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(to_client2, to_server2, server_hostname=server_name)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, end in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        to_server.write(to_server2.read())
        to_client2.write(to_client.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def test_api_server_side_accepts_the_service_name(certs: ServingCerts, tmp_path: Path) -> None:
    _handshake(certs, tmp_path, "akri-webhook.akri.svc")


def test_api_server_side_refuses_another_name(certs: ServingCerts, tmp_path: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs, tmp_path, "other.akri.svc")


def test_webhook_configuration(certs: ServingCerts) -> None:
    config = webhook_configuration(
        "akri-webhook-configuration.akri.sh", certs.ca_pem, service=("akri-webhook", "akri")
    )
    assert config["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert config["kind"] == "ValidatingWebhookConfiguration"
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert hook["rules"] == [
        {
            "apiGroups": ["akri.sh"],
            "apiVersions": ["v0"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["configurations"],
            "scope": "Namespaced",
        }
    ]
    client = hook["clientConfig"]
    assert base64.b64decode(client["caBundle"]) == certs.ca_pem
    assert client["service"] == {
        "name": "akri-webhook",
        "namespace": "akri",
        "path": "/validate",
        "port": 443,
    }


def test_webhook_configuration_by_url(certs: ServingCerts) -> None:
    config = webhook_configuration("w.akri.sh", certs.ca_pem, url="https://127.0.0.1:8443/validate")
    assert config["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:8443/validate"
    with pytest.raises(ValueError):
        webhook_configuration("w.akri.sh", certs.ca_pem)
