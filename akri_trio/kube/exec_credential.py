"""kubeconfig `exec` credential plugins, the pure half: what to run and what it answered.

Managed clusters (EKS's `aws eks get-token`, GKE's `gke-gcloud-auth-plugin`, AKS's `kubelogin`)
hand out short-lived credentials through a program named in the kubeconfig's user. The program
prints an `ExecCredential` (client.authentication.k8s.io/v1 or v1beta1) holding a bearer token
or a client certificate and key, and usually an `expirationTimestamp`. This module parses the
kubeconfig's `exec` section, the program's answer and the refresh decision as plain functions;
`exec_auth` runs the program and applies the answer to requests.

The legacy `auth-provider` section (gcp, azure, oidc) was removed from kubectl in favour of
`exec`; it is refused with a line naming the replacement.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

import attrs

from akri_trio.kube.errors import ConfigError

V1: Final = "client.authentication.k8s.io/v1"
V1BETA1: Final = "client.authentication.k8s.io/v1beta1"
API_VERSIONS: Final = (V1, V1BETA1)

# A credential is refreshed this long before it expires (or halfway through its life, when it
# lives shorter than twice this), so a request never carries one the server is about to refuse.
REFRESH_MARGIN_S: Final = 30.0


@attrs.frozen
class ExecPlugin:
    """A kubeconfig user's `exec` section."""

    user: str
    command: str
    api_version: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    provide_cluster_info: bool = False
    install_hint: str = ""

    @property
    def name(self) -> str:
        """How messages name the plugin: its user and its command."""
        return f"user {self.user!r}: exec plugin {self.command!r}"


@attrs.frozen
class Credential:
    """What one run of the plugin answered. `expires_at` is a wall-clock time (seconds since the
    epoch); None means the credential does not expire (it is refreshed only on a 401)."""

    token: str | None = attrs.field(default=None, repr=False)
    client_cert_pem: bytes | None = attrs.field(default=None, repr=False)
    client_key_pem: bytes | None = attrs.field(default=None, repr=False)
    obtained_at: float = 0.0
    expires_at: float | None = None


def auth_provider_refused(user: object, section: object) -> ConfigError:
    """The one line for a legacy `auth-provider` user: what it was and what replaces it."""
    name = section.get("name") if isinstance(section, Mapping) else None
    which = f"auth-provider {name!r}" if isinstance(name, str) else "auth-provider"
    return ConfigError(
        f"kubeconfig: user {user!r}: {which} is not supported (removed from kubectl); "
        "use an exec credential plugin (users[].user.exec) instead"
    )


def parse_exec_section(section: object, user: str) -> ExecPlugin:
    """The `ExecPlugin` of a kubeconfig user's `exec` mapping, checked as client-go does."""
    where = f"kubeconfig: user {user!r}: exec"
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    command = section.get("command")
    if not isinstance(command, str) or not command:
        raise ConfigError(f"{where}: command is required")
    api_version = section.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ConfigError(
            f"{where}: apiVersion {api_version!r} is not supported (use {V1} or {V1BETA1})"
        )
    mode = section.get("interactiveMode")
    if mode is None and api_version == V1:
        raise ConfigError(f"{where}: interactiveMode is required in {V1} (use Never)")
    if mode not in (None, "Never", "IfAvailable", "Always"):
        raise ConfigError(f"{where}: interactiveMode {mode!r} is not Never, IfAvailable or Always")
    if mode == "Always":
        # akri-trio's commands run plugins without a terminal (daemons never have one).
        raise ConfigError(f"{where}: interactiveMode Always needs a terminal; use Never")
    args = section.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: args must be a list of strings")
    env: list[tuple[str, str]] = []
    for entry in section.get("env") or []:
        if not (
            isinstance(entry, Mapping)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("value"), str)
        ):
            raise ConfigError(f"{where}: env entries need a name and a value (strings)")
        env.append((entry["name"], entry["value"]))
    provide = section.get("provideClusterInfo", False)
    if not isinstance(provide, bool):
        raise ConfigError(f"{where}: provideClusterInfo must be true or false")
    hint = section.get("installHint")
    return ExecPlugin(
        user=user,
        command=command,
        api_version=api_version,
        args=tuple(args),
        env=tuple(env),
        provide_cluster_info=provide,
        install_hint=hint.strip() if isinstance(hint, str) else "",
    )


def exec_info(
    plugin: ExecPlugin, *, server: str, ca_pem: bytes | None, insecure: bool
) -> dict[str, Any]:
    """KUBERNETES_EXEC_INFO: the ExecCredential a plugin reads to learn how it is run."""
    spec: dict[str, Any] = {"interactive": False}
    if plugin.provide_cluster_info:
        cluster: dict[str, Any] = {"server": server}
        if ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
        if insecure:
            cluster["insecure-skip-tls-verify"] = True
        spec["cluster"] = cluster
    return {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec}


def parse_exec_output(out: bytes, plugin: ExecPlugin, *, now: float) -> Credential:
    """The `Credential` in a plugin's stdout, or a one-line `ConfigError` saying what is wrong."""
    where = f"kubeconfig: {plugin.name}"
    try:
        doc = json.loads(out)
    except ValueError:
        raise ConfigError(f"{where} printed no JSON ExecCredential") from None
    if not isinstance(doc, Mapping) or doc.get("kind") != "ExecCredential":
        raise ConfigError(f"{where} printed JSON that is not an ExecCredential")
    if doc.get("apiVersion") != plugin.api_version:
        raise ConfigError(
            f"{where} answered apiVersion {doc.get('apiVersion')!r}, "
            f"the kubeconfig asks for {plugin.api_version}"
        )
    status = doc.get("status")
    if not isinstance(status, Mapping):
        raise ConfigError(f"{where} answered no status")
    token = status.get("token")
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if token is not None and not (isinstance(token, str) and token):
        raise ConfigError(f"{where} answered a status.token that is not a string")
    if bool(cert) != bool(key) or not all(isinstance(v, str | None) for v in (cert, key)):
        raise ConfigError(
            f"{where} must answer clientCertificateData and clientKeyData together, as strings"
        )
    if not token and not cert:
        raise ConfigError(f"{where} answered neither status.token nor a client certificate")
    return Credential(
        token=token or None,
        client_cert_pem=cert.encode() if cert else None,
        client_key_pem=key.encode() if key else None,
        obtained_at=now,
        expires_at=_timestamp(status.get("expirationTimestamp"), where),
    )


def _timestamp(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            stamp = None
        if stamp is not None and stamp.tzinfo is not None:
            return stamp.timestamp()
    raise ConfigError(f"{where} answered an expirationTimestamp that is not RFC 3339: {value!r}")


def refresh_due(cred: Credential | None, now: float) -> bool:
    """Whether `cred` must be replaced before the next request is sent."""
    if cred is None:
        return True
    if cred.expires_at is None:
        return False
    margin = min(REFRESH_MARGIN_S, max(0.0, cred.expires_at - cred.obtained_at) / 2)
    return now >= cred.expires_at - margin
