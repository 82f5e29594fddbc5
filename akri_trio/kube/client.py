"""The Kubernetes API verbs over httpx, on plain JSON dicts.

Why our own client: the official SDK is synchronous and generated, and the async ports bring
their own event loop assumptions; we need trio-native cancellation (a cancelled watch must drop
its connection at once), typed errors, and only the dozen verbs the agent and controller use.

A resource type is a small frozen `Resource` descriptor (akri_trio.address) rather than a class
per kind, so CRDs and core types are addressed the same way. Objects stay `dict[str, Any]`;
typed models are built on top (akri_trio/model).

Namespaces: single-object verbs take `namespace=`, else the object's own
`metadata.namespace`, else the config's default namespace. `list` and `watch` with
`namespace=None` span all namespaces, which is what controllers want.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any

import attrs
import httpx

from akri_trio.address import Resource as Resource  # re-exported: callers address types here
from akri_trio.kube.config import KubeConfig, http_client, load_config
from akri_trio.kube.errors import error_from_response

JSON = dict[str, Any]

PATCH_MERGE = "application/merge-patch+json"
PATCH_JSON = "application/json-patch+json"
PATCH_STRATEGIC = "application/strategic-merge-patch+json"
# The apply content type is YAML, of which JSON is a subset, so we send JSON.
PATCH_APPLY = "application/apply-patch+yaml"

DEFAULT_PAGE_SIZE = 500

# The API server answers every ordinary request within its --request-timeout (60 s unless set
# otherwise), with a 504 when its own deadline passes. A write is given longer than that: a
# client that gives up first leaves the server applying a write nobody waits for (it counts a
# 500, "context canceled", and the write may still land), which the caller then retries — so
# under load the work doubles instead of the latency growing. Reads keep the shorter default.
APISERVER_REQUEST_TIMEOUT_S = 60.0
WRITE_READ_TIMEOUT_S = APISERVER_REQUEST_TIMEOUT_S + 15.0
READ_METHODS = frozenset({"GET", "HEAD"})
# How many parsed request URLs a client keeps (see Client._url): a node's few hundred objects.
URL_CACHE_SIZE = 1024


def write_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    """`timeout` with a read timeout that outlasts the API server's own request deadline."""
    return httpx.Timeout(
        connect=timeout.connect,
        read=max(timeout.read or 0.0, WRITE_READ_TIMEOUT_S),
        write=timeout.write,
        pool=timeout.pool,
    )


@attrs.frozen
class ListPage:
    items: list[JSON]
    resource_version: str
    continue_token: str | None


@attrs.frozen
class ObjectList:
    """All items of a (possibly paginated) list, and the resourceVersion to watch from."""

    items: list[JSON]
    resource_version: str


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    params = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


class Client:
    """Verbs against one API server. Cheap to share; all methods are safe to call concurrently."""

    def __init__(self, http: httpx.AsyncClient, *, default_namespace: str = "default") -> None:
        self.http = http
        self.default_namespace = default_namespace
        self._urls: dict[tuple[str, tuple[tuple[str, str], ...]], httpx.URL] = {}

    @classmethod
    @asynccontextmanager
    async def open(cls, config: KubeConfig | None = None) -> AsyncIterator[Client]:
        """A client for `config` (default: `load_config()`); the HTTP pool closes on exit."""
        cfg = config if config is not None else load_config()
        async with http_client(cfg) as http:
            yield cls(http, default_namespace=cfg.namespace)

    # --- plumbing ----------------------------------------------------------------------------

    def _namespace(
        self, res: Resource, namespace: str | None, obj: Mapping[str, Any] | None = None
    ) -> str | None:
        if not res.namespaced:
            return None
        if namespace is not None:
            return namespace
        from_obj = (obj or {}).get("metadata", {}).get("namespace")
        return str(from_obj) if from_obj else self.default_namespace

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One request; a JSON answer, or the typed `ApiError` for its `Status`."""
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else None
        timeout = self.http.timeout if method in READ_METHODS else write_timeout(self.http.timeout)
        response = await self.http.request(
            method,
            self._url(path, params),
            content=content,
            headers=headers,
            timeout=timeout,
        )
        if response.status_code >= 400:
            raise error_from_response(
                response.status_code,
                response.content,
                retry_after=response.headers.get("Retry-After"),
            )
        decoded = response.json()
        if not isinstance(decoded, dict):
            raise ValueError(f"{method} {path}: expected a JSON object, got {type(decoded)}")
        return decoded

    def _url(self, path: str, params: Mapping[str, str] | None) -> httpx.URL:
        """The absolute URL of `path?params`, parsed once: httpx parses and validates a URL
        given as text on every request, character by character, which was the largest part
        of a claim's own CPU (the same Instance's URL, Allocate after Allocate). A URL object
        passes through unparsed."""
        key = (path, tuple(sorted(params.items())) if params else ())
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= URL_CACHE_SIZE:
                self._urls.clear()
            url = self._urls[key] = self.http.build_request("GET", path, params=params).url
        return url

    # --- verbs -------------------------------------------------------------------------------

    async def get(
        self,
        res: Resource,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        path = res.path(self._namespace(res, namespace), name, subresource)
        return await self.request("GET", path)

    async def list_page(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
    ) -> ListPage:
        """One page of a list. A stale `continue_token` raises `Gone`: start over."""
        params = _selectors(label_selector, field_selector)
        if limit is not None:
            params["limit"] = str(limit)
        if continue_token:
            params["continue"] = continue_token
        elif resource_version is not None:
            # The server rejects resourceVersion together with continue; the token encodes it.
            params["resourceVersion"] = resource_version
        answer = await self.request("GET", res.path(namespace), params=params)
        meta = answer.get("metadata") or {}
        items = answer.get("items") or []
        # List items carry no apiVersion/kind; fill them in so every object is self-describing.
        for item in items:
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return ListPage(
            items=items,
            resource_version=str(meta.get("resourceVersion") or ""),
            continue_token=meta.get("continue") or None,
        )

    async def list(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> ObjectList:
        """Every matching object, fetched `page_size` at a time, as one consistent snapshot."""
        items: list[JSON] = []
        token: str | None = None
        while True:
            page = await self.list_page(
                res,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                continue_token=token,
            )
            items.extend(page.items)
            token = page.continue_token
            if not token:
                return ObjectList(items, page.resource_version)

    async def create(
        self,
        res: Resource,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        params = {"fieldManager": field_manager} if field_manager else {}
        path = res.path(self._namespace(res, namespace, obj))
        return await self.request("POST", path, params=params, body=_with_type(res, obj))

    async def replace(
        self,
        res: Resource,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        """PUT the whole object; with `metadata.resourceVersion` set, a stale one -> `Conflict`."""
        name = _name(obj)
        params = {"fieldManager": field_manager} if field_manager else {}
        path = res.path(self._namespace(res, namespace, obj), name, subresource)
        return await self.request("PUT", path, params=params, body=_with_type(res, obj))

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        *,
        content_type: str = PATCH_MERGE,
        namespace: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        """A PATCH of any type; see `merge_patch`, `json_patch` and `apply` for the usual ones."""
        params = {"fieldManager": field_manager} if field_manager else {}
        path = res.path(self._namespace(res, namespace), name, subresource)
        return await self.request(
            "PATCH", path, params=params, body=patch, content_type=content_type
        )

    async def merge_patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        """RFC 7386: maps merge, `None` deletes a key, lists are replaced whole."""
        return await self.patch(
            res,
            name,
            patch,
            content_type=PATCH_MERGE,
            namespace=namespace,
            subresource=subresource,
            field_manager=field_manager,
        )

    async def json_patch(
        self,
        res: Resource,
        name: str,
        operations: Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        """RFC 6902 operations; a failing `test` op gives `Invalid` (422)."""
        return await self.patch(
            res,
            name,
            operations,
            content_type=PATCH_JSON,
            namespace=namespace,
            subresource=subresource,
            field_manager=field_manager,
        )

    async def apply(
        self,
        res: Resource,
        obj: Mapping[str, Any],
        *,
        field_manager: str,
        force: bool = False,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        """Server-side apply: `obj` is the full intent of `field_manager`. Fields another
        manager owns and we change raise `Conflict` unless `force`, which takes them over."""
        params = {"fieldManager": field_manager}
        if force:
            params["force"] = "true"
        path = res.path(self._namespace(res, namespace, obj), _name(obj), subresource)
        return await self.request(
            "PATCH", path, params=params, body=_with_type(res, obj), content_type=PATCH_APPLY
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: str | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> JSON:
        """Delete; returns the object (still there while finalizers run) or a success `Status`.
        `resource_version`/`uid` are preconditions: a mismatch raises `Conflict`."""
        options: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {
            k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v is not None
        }
        if preconditions:
            options["preconditions"] = preconditions
        path = res.path(self._namespace(res, namespace), name)
        return await self.request("DELETE", path, body=options)

    @asynccontextmanager
    async def watch_stream(
        self,
        res: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 290,
        read_timeout: float | None = None,
    ) -> AsyncIterator[AsyncIterator[JSON]]:
        """One watch request: yields an iterator of raw events (`{"type", "object"}`).

        The server ends the stream after `timeout_seconds`; the read timeout defaults to a
        little more, so a silently dead connection is noticed. Leaving the block (including by
        cancellation) closes the connection at once. An HTTP error raises the typed `ApiError`
        (a `Gone` for a too-old `resource_version`).
        """
        params = _selectors(label_selector, field_selector)
        params.update(
            watch="true",
            resourceVersion=resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(timeout_seconds),
        )
        read = read_timeout if read_timeout is not None else timeout_seconds + 15.0
        timeout = self.http.timeout
        timeout = httpx.Timeout(
            connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool
        )
        async with self.http.stream(
            "GET", res.path(namespace), params=params, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                body = await response.aread()
                raise error_from_response(
                    response.status_code, body, retry_after=response.headers.get("Retry-After")
                )
            lines: AsyncGenerator[str, None] = response.aiter_lines()  # type: ignore[assignment]
            async with aclosing(lines):
                yield _Events(lines)


class _Events:
    """Decodes NDJSON lines into event dicts. A class, not an async generator, so nothing is
    left for the garbage collector to finalize when the stream closes mid-iteration."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> JSON:
        while True:
            line = await self._lines.__anext__()
            if line.strip():
                break
        event = json.loads(line)
        if not isinstance(event, dict):
            raise ValueError(f"watch: expected an event object, got {line[:200]!r}")
        return event


def _name(obj: Mapping[str, Any]) -> str:
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("object has no metadata.name")
    return name


def _with_type(res: Resource, obj: Mapping[str, Any]) -> JSON:
    """The body with apiVersion/kind filled in (the server requires them for PUT and apply)."""
    return {"apiVersion": res.api_version, "kind": res.kind, **obj}
