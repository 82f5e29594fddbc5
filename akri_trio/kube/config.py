"""Where the API server is and how to prove who we are: kubeconfig files and in-cluster accounts.

The agent runs in a pod (service account token, rotated by the kubelet), the controller too,
and developers and tests run from a kubeconfig; all of them end up as one `KubeConfig` value and
one `httpx.AsyncClient`. Parsing is a pure function of the YAML document (plus reads of the
files it names), so it is tested with files in a temp dir; the only live piece is
`TokenFileAuth`, which re-reads a projected token so rotation never needs a restart.

Load order follows kubectl: an explicit path, then $KUBECONFIG (a path list, merged with the
first file winning), then the in-cluster service account, then ~/.kube/config.

A user's `exec` credential plugin (managed clusters: EKS, GKE, AKS) is parsed here into an
`ExecPlugin` and run by `exec_auth.ExecAuth`, the client's auth, when requests need it.

Not supported (rejected with `ConfigError`, never silently ignored): the legacy auth-provider
plugins (the error names `exec` as their replacement), proxies named in the kubeconfig.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx

from akri_trio.kube.errors import ConfigError as ConfigError  # re-exported: its old home
from akri_trio.kube.exec_auth import ExecAuth
from akri_trio.kube.exec_credential import (
    ExecPlugin,
    auth_provider_refused,
    exec_info,
    parse_exec_section,
)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# The API server closes a watch after the timeoutSeconds we ask for (~290 s); the watch driver
# sets its own read timeout per request. These are for ordinary verbs (a write waits longer for
# its answer: kube.client.write_timeout).
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)


@attrs.frozen
class KubeConfig:
    """Everything needed to talk to one API server as one identity."""

    server: str
    namespace: str = "default"
    ca_pem: bytes | None = attrs.field(default=None, repr=False)
    insecure_skip_tls_verify: bool = False
    # kubeconfig's tls-server-name: the name to check the serving certificate for (and send
    # as SNI) when `server` is an address the certificate does not name.
    tls_server_name: str | None = None
    client_cert_pem: bytes | None = attrs.field(default=None, repr=False)
    client_key_pem: bytes | None = attrs.field(default=None, repr=False)
    token: str | None = attrs.field(default=None, repr=False)
    token_file: Path | None = None
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    exec_plugin: ExecPlugin | None = None


# --- kubeconfig ------------------------------------------------------------------------------


def _named(doc: Mapping[str, Any], section: str, inner: str) -> dict[str, Mapping[str, Any]]:
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise ConfigError(f"kubeconfig: {section} must be a list")
    out: dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            out.setdefault(entry["name"], entry.get(inner) or {})
    return out


def _data_or_file(
    section: Mapping[str, Any], key: str, base_dir: Path, read: Callable[[Path], bytes]
) -> bytes | None:
    """`<key>-data` (base64, wins like in kubectl) or `<key>` (a path, relative to the file)."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"kubeconfig: {key}-data is not base64") from exc
    path = section.get(key)
    if path:
        file = base_dir / Path(os.path.expanduser(str(path)))
        try:
            return read(file)
        except OSError as exc:
            raise ConfigError(f"kubeconfig: {key} {file}: {exc.strerror or exc}") from exc
    return None


def parse_kubeconfig(
    doc: Mapping[str, Any],
    *,
    base_dir: Path,
    context: str | None = None,
    read: Callable[[Path], bytes] = Path.read_bytes,
) -> KubeConfig:
    """The `KubeConfig` for `context` (default: current-context) of a decoded kubeconfig.

    Relative file names resolve against `base_dir` (the kubeconfig's directory), as in kubectl.
    """
    name = context or doc.get("current-context")
    if not name:
        raise ConfigError("kubeconfig: no context given and no current-context")
    contexts = _named(doc, "contexts", "context")
    if name not in contexts:
        raise ConfigError(f"kubeconfig: context {name!r} not found")
    ctx = contexts[name]
    clusters = _named(doc, "clusters", "cluster")
    users = _named(doc, "users", "user")
    cluster_name = ctx.get("cluster")
    if cluster_name not in clusters:
        raise ConfigError(f"kubeconfig: cluster {cluster_name!r} of context {name!r} not found")
    cluster = clusters[cluster_name]
    user_name = ctx.get("user")
    if user_name is not None and user_name not in users:
        raise ConfigError(f"kubeconfig: user {user_name!r} of context {name!r} not found")
    user = users.get(user_name, {}) if user_name is not None else {}

    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise ConfigError(f"kubeconfig: cluster {cluster_name!r} has no server")
    if cluster.get("proxy-url"):
        raise ConfigError("kubeconfig: proxy-url is not supported")
    if user.get("auth-provider"):
        raise auth_provider_refused(user_name, user["auth-provider"])
    plugin = parse_exec_section(user["exec"], str(user_name)) if user.get("exec") else None

    skip_verify = _skip_verify(cluster, cluster_name)
    if skip_verify and (
        cluster.get("certificate-authority") or cluster.get("certificate-authority-data")
    ):
        # kubectl refuses this pair too: which of the two was meant is anyone's guess.
        raise ConfigError(
            f"kubeconfig: cluster {cluster_name!r}: certificate-authority and "
            "insecure-skip-tls-verify must not both be set"
        )
    token_file = user.get("tokenFile")
    return KubeConfig(
        server=server.rstrip("/"),
        namespace=str(ctx.get("namespace") or "default"),
        ca_pem=_data_or_file(cluster, "certificate-authority", base_dir, read),
        insecure_skip_tls_verify=skip_verify,
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        client_cert_pem=_data_or_file(user, "client-certificate", base_dir, read),
        client_key_pem=_data_or_file(user, "client-key", base_dir, read),
        token=str(user["token"]) if user.get("token") else None,
        token_file=base_dir / os.path.expanduser(str(token_file)) if token_file else None,
        username=str(user["username"]) if user.get("username") else None,
        password=str(user["password"]) if user.get("password") else None,
        exec_plugin=plugin,
    )


def _skip_verify(cluster: Mapping[str, Any], name: object) -> bool:
    """`insecure-skip-tls-verify` as a real boolean. kubectl's decoder refuses anything else,
    and so do we: `bool("false")` is True, which would turn verification off by accident."""
    value = cluster.get("insecure-skip-tls-verify")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(
            f"kubeconfig: cluster {name!r}: insecure-skip-tls-verify must be true or false, "
            f"got {value!r}"
        )
    return value


def _check_clusters(doc: Mapping[str, Any], path: Path) -> None:
    """Type-check every cluster of one file, used or not, as kubectl's decoder does."""
    for entry in doc.get("clusters") or []:
        if isinstance(entry, Mapping) and isinstance(entry.get("cluster"), Mapping):
            try:
                _skip_verify(entry["cluster"], entry.get("name"))
            except ConfigError as exc:
                raise ConfigError(f"{path}: {exc}") from None


def merge_kubeconfigs(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """kubectl's merge of a $KUBECONFIG list: the first file to define a name (or
    current-context) wins. Paths inside stay relative to their own file; callers resolve them
    before merging (see `load_kubeconfig`)."""
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": []}
    seen: dict[str, set[str]] = {k: set() for k in merged}
    for doc in docs:
        if not merged.get("current-context") and doc.get("current-context"):
            merged["current-context"] = doc["current-context"]
        for section in seen:
            for entry in doc.get(section) or []:
                name = entry.get("name") if isinstance(entry, Mapping) else None
                if isinstance(name, str) and name not in seen[section]:
                    seen[section].add(name)
                    merged[section].append(entry)
    return merged


_PATH_KEYS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}


def _absolutize(doc: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    """A copy of `doc` with every relative file name made absolute against `base_dir`."""
    out = dict(doc)
    for section, inner in (("clusters", "cluster"), ("users", "user")):
        entries = []
        for entry in doc.get(section) or []:
            if isinstance(entry, Mapping) and isinstance(entry.get(inner), Mapping):
                body = dict(entry[inner])
                for key in _PATH_KEYS[inner]:
                    if isinstance(body.get(key), str):
                        body[key] = str(base_dir / os.path.expanduser(body[key]))
                body = _absolutize_exec_command(body, base_dir)
                entry = {**entry, inner: body}
            entries.append(entry)
        out[section] = entries
    return out


def _absolutize_exec_command(user: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """An exec command with a slash in it is a path relative to its kubeconfig (client-go's
    rule); a bare name is looked up on PATH when it runs."""
    section = user.get("exec")
    if not isinstance(section, Mapping):
        return user
    command = section.get("command")
    if isinstance(command, str) and "/" in command and not os.path.isabs(command):
        return {**user, "exec": {**section, "command": str(base_dir / command)}}
    return user


def load_kubeconfig(paths: Sequence[Path], *, context: str | None = None) -> KubeConfig:
    # Imported here: a Pod's in-cluster config reads no YAML, and PyYAML is 0.7 MB of RSS.
    import yaml

    docs = []
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            continue  # kubectl skips missing entries of a $KUBECONFIG list
        except yaml.YAMLError as exc:
            # One line: the first carries the position, the rest is an excerpt.
            raise ConfigError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from exc
        if not isinstance(doc, Mapping):
            raise ConfigError(f"{path}: not a kubeconfig mapping")
        _check_clusters(doc, path)
        docs.append(_absolutize(doc, path.resolve().parent))
    if not docs:
        raise ConfigError(f"no kubeconfig found in {[str(p) for p in paths]}")
    cfg = parse_kubeconfig(merge_kubeconfigs(docs), base_dir=Path("/"), context=context)
    ssl_context(cfg)  # unreadable CA data or client identity fails here, before any startup
    return cfg


# --- in-cluster ------------------------------------------------------------------------------


def in_cluster_config(
    sa_dir: Path = SERVICE_ACCOUNT_DIR, env: Mapping[str, str] | None = None
) -> KubeConfig:
    """The pod's own service account. The token is *not* read here: `TokenFileAuth` reads it
    per request (at most once a minute) so a rotated projected token is picked up."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT unset")
    token_file = sa_dir / "token"
    if not token_file.is_file():
        raise ConfigError(f"not in a cluster: {token_file} missing")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    ns_file = sa_dir / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.is_file() else "default"
    ca_file = sa_dir / "ca.crt"
    return KubeConfig(
        server=f"https://{host}:{port}",
        namespace=namespace or "default",
        ca_pem=ca_file.read_bytes() if ca_file.is_file() else None,
        token_file=token_file,
    )


def load_config(
    path: Path | str | None = None,
    *,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
    sa_dir: Path = SERVICE_ACCOUNT_DIR,
    home: Path | None = None,
) -> KubeConfig:
    """kubectl's order: explicit path, $KUBECONFIG, in-cluster, ~/.kube/config."""
    env = os.environ if env is None else env
    if path is not None:
        return load_kubeconfig([Path(path)], context=context)
    if env.get("KUBECONFIG"):
        paths = [Path(p) for p in env["KUBECONFIG"].split(os.pathsep) if p]
        return load_kubeconfig(paths, context=context)
    if env.get("KUBERNETES_SERVICE_HOST") and (sa_dir / "token").is_file():
        return in_cluster_config(sa_dir, env)
    default = (home or Path.home()) / ".kube" / "config"
    if default.is_file():
        return load_kubeconfig([default], context=context)
    raise ConfigError("no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster")


# --- the live pieces -------------------------------------------------------------------------


class TokenFileAuth(httpx.Auth):
    """Bearer auth from a file that the kubelet rotates (projected service account tokens).

    Re-reads the file at most every `max_age` seconds, and at once after a 401 (the token may
    have rotated under us), retrying that request once with the new token. The file is tiny and
    local, so reading it inline in the auth flow is cheaper than a thread hop.
    """

    def __init__(
        self, path: Path, *, max_age: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.max_age = max_age
        self._clock = clock
        self._token: str | None = None
        self._read_at = -float("inf")

    def token(self, *, force: bool = False) -> str:
        now = self._clock()
        if force or self._token is None or now - self._read_at >= self.max_age:
            self._token = self.path.read_text().strip()
            self._read_at = now
        return self._token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        used = self.token()
        request.headers["Authorization"] = f"Bearer {used}"
        response = yield request
        if response.status_code == 401 and self.token(force=True) != used:
            request.headers["Authorization"] = f"Bearer {self._token}"
            yield request


class _ServerNameContext(ssl.SSLContext):
    """Checks the serving certificate for `server_name` (and sends it as SNI) whatever host the
    connection dialled: kubeconfig's tls-server-name. httpx's transports start TLS through
    `wrap_bio` (trio, anyio) or `wrap_socket` (sync), so both are covered."""

    server_name: str

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        kwargs["server_hostname"] = self.server_name
        return super().wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        kwargs["server_hostname"] = self.server_name
        return super().wrap_socket(*args, **kwargs)


def ssl_context(cfg: KubeConfig) -> ssl.SSLContext:
    """The TLS context: cluster CA (or system roots), optional client cert, optional no-verify,
    optional tls-server-name.

    CA data or a client identity that OpenSSL cannot read is a `ConfigError` naming the field,
    not the raw `SSLError` (whose text is OpenSSL's, e.g. "[X509: NO_CERTIFICATE_OR_CRL_FOUND]")."""
    try:
        if cfg.tls_server_name is not None:
            named = _ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)
            named.server_name = cfg.tls_server_name
            ctx: ssl.SSLContext = named
            if cfg.ca_pem:
                ctx.load_verify_locations(cadata=cfg.ca_pem.decode(errors="replace"))
            else:
                ctx.load_default_certs()
        elif cfg.ca_pem:
            ctx = ssl.create_default_context(cadata=cfg.ca_pem.decode(errors="replace"))
        else:
            ctx = ssl.create_default_context()
    except ssl.SSLError as exc:
        raise ConfigError(
            f"kubeconfig: certificate-authority data is not a PEM certificate{_why(exc)}"
        ) from None
    if cfg.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.client_cert_pem or cfg.client_key_pem:
        if not (cfg.client_cert_pem and cfg.client_key_pem):
            raise ConfigError("client certificate and key must be given together")
        load_client_identity(ctx, cfg.client_cert_pem, cfg.client_key_pem)
    return ctx


def load_client_identity(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Make `ctx` present this certificate and key (replacing any it had)."""
    # load_cert_chain only takes file names; the files live just long enough to be read.
    with tempfile.TemporaryDirectory(prefix="akri-trio-tls-") as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        try:
            ctx.load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"kubeconfig: the client certificate and key are not a PEM pair{_why(exc)}"
            ) from None


def _why(exc: ssl.SSLError) -> str:
    return f" ({exc.reason})" if exc.reason else ""


def http_auth(cfg: KubeConfig, tls: ssl.SSLContext | None = None) -> httpx.Auth | None:
    """An exec plugin, when the user names one; else a static token wins over a token file
    (as in kubectl), which wins over basic auth. `tls` is the context an exec plugin's client
    certificate is loaded into (the client's own, so new connections present it)."""
    if cfg.exec_plugin is not None:
        info = exec_info(
            cfg.exec_plugin,
            server=cfg.server,
            ca_pem=cfg.ca_pem,
            insecure=cfg.insecure_skip_tls_verify,
        )
        ctx = tls if tls is not None else ssl_context(cfg)
        return ExecAuth(
            cfg.exec_plugin, exec_info=info, load_identity=partial(load_client_identity, ctx)
        )
    if cfg.token:
        return _StaticBearer(cfg.token)
    if cfg.token_file:
        return TokenFileAuth(cfg.token_file)
    if cfg.username is not None and cfg.password is not None:
        return httpx.BasicAuth(cfg.username, cfg.password)
    return None


class _StaticBearer(httpx.Auth):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._header
        yield request


def http_client(cfg: KubeConfig, *, timeout: httpx.Timeout = DEFAULT_TIMEOUT) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` bound to the server; the caller owns it (`async with`)."""
    tls = ssl_context(cfg)
    return httpx.AsyncClient(
        base_url=cfg.server,
        verify=tls,
        auth=http_auth(cfg, tls),
        headers={"Accept": "application/json", "User-Agent": "akri-trio"},
        timeout=timeout,
        # Environment proxies would capture loopback and in-cluster traffic by surprise.
        trust_env=False,
    )
