"""Our own Kubernetes client on httpx + trio: config, verbs, typed errors, watch, cache, queue.

The agent and the controller import from here; the submodules hold the pieces:
`config` (kubeconfig / in-cluster -> httpx client), `client` (`Client`, `Resource`),
`errors` (`ApiError` and subclasses), `watch` (state machine + driver), `store` (reflector
cache), `queue` (per-key reconcile queue), `backoff` (retry delays).

The shape of a controller loop built from them:

    INSTANCES = Resource("akri.sh", "v0", "instances", "Instance")
    store = Store()
    queue = ReconcileQueue(reconcile_instance, workers=4)   # async (key) -> Requeue | None
    async with Client.open() as client, trio.open_nursery() as nursery:
        with store.subscribe() as changes:      # before the first sync: it reports every key
            nursery.start_soon(reflect, client, INSTANCES, store)
            await nursery.start(queue.run)
            async for key in changes:           # "namespace/name"
                queue.enqueue(key)
"""

from akri_trio.address import ObjectKey
from akri_trio.kube.backoff import Backoff
from akri_trio.kube.client import JSON, Client, ListPage, ObjectList, Resource
from akri_trio.kube.config import ConfigError, KubeConfig, http_client, load_config
from akri_trio.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    MethodNotAllowed,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
)
from akri_trio.kube.queue import ReconcileQueue, Requeue
from akri_trio.kube.store import Store, object_key, reflect
from akri_trio.kube.watch import (
    Apply,
    Delete,
    Init,
    InitApply,
    InitDone,
    WatchEvent,
    open_watch,
    run_watch,
)

__all__ = [
    "JSON",
    "AlreadyExists",
    "ApiError",
    "Apply",
    "Backoff",
    "BadRequest",
    "Client",
    "ConfigError",
    "Conflict",
    "Delete",
    "Forbidden",
    "Gone",
    "Init",
    "InitApply",
    "InitDone",
    "Invalid",
    "KubeConfig",
    "ListPage",
    "MethodNotAllowed",
    "NotFound",
    "ObjectKey",
    "ObjectList",
    "ReconcileQueue",
    "Requeue",
    "Resource",
    "ServerError",
    "Store",
    "TooManyRequests",
    "Unauthorized",
    "WatchEvent",
    "http_client",
    "load_config",
    "object_key",
    "open_watch",
    "reflect",
    "run_watch",
]
