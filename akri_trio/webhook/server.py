"""The admission webhook's edge: HTTPS in, AdmissionReview answers out.

The API server calls `POST /validate` for every Configuration CREATE and UPDATE in the
namespaces the ValidatingWebhookConfiguration selects, and with `failurePolicy: Fail` it refuses
the write whenever this server does not answer. So the server must start answering quickly,
never wedge, and survive whatever else on the network connects to it: the request body is
bounded, every exchange (TLS handshake included) has a deadline, and the open connections are
capped. The HTTP/1.1 machinery is the observe endpoint's (`serve_http`); here are only the
routes and the two things the answers need from the cluster: its OpenAPI v2 document and
which namespaces already use a Configuration name.

That document holds the schemas of PodSpec, JobSpec and ServiceSpec for the API server's own
version. It is fetched once at start through our kube client and kept in memory (the core
types change only when the API server is upgraded, and a webhook Pod is restarted far more
often than that). The Configurations' names come from a watch (a store indexed by name). Until
both are loaded (the document fetched, retried with backoff; the watch's first list done),
`/readyz` says so and `/validate` answers 503, which the API server treats as a failure:
nothing is admitted unchecked.

`route` is a pure function of the request, the loaded schemas and a name lookup, tested without
sockets; `serve_webhook` runs the loader, the watch and the server in one nursery, so cancelling
it closes the listener, every connection, the fetch and the watch.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from akri_trio.kube import Backoff, Client, KubeConfig
from akri_trio.kube.store import Store, by_field, drop_managed_fields, reflect
from akri_trio.model.resources import CONFIGURATIONS
from akri_trio.runtime.http import Reply, serve_http
from akri_trio.webhook.certs import PATH
from akri_trio.webhook.openapi import Schemas
from akri_trio.webhook.parsers import builtin_parser
from akri_trio.webhook.validate import (
    BadReview,
    HandlerNamespaces,
    NamespacesUsing,
    ParserFor,
    no_namespaces,
    review,
)

log = logging.getLogger(__name__)

OPENAPI_PATH: Final = "/openapi/v2"
JSON_TYPE: Final = "application/json"
# The API server stores objects of up to 1.5 MiB (etcd's default request limit) and an UPDATE's
# review carries two of them, old and new; a body over this is not from the API server.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
# Each connection may hold a body of MAX_BODY_BYTES while it is read: 32 bound that to 128 MiB,
# and the API server needs only a few at once. A connection over the cap takes the place of an
# idle or slow one (akri_trio.runtime.http.ConnectionCap), so idle clients cannot lock the API
# server out.
MAX_CONNECTIONS: Final = 32
# A failed fetch is retried after 1 s, then less often, up to once a minute.
OPENAPI_BACKOFF: Final = Backoff(base=1.0, cap=60.0)
# Covers one whole exchange, from the request's first byte to the answer's last. The API server
# gives up on its side after the configuration's timeoutSeconds (10 s).
REQUEST_TIMEOUT: Final = 30.0
# A connection waiting for its next request (or its first, the TLS handshake included) is
# closed after this; the API server opens another when it has a review to send.
IDLE_TIMEOUT: Final = 10.0

FetchOpenApi = Callable[[], Awaitable[Mapping[str, Any]]]
WatchConfigurations = Callable[[Store], Awaitable[None]]
BY_NAME: Final = "name"


@attrs.define
class SchemaCache:
    """The cluster's OpenAPI schemas once fetched; None until then (not ready)."""

    schemas: Schemas | None = None


# --------------------------------------------------------------------------------------------
# Pure core


def route(
    method: str,
    target: str,
    body: bytes,
    schemas: Schemas | None,
    parser_for: ParserFor = builtin_parser,
    namespaces_using: NamespacesUsing = no_namespaces,
    handler_namespaces: HandlerNamespaces | None = None,
) -> Reply:
    """The response to one request, given the schemas loaded so far (None: not ready) and
    the namespaces that use a Configuration name."""
    path = target.split("?", 1)[0]
    allowed = {"/healthz": "GET, HEAD", "/readyz": "GET, HEAD", PATH: "POST"}.get(path)
    if allowed is None:
        return Reply(404, b"not found\n")
    if method not in allowed.split(", "):
        return Reply(405, b"method not allowed\n", headers=(("allow", allowed),))
    if path == "/healthz":
        return Reply(200, b"ok\n")
    if schemas is None:
        return Reply(
            503, b"not ready: the cluster's OpenAPI schema or Configurations are not loaded\n"
        )
    if path == "/readyz":
        return Reply(200, b"ok\n")
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return Reply(400, f"the body is not JSON: {exc}\n".encode())
    if not isinstance(decoded, dict):
        return Reply(400, b"the body is not a JSON object\n")
    try:
        answer = review(decoded, schemas, parser_for, namespaces_using, handler_namespaces)
    except BadReview as exc:
        return Reply(400, f"{exc}\n".encode())
    _log_answer(decoded, answer)
    return Reply(200, json.dumps(answer).encode(), content_type=JSON_TYPE)


def _log_answer(request_review: Mapping[str, Any], answer: Mapping[str, Any]) -> None:
    request = request_review.get("request") or {}
    response = answer["response"]
    if not response["allowed"]:
        # The message names the Configuration; a CREATE with generateName has no name yet.
        operation, namespace = request.get("operation"), request.get("namespace")
        log.info("denied %s in %s: %s", operation, namespace, response["status"]["message"])


# --------------------------------------------------------------------------------------------
# I/O shell


def server_ssl_context(cert_file: Path | None, key_file: Path | None) -> ssl.SSLContext:
    """TLS 1.2+ with the serving certificate (none yet without files: rotation.py loads it);
    HTTP/1.1 only (no h2 in ALPN)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def load_schemas(
    fetch: FetchOpenApi, cache: SchemaCache, backoff: Backoff = OPENAPI_BACKOFF
) -> None:
    """Fetch the OpenAPI document into `cache`, retrying with `backoff` until it succeeds."""
    attempt = 0
    while True:
        try:
            document = await fetch()
        except Exception as exc:  # any failure is worth a retry: the API server may be starting
            delay = backoff.delay(attempt)
            log.warning("fetching %s failed (%s); retrying in %.1fs", OPENAPI_PATH, exc, delay)
            attempt += 1
            await trio.sleep(delay)
            continue
        cache.schemas = Schemas(document)
        log.info("loaded %d OpenAPI definitions", len(cache.schemas.definitions))
        return


async def serve_webhook(
    host: str | None,
    port: int,
    ssl_context: ssl.SSLContext,
    fetch: FetchOpenApi,
    *,
    watch_configurations: WatchConfigurations | None = None,
    request_timeout: float = REQUEST_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    backoff: Backoff = OPENAPI_BACKOFF,
    handler_namespaces: HandlerNamespaces | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status.started(bound_port)` once accepting (before the
    schemas are loaded: /readyz tells when they are). With `watch_configurations` (it keeps a
    store in step with the cluster's Configurations), a CREATE of a name another namespace uses
    is refused; without it, names are not checked."""
    cache = SchemaCache()
    names = Store(
        transform=drop_managed_fields,
        indexes={BY_NAME: by_field(lambda obj: obj["metadata"]["name"])},
    )

    def namespaces_using(name: str) -> list[str]:
        return [key.namespace or "" for key in names.keys_for(BY_NAME, name)]

    def respond(method: str, target: str, body: bytes) -> Reply:
        if watch_configurations is None:
            return route(method, target, body, cache.schemas, handler_namespaces=handler_namespaces)
        ready = cache.schemas if names.synced else None
        return route(
            method,
            target,
            body,
            ready,
            namespaces_using=namespaces_using,
            handler_namespaces=handler_namespaces,
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load_schemas, fetch, cache, backoff)
        if watch_configurations is not None:
            nursery.start_soon(watch_configurations, names)
        bound: int = await nursery.start(
            functools.partial(
                serve_http,
                host,
                port,
                respond,
                name="webhook",
                request_timeout=request_timeout,
                idle_timeout=idle_timeout,
                max_body=MAX_BODY_BYTES,
                max_connections=max_connections,
                ssl_context=ssl_context,
            )
        )
        task_status.started(bound)


async def run_webhook(
    kube: KubeConfig,
    ssl_context: ssl.SSLContext,
    host: str | None,
    port: int,
    *,
    request_timeout: float = REQUEST_TIMEOUT,
    handler_namespaces: HandlerNamespaces | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The webhook process: `serve_webhook` with the OpenAPI document fetched through our
    client for `kube` (the TLS files and kube config are read by the caller, so a mistake in
    them fails before anything starts)."""
    async with Client.open(kube) as api:
        await serve_webhook(
            host,
            port,
            ssl_context,
            lambda: api.request("GET", OPENAPI_PATH),
            watch_configurations=functools.partial(reflect, api, CONFIGURATIONS),
            request_timeout=request_timeout,
            handler_namespaces=handler_namespaces,
            idle_timeout=idle_timeout,
            max_connections=max_connections,
            task_status=task_status,
        )
