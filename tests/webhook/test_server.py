"""The webhook's edge (akri_trio.webhook.server): routes as a pure function, the OpenAPI loader
under the autojump clock, and the HTTPS server on loopback with a self-made CA."""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from akri_trio.kube import Backoff
from akri_trio.kube.store import Store
from akri_trio.kube.watch import Init, InitApply, InitDone
from akri_trio.webhook import Schemas, ServingCerts, serving_certs
from akri_trio.webhook.cli import parse_serve_args
from akri_trio.webhook.server import (
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    SchemaCache,
    load_schemas,
    route,
    serve_webhook,
    server_ssl_context,
)
from tests.webhook import live
from tests.webhook.schema import DOCUMENT
from tests.webhook.test_validate import VALID

SCHEMAS = Schemas(DOCUMENT)
HOST = "127.0.0.1"


def admission_review(
    obj: Mapping[str, Any], *, version: str = "v1", operation: str = "CREATE"
) -> dict[str, Any]:
    return {
        "apiVersion": f"admission.k8s.io/{version}",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0a1b2c",
            "kind": {"group": "akri.sh", "version": "v0", "kind": "Configuration"},
            "operation": operation,
            "namespace": "cams",
            "name": obj["metadata"]["name"],
            "object": obj,
        },
    }


def with_unknown_container_field() -> dict[str, Any]:
    config = copy.deepcopy(VALID)
    config["spec"]["brokerSpec"]["brokerPodSpec"]["containers"][0]["imagePullPolcy"] = "Always"
    return config


def validate(body: bytes, schemas: Schemas | None = SCHEMAS) -> tuple[int, bytes]:
    reply = route("POST", "/validate", body, schemas)
    return reply.status, reply.body


# ---------------------------------------------------------------------------------------------
# Pure core


def test_healthz_answers_before_the_schema_is_loaded() -> None:
    assert route("GET", "/healthz", b"", None).status == 200


def test_readyz_waits_for_the_schema() -> None:
    before = route("GET", "/readyz", b"", None)
    assert before.status == 503
    assert before.body.startswith(b"not ready")
    assert route("GET", "/readyz", b"", SCHEMAS).status == 200


def test_validate_fails_closed_before_the_schema_is_loaded() -> None:
    body = json.dumps(admission_review(VALID)).encode()
    assert validate(body, None)[0] == 503


def test_unknown_paths_and_methods() -> None:
    assert route("GET", "/", b"", SCHEMAS).status == 404
    post = route("GET", "/validate", b"", SCHEMAS)
    assert (post.status, post.headers) == (405, (("allow", "POST"),))
    put = route("POST", "/readyz", b"", SCHEMAS)
    assert (put.status, put.headers) == (405, (("allow", "GET, HEAD"),))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", b"the body is not JSON: "),
        (b"\xff\xfe", b"the body is not JSON: "),
        (b"[" * 100_000, b"the body is not JSON: "),
        (b"[1, 2]", b"the body is not a JSON object\n"),
        (b'{"kind": "Pod"}', b"not an AdmissionReview of admission.k8s.io/v1 or "),
    ],
)
def test_bad_body_is_a_400_with_a_message(body: bytes, message: bytes) -> None:
    status, text = validate(body)
    assert status == 400
    assert text.startswith(message)


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_allowed_review_echoes_the_uid_in_the_version_asked(version: str) -> None:
    status, body = validate(json.dumps(admission_review(VALID, version=version)).encode())
    assert status == 200
    assert json.loads(body) == {
        "apiVersion": f"admission.k8s.io/{version}",
        "kind": "AdmissionReview",
        "response": {"uid": "0a1b2c", "allowed": True},
    }


def test_denied_review_names_the_field() -> None:
    status, body = validate(json.dumps(admission_review(with_unknown_container_field())).encode())
    assert status == 200
    response = json.loads(body)["response"]
    assert response["uid"] == "0a1b2c"
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["message"] == (
        "Configuration akri-debug-echo-foo is invalid: "
        "spec.brokerSpec.brokerPodSpec.containers[0].imagePullPolcy: unknown field"
    )


# ---------------------------------------------------------------------------------------------
# The OpenAPI loader


async def test_loader_retries_with_backoff_until_the_fetch_succeeds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[float] = []

    async def fetch() -> Mapping[str, Any]:
        calls.append(trio.current_time())
        if len(calls) < 4:
            raise httpx.ConnectError("connection refused")
        return DOCUMENT

    cache = SchemaCache()
    start = trio.current_time()
    await load_schemas(fetch, cache, Backoff(base=1.0, cap=3.0, jitter=0.0))
    assert cache.schemas is not None
    assert cache.schemas.definitions == DOCUMENT["definitions"]
    # 1 s, 2 s, then capped at 3 s between the four attempts.
    assert [t - start for t in calls] == pytest.approx([0, 1, 3, 6])


# ---------------------------------------------------------------------------------------------
# HTTPS on loopback


@pytest.fixture(scope="module")
def certs() -> ServingCerts:
    return serving_certs("akri-webhook", "akri", dt.datetime.now(dt.UTC), ips=(HOST,))


@pytest.fixture
def server_context(certs: ServingCerts, tmp_path: Path) -> ssl.SSLContext:
    (tmp_path / "tls.crt").write_bytes(certs.cert_pem)
    (tmp_path / "tls.key").write_bytes(certs.key_pem)
    return server_ssl_context(tmp_path / "tls.crt", tmp_path / "tls.key")


@attrs.define
class Served:
    port: int
    loaded: trio.Event  # set it to let the OpenAPI fetch finish


@asynccontextmanager
async def running(
    context: ssl.SSLContext,
    request_timeout: float = 10.0,
    idle_timeout: float = 10.0,
    **options: Any,
) -> AsyncIterator[Served]:
    loaded = trio.Event()

    async def fetch() -> Mapping[str, Any]:
        await loaded.wait()
        return DOCUMENT

    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(
            functools.partial(
                serve_webhook,
                HOST,
                0,
                context,
                fetch,
                request_timeout=request_timeout,
                idle_timeout=idle_timeout,
                **options,
            )
        )
        yield Served(port, loaded)
        nursery.cancel_scope.cancel()


def client(port: int, certs: ServingCerts) -> httpx.AsyncClient:
    trusted = ssl.create_default_context(cadata=certs.ca_pem.decode())
    return httpx.AsyncClient(base_url=f"https://{HOST}:{port}", verify=trusted)


async def load(served: Served) -> None:
    """Let the fetch finish; once every task is blocked the loader has stored the schemas."""
    served.loaded.set()
    await trio.testing.wait_all_tasks_blocked()


async def test_https_readiness_follows_the_schema_fetch(
    certs: ServingCerts, server_context: ssl.SSLContext
) -> None:
    async with running(server_context) as served, client(served.port, certs) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 503
        await load(served)
        assert (await http.get("/readyz")).status_code == 200


async def test_names_come_from_the_configurations_watch_and_gate_readiness(
    certs: ServingCerts, server_context: ssl.SSLContext
) -> None:
    listed = trio.Event()
    elsewhere = {**VALID, "metadata": {"name": VALID["metadata"]["name"], "namespace": "team-b"}}

    async def watch(store: Store) -> None:
        await listed.wait()
        for event in (Init(), InitApply(elsewhere), InitDone()):
            store.apply(event)
        await trio.sleep_forever()

    async def fetch() -> Mapping[str, Any]:
        return DOCUMENT

    async with trio.open_nursery() as nursery:
        serve = functools.partial(
            serve_webhook, HOST, 0, server_context, fetch, watch_configurations=watch
        )
        port: int = await nursery.start(serve)
        async with client(port, certs) as http:
            await trio.testing.wait_all_tasks_blocked()
            assert (await http.get("/readyz")).status_code == 503  # schemas in, names not
            listed.set()
            await trio.testing.wait_all_tasks_blocked()
            assert (await http.get("/readyz")).status_code == 200
            answer = (await http.post("/validate", json=admission_review(VALID))).json()
            assert answer["response"]["allowed"] is False
            assert "already exists in namespace team-b" in answer["response"]["status"]["message"]
        nursery.cancel_scope.cancel()


async def test_https_validate_answers_the_review(
    certs: ServingCerts, server_context: ssl.SSLContext
) -> None:
    async with running(server_context) as served, client(served.port, certs) as http:
        await load(served)
        answer = await http.post("/validate", json=admission_review(with_unknown_container_field()))
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json()["response"]["allowed"] is False
        bad = await http.post("/validate", content=b"{nope")
        assert bad.status_code == 400
        assert bad.text.startswith("the body is not JSON")
        # After the 400 closed its connection, the same client is served on a new one.
        assert (await http.post("/validate", json=admission_review(VALID))).status_code == 200


async def test_https_body_over_the_limit_is_a_413_unread(
    certs: ServingCerts, server_context: ssl.SSLContext
) -> None:
    async with running(server_context) as served, client(served.port, certs) as http:
        await load(served)
        big = b" " * (MAX_BODY_BYTES + 1)
        answer = await http.post("/validate", content=big)
        assert answer.status_code == 413
        assert answer.text == f"request body over {MAX_BODY_BYTES} bytes\n"


async def test_tls_client_that_never_handshakes_is_dropped_at_the_idle_timeout(
    autojump_clock: trio.testing.MockClock, certs: ServingCerts, server_context: ssl.SSLContext
) -> None:
    async with running(server_context, request_timeout=30, idle_timeout=7) as served:
        silent = await trio.open_tcp_stream(HOST, served.port)
        start = trio.current_time()
        with trio.fail_after(60):
            assert await silent.receive_some() == b""
        assert trio.current_time() - start == pytest.approx(7)


async def test_cancellation_closes_the_listener(server_context: ssl.SSLContext) -> None:
    async with running(server_context) as served:
        port = served.port
    with pytest.raises(OSError):
        await trio.open_tcp_stream(HOST, port)


async def test_https_refuses_a_handler_outside_its_namespaces(
    certs: ServingCerts, server_context: ssl.SSLContext
) -> None:
    udev = copy.deepcopy(VALID)
    udev["spec"]["discoveryHandler"] = {"name": "udev", "discoveryDetails": "udevRules: []\n"}
    flags = ["--tls-cert-file", "c", "--tls-key-file", "k", "--handler-namespace", "udev:ops"]
    policy = parse_serve_args(flags).handler_namespaces
    async with (
        running(server_context, handler_namespaces=policy) as served,
        client(served.port, certs) as http,
    ):
        await load(served)
        answer = (await http.post("/validate", json=admission_review(udev))).json()["response"]
        assert answer["allowed"] is False
        assert "may not use the udev discovery handler" in answer["status"]["message"]
        allowed = await http.post("/validate", json=admission_review(VALID))
        assert allowed.json()["response"]["allowed"]


async def test_a_review_is_answered_while_512_idle_and_slow_tls_connections_are_open(
    certs: ServingCerts, server_context: ssl.SSLContext
) -> None:
    """More connections than the cap (MAX_CONNECTIONS), idle and slow: the API server's
    AdmissionReview on a new connection is still answered, and the server never holds more
    connections than the cap."""
    async with running(server_context) as served:
        await load(served)
        trusted = ssl.create_default_context(cadata=certs.ca_pem.decode())
        with trio.fail_after(120):  # a hang guard for 512 handshakes on a loaded machine
            held = await live.hold_idle_and_slow(served.port, trusted, 512)
            try:
                async with client(served.port, certs) as http:
                    answer = await http.post("/validate", json=admission_review(VALID))
                assert answer.status_code == 200
                assert answer.json()["response"]["allowed"] is True
                assert await live.still_open(held) <= MAX_CONNECTIONS
            finally:
                for stream in held:
                    await trio.aclose_forcefully(stream)
