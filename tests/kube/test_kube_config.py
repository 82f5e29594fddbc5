"""Kubeconfig and in-cluster parsing, load order, TLS context and token-file auth."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import yaml

from akri_trio.kube.config import (
    ConfigError,
    KubeConfig,
    TokenFileAuth,
    http_auth,
    http_client,
    in_cluster_config,
    load_config,
    load_kubeconfig,
    parse_kubeconfig,
    ssl_context,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed CA-ish cert and its key, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test",
            "-keyout",
            str(d / "k.pem"),
            "-out",
            str(d / "c.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return {"cert": d / "c.pem", "key": d / "k.pem"}


def kubeconfig(
    *,
    clusters: dict[str, Any],
    users: dict[str, Any],
    contexts: dict[str, Any],
    current: str | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": k, "cluster": v} for k, v in clusters.items()],
        "users": [{"name": k, "user": v} for k, v in users.items()],
        "contexts": [{"name": k, "context": v} for k, v in contexts.items()],
    }
    if current:
        doc["current-context"] = current
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def two_contexts(ca_path: str = "ca.crt") -> dict[str, Any]:
    return kubeconfig(
        clusters={
            "a": {"server": "https://a.example:6443/", "certificate-authority": ca_path},
            "b": {"server": "https://b.example", "insecure-skip-tls-verify": True},
        },
        users={"admin": {"token": "t0k"}, "dev": {"tokenFile": "tok"}},
        contexts={
            "ctx-a": {"cluster": "a", "user": "admin", "namespace": "akri"},
            "ctx-b": {"cluster": "b", "user": "dev"},
        },
        current="ctx-a",
    )


def test_current_context_token_and_relative_ca(tmp_path: Path, pki: dict[str, Path]) -> None:
    (tmp_path / "ca.crt").write_bytes(pki["cert"].read_bytes())
    cfg = load_kubeconfig([write(tmp_path / "kc", two_contexts())])
    assert cfg.server == "https://a.example:6443"
    assert cfg.namespace == "akri"
    assert cfg.ca_pem == pki["cert"].read_bytes()
    assert cfg.token == "t0k" and cfg.token_file is None
    assert not cfg.insecure_skip_tls_verify


def test_explicit_context_overrides_current(tmp_path: Path) -> None:
    cfg = load_kubeconfig([write(tmp_path / "kc", two_contexts())], context="ctx-b")
    assert cfg.server == "https://b.example"
    assert cfg.namespace == "default"
    assert cfg.insecure_skip_tls_verify
    assert cfg.token is None and cfg.token_file == tmp_path / "tok"


def test_data_fields_win_over_files() -> None:
    doc = kubeconfig(
        clusters={
            "c": {
                "server": "https://x",
                "certificate-authority": "/nonexistent",
                "certificate-authority-data": base64.b64encode(b"CA").decode(),
            }
        },
        users={
            "u": {
                "client-certificate-data": base64.b64encode(b"CERT").decode(),
                "client-key-data": base64.b64encode(b"KEY").decode(),
            }
        },
        contexts={"x": {"cluster": "c", "user": "u"}},
        current="x",
    )
    cfg = parse_kubeconfig(doc, base_dir=Path("/"))
    assert (cfg.ca_pem, cfg.client_cert_pem, cfg.client_key_pem) == (b"CA", b"CERT", b"KEY")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("current-context"), "no context"),
        (lambda d: d.__setitem__("current-context", "nope"), "context 'nope' not found"),
        (lambda d: d["contexts"][0]["context"].__setitem__("cluster", "zz"), "cluster 'zz'"),
        (lambda d: d["contexts"][0]["context"].__setitem__("user", "zz"), "user 'zz'"),
        (lambda d: d["clusters"][0]["cluster"].pop("server"), "has no server"),
        (lambda d: d["users"][0]["user"].__setitem__("exec", {"command": "x"}), "apiVersion"),
        (lambda d: d["users"][0]["user"].__setitem__("auth-provider", {"name": "gcp"}), "auth-pr"),
        (lambda d: d["clusters"][0]["cluster"].__setitem__("proxy-url", "http://p"), "proxy-url"),
        (lambda d: d["users"][0]["user"].__setitem__("client-key-data", "!!"), "base64"),
    ],
)
def test_bad_kubeconfigs_are_rejected(mutate: Any, message: str) -> None:
    doc = two_contexts("/dev/null")
    mutate(doc)
    with pytest.raises(ConfigError, match=message):
        parse_kubeconfig(doc, base_dir=Path("/"))


def test_kubeconfig_list_merges_first_wins_with_per_file_paths(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    first = kubeconfig(
        clusters={"a": {"server": "https://first", "certificate-authority": "ca"}},
        users={"u": {"token": "first-token"}},
        contexts={"c": {"cluster": "a", "user": "u"}},
        current="c",
    )
    second = kubeconfig(
        clusters={"a": {"server": "https://second"}},
        users={"u": {"token": "second-token"}, "v": {"tokenFile": "tok"}},
        contexts={"c": {"cluster": "a", "user": "v"}, "d": {"cluster": "a", "user": "v"}},
        current="d",
    )
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "ca").write_bytes(pki["cert"].read_bytes())
    paths = [
        write(tmp_path / "one" / "kc", first),
        tmp_path / "missing",  # skipped, as kubectl does
        write(tmp_path / "two" / "kc", second),
    ]
    cfg = load_kubeconfig(paths)
    assert (cfg.server, cfg.token) == ("https://first", "first-token")
    assert cfg.ca_pem == pki["cert"].read_bytes()
    # A context only the second file has; its relative tokenFile resolves against *its* dir.
    cfg = load_kubeconfig(paths, context="d")
    assert cfg.token_file == tmp_path / "two" / "tok"


def test_no_kubeconfig_files_at_all(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no kubeconfig"):
        load_kubeconfig([tmp_path / "nope"])


@pytest.fixture
def sa_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sa"
    d.mkdir()
    (d / "token").write_text("sa-token\n")
    (d / "ca.crt").write_bytes(b"SA CA")
    (d / "namespace").write_text("akri-system")
    return d


def test_in_cluster(sa_dir: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = in_cluster_config(sa_dir, env)
    assert cfg == KubeConfig(
        server="https://10.0.0.1:443",
        namespace="akri-system",
        ca_pem=b"SA CA",
        token_file=sa_dir / "token",
    )
    env["KUBERNETES_SERVICE_HOST"] = "fd00::1"
    assert in_cluster_config(sa_dir, env).server == "https://[fd00::1]:443"


def test_in_cluster_needs_env_and_token(sa_dir: Path) -> None:
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_config(sa_dir, {})
    (sa_dir / "token").unlink()
    with pytest.raises(ConfigError, match="token missing"):
        in_cluster_config(sa_dir, {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"})


def test_load_order(tmp_path: Path, sa_dir: Path) -> None:
    """explicit path > $KUBECONFIG > in-cluster > ~/.kube/config."""

    def server_doc(server: str) -> dict[str, Any]:
        return kubeconfig(
            clusters={"c": {"server": server}},
            users={"u": {}},
            contexts={"x": {"cluster": "c", "user": "u"}},
            current="x",
        )

    explicit = write(tmp_path / "explicit", server_doc("https://explicit"))
    from_env = write(tmp_path / "env", server_doc("https://env"))
    home = tmp_path / "home"
    write(home / ".kube" / "config", server_doc("https://home"))
    in_cluster = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    env = {"KUBECONFIG": str(from_env), **in_cluster}

    def server(path: Path | None, env: dict[str, str]) -> str:
        return load_config(path, env=env, sa_dir=sa_dir, home=home).server

    assert server(explicit, env) == "https://explicit"
    assert server(None, env) == "https://env"
    assert server(None, in_cluster) == "https://10.0.0.1:443"
    assert server(None, {}) == "https://home"
    with pytest.raises(ConfigError):
        load_config(env={}, sa_dir=sa_dir, home=tmp_path / "empty-home")


def test_ssl_context_with_client_cert_from_data(pki: dict[str, Path]) -> None:
    cfg = KubeConfig(
        server="https://x",
        ca_pem=pki["cert"].read_bytes(),
        client_cert_pem=pki["cert"].read_bytes(),
        client_key_pem=pki["key"].read_bytes(),
    )
    ctx = ssl_context(cfg)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "test"),),)]


def test_ssl_context_rejects_half_a_client_identity(pki: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="together"):
        ssl_context(KubeConfig(server="https://x", client_cert_pem=pki["cert"].read_bytes()))


@pytest.mark.parametrize("ca", [b"not a certificate", b"-----BEGIN CERTIFICATE-----\nAAAA\n"])
def test_ca_data_that_is_no_certificate_is_a_config_error(ca: bytes) -> None:
    with pytest.raises(ConfigError, match="certificate-authority data is not a PEM certificate"):
        ssl_context(KubeConfig(server="https://x", ca_pem=ca))


def test_a_client_identity_that_is_no_pem_pair_is_a_config_error(pki: dict[str, Path]) -> None:
    cfg = KubeConfig(
        server="https://x", client_cert_pem=pki["cert"].read_bytes(), client_key_pem=b"garbage"
    )
    with pytest.raises(ConfigError, match="client certificate and key are not a PEM pair"):
        ssl_context(cfg)


def test_ssl_context_insecure() -> None:
    ctx = ssl_context(KubeConfig(server="https://x", insecure_skip_tls_verify=True))
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname


def test_auth_precedence(tmp_path: Path) -> None:
    def header(cfg: KubeConfig) -> str | None:
        auth = http_auth(cfg)
        if auth is None:
            return None
        request = next(auth.auth_flow(httpx.Request("GET", "https://x/api")))
        value: str | None = request.headers.get("Authorization")
        return value

    tok = tmp_path / "tok"
    tok.write_text("from-file\n")
    assert header(KubeConfig(server="s", token="t", token_file=tok)) == "Bearer t"
    assert header(KubeConfig(server="s", token_file=tok)) == "Bearer from-file"
    basic = header(KubeConfig(server="s", username="u", password="p"))
    assert basic == "Basic " + base64.b64encode(b"u:p").decode()
    assert header(KubeConfig(server="s")) is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_file_reread_at_most_every_max_age(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("one")
    clock = FakeClock()
    auth = TokenFileAuth(tok, max_age=60, clock=clock)
    assert auth.token() == "one"
    tok.write_text("two")
    clock.now = 59.9
    assert auth.token() == "one"  # cached
    clock.now = 60.0
    assert auth.token() == "two"


def test_token_file_reread_and_retry_on_401(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("old")
    auth = TokenFileAuth(tok, max_age=3600, clock=FakeClock())
    flow = auth.auth_flow(httpx.Request("GET", "https://x/api"))
    first = next(flow)
    assert first.headers["Authorization"] == "Bearer old"
    tok.write_text("new")  # the kubelet rotated it
    retried = flow.send(httpx.Response(401))
    assert retried.headers["Authorization"] == "Bearer new"
    with pytest.raises(StopIteration):
        flow.send(httpx.Response(200))


def test_token_file_401_with_unchanged_token_is_not_retried(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("same")
    flow = TokenFileAuth(tok).auth_flow(httpx.Request("GET", "https://x/api"))
    next(flow)
    with pytest.raises(StopIteration):
        flow.send(httpx.Response(401))


async def test_http_client_is_bound_to_the_server() -> None:
    cfg = KubeConfig(server="https://k.example:6443", token="t", insecure_skip_tls_verify=True)
    async with http_client(cfg) as client:
        assert str(client.base_url) == "https://k.example:6443"
        assert client.timeout.read == 30.0
        assert client.headers["Accept"] == "application/json"


# ---- insecure-skip-tls-verify is a real boolean (issue 8, item 3) ---------------------------


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1, [], {"a": 1}])
def test_skip_verify_must_be_a_boolean(value: Any) -> None:
    doc = two_contexts()
    doc["clusters"][0]["cluster"] = {"server": "https://a", "insecure-skip-tls-verify": value}
    with pytest.raises(ConfigError, match="insecure-skip-tls-verify must be true or false"):
        parse_kubeconfig(doc, base_dir=Path("/"))


@pytest.mark.parametrize("value", [True, False, None])
def test_skip_verify_booleans_and_null_are_fine(value: Any) -> None:
    doc = two_contexts()
    doc["clusters"][0]["cluster"] = {"server": "https://a", "insecure-skip-tls-verify": value}
    assert parse_kubeconfig(doc, base_dir=Path("/")).insecure_skip_tls_verify is bool(value)


@pytest.mark.parametrize("ca", ["certificate-authority", "certificate-authority-data"])
def test_a_ca_together_with_skip_verify_is_refused(ca: str) -> None:
    doc = two_contexts()
    doc["clusters"][0]["cluster"] = {
        "server": "https://a",
        ca: base64.b64encode(b"CA").decode(),
        "insecure-skip-tls-verify": True,
    }
    with pytest.raises(ConfigError, match="must not both be set"):
        parse_kubeconfig(doc, base_dir=Path("/"))


def test_a_bad_skip_verify_in_an_unused_cluster_fails_the_load(tmp_path: Path) -> None:
    # kubectl decodes the whole file, so a mistyped cluster fails it whatever the context.
    doc = two_contexts()
    doc["clusters"][1]["cluster"]["insecure-skip-tls-verify"] = "false"
    path = write(tmp_path / "kc", doc)
    (tmp_path / "ca.crt").write_bytes(b"CA PEM")
    with pytest.raises(ConfigError, match=f"{path}: .*cluster 'b'.*got 'false'"):
        load_kubeconfig([path])


def test_a_missing_ca_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"certificate-authority .*ca\.crt"):
        load_kubeconfig([write(tmp_path / "kc", two_contexts())])


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        ({"insecure-skip-tls-verify": "false"}, "insecure-skip-tls-verify must be true or false"),
        (
            {"insecure-skip-tls-verify": True, "certificate-authority-data": "Q0E="},
            "must not both be set",
        ),
        (
            {"certificate-authority-data": base64.b64encode(b"not a certificate").decode()},
            "kubeconfig: certificate-authority data is not a PEM certificate",
        ),
    ],
)
def test_the_agent_command_exits_with_one_line(
    tmp_path: Path, cluster: dict[str, Any], expected: str
) -> None:
    doc = kubeconfig(
        clusters={"c": {"server": "https://127.0.0.1:1", **cluster}},
        users={"u": {"token": "t"}},
        contexts={"x": {"cluster": "c", "user": "u"}},
        current="x",
    )
    path = write(tmp_path / "kc", doc)
    done = subprocess.run(
        [sys.executable, "-m", "akri_trio", "agent", "--node-name", "n", "--kubeconfig",
         str(path), "--metrics-port", "-1", "--discovery-handlers-directory", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("akri-trio agent: error: ") and expected in lines[0]


@pytest.fixture(scope="module")
def localhost_only_cert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed serving cert that names `localhost` only (no IP address)."""
    d = tmp_path_factory.mktemp("named")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"),
            *("-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")),
        ],
        check=True,
        capture_output=True,
    )
    return {"cert": d / "c.pem", "key": d / "k.pem"}


def _causes(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `kind` is among `exc`'s causes and contexts."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _serve_one_https(cert: dict[str, Path], task_status: Any) -> None:
    """Answer every request on 127.0.0.1 with 200 over TLS; reports the port."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert["cert"], cert["key"])

    async def answer(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await stream.receive_some(65536)
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    listeners = await trio.open_ssl_over_tcp_listeners(0, server_ctx, host="127.0.0.1")
    transport = listeners[0].transport_listener
    assert isinstance(transport, trio.SocketListener)
    task_status.started(transport.socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


async def test_tls_server_name_checks_the_cert_for_that_name_not_the_dialled_address(
    localhost_only_cert: dict[str, Path],
) -> None:
    """kubeconfig's tls-server-name: dialling 127.0.0.1, whose address the cert does not name,
    verifies against `localhost`; without it the same server is refused."""
    doc = kubeconfig(
        clusters={
            "c": {
                "server": "https://127.0.0.1:1",
                "certificate-authority-data": base64.b64encode(
                    localhost_only_cert["cert"].read_bytes()
                ).decode(),
                "tls-server-name": "localhost",
            }
        },
        users={"u": {"token": "t"}},
        contexts={"x": {"cluster": "c", "user": "u"}},
        current="x",
    )
    named = parse_kubeconfig(doc, base_dir=Path("/"))
    assert named.tls_server_name == "localhost"
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_serve_one_https, localhost_only_cert)
        server = f"https://127.0.0.1:{port}"
        async with http_client(attrs.evolve(named, server=server)) as c:
            assert (await c.get("/readyz")).text == "ok"
        unnamed = attrs.evolve(named, server=server, tls_server_name=None)
        async with http_client(unnamed) as c:
            with pytest.raises(httpx.ConnectError) as refused:
                await c.get("/readyz")
        assert _causes(refused.value, ssl.SSLCertVerificationError)
        nursery.cancel_scope.cancel()
