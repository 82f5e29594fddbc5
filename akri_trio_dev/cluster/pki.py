"""The local cluster's PKI, as bytes: a CA and the few certificates the cluster needs.

Pure: every function returns PEM bytes and takes the clock as an argument; writing files is the
caller's job. The cryptography package does the work (it is already installed via asyncua), so
`up` does not shell out to openssl.

What exists and why:
  ca                         signs everything; the apiserver's --client-ca-file, the kubelet's too
  apiserver                  serving cert: 127.0.0.1, 10.0.0.1 (the `kubernetes` Service) and names
  apiserver-kubelet-client   system:masters client cert the apiserver shows the kubelet
                             (`kubectl logs/exec` need it)
  kubelet-client-<node>      the kubelet's identity, CN=system:node:<node> O=system:nodes, so the
                             Node authorizer applies and any node name works without restarting
                             the apiserver (a token would have to be in tokens.csv at start)
  webhook                    a spare 127.0.0.1 serving cert for admission-webhook tests
  sa                         service-account token signing key pair
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=3650)
APISERVER_IPS = ("127.0.0.1", "10.0.0.1")
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@attrs.frozen
class KeyCert:
    key_pem: bytes
    cert_pem: bytes


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
    attrs_ = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs_, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_usage(*, signs_certs: bool) -> x509.KeyUsage:
    """Signing and key encipherment; a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=True,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certs,
        crl_sign=signs_certs,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(now: dt.datetime, cn: str = "akri-trio-ca") -> KeyCert:
    key = _new_key()
    name = _name(cn)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certs=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyCert(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def issue(
    ca: KeyCert,
    now: dt.datetime,
    *,
    cn: str,
    orgs: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
    ips: Sequence[str] = (),
    dns: Sequence[str] = (),
) -> KeyCert:
    """A leaf certificate signed by `ca`."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, rsa.RSAPrivateKey)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = _new_key()
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, orgs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.DNSName(d) for d in dns]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyCert(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def service_account_keys() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) for --service-account-signing-key-file / -key-file."""
    key = _new_key()
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), pub


def control_plane_pki(now: dt.datetime) -> dict[str, bytes]:
    """Every control-plane PKI file by name (e.g. ``apiserver.crt``), created at once."""
    ca = make_ca(now)
    apiserver = issue(
        ca, now, cn="kube-apiserver", server=True, ips=APISERVER_IPS, dns=APISERVER_DNS
    )
    kubelet_client = issue(
        ca, now, cn="kube-apiserver-kubelet-client", orgs=("system:masters",), client=True
    )
    webhook = issue(
        ca, now, cn="akri-trio-webhook", server=True, ips=("127.0.0.1",), dns=("localhost",)
    )
    sa_key, sa_pub = service_account_keys()
    return {
        "ca.crt": ca.cert_pem,
        "ca.key": ca.key_pem,
        "apiserver.crt": apiserver.cert_pem,
        "apiserver.key": apiserver.key_pem,
        "apiserver-kubelet-client.crt": kubelet_client.cert_pem,
        "apiserver-kubelet-client.key": kubelet_client.key_pem,
        "webhook.crt": webhook.cert_pem,
        "webhook.key": webhook.key_pem,
        "sa.key": sa_key,
        "sa.pub": sa_pub,
    }


def node_client(ca: KeyCert, now: dt.datetime, node: str) -> KeyCert:
    """The kubelet's client identity; the Node authorizer keys on this exact subject."""
    return issue(ca, now, cn=f"system:node:{node}", orgs=("system:nodes",), client=True)
