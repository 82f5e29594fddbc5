"""Our own Kubernetes client on httpx + trio: config, verbs, typed errors, watch, cache, queue.

The agent and the controller import from here; the submodules hold the pieces:
`config` (kubeconfig / in-cluster -> httpx client), `client` (`Client`; `Resource` and
`ObjectKey` come from akri_trio.address), `errors` (`ApiError` and subclasses), `watch` (state
machine + driver), `store` (reflector cache with a transform, a decoder and indexes, and the
overlay of our own writes), `queue` (per-key reconcile queue), `controller` (stores + mappers +
queue: the one controller loop), `events` (core/v1 Events, deduplicated and rate-limited, never
blocking). `Backoff` (retry delays) is
akri_trio.runtime's, re-exported here.

The shape of a controller built from them:

    INSTANCES = Resource("akri.sh", "v0", "instances", "Instance")
    instances = Store(transform=drop_managed_fields)
    pods = Store(transform=drop_managed_fields, indexes={"owner": by_owner("Instance")})
    controller = Controller(reconcile_instance, instances).watches(pods, owners("Instance"))
    async with Client.open() as client, trio.open_nursery() as nursery:
        nursery.start_soon(reflect, client, INSTANCES, instances)
        nursery.start_soon(reflect, client, PODS, pods)
        await nursery.start(controller.run)   # async reconcile_instance(key) -> Requeue | None
"""

from akri_trio.address import ObjectKey
from akri_trio.kube.client import JSON, Client, ListPage, ObjectList, Resource
from akri_trio.kube.config import KubeConfig, http_client, load_config
from akri_trio.kube.controller import (
    Controller,
    Mapper,
    Watched,
    each,
    itself,
    labelled,
    owners,
)
from akri_trio.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    ConfigError,
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
from akri_trio.kube.events import EventRecorder, ObjectRef
from akri_trio.kube.queue import ReconcileQueue, Requeue
from akri_trio.kube.store import (
    Change,
    Delivery,
    KeyChanges,
    Overlay,
    Store,
    Written,
    by_field,
    by_label,
    by_owner,
    drop_managed_fields,
    reflect,
)
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
from akri_trio.runtime import Backoff

__all__ = [
    "JSON",
    "AlreadyExists",
    "ApiError",
    "Apply",
    "Backoff",
    "BadRequest",
    "Change",
    "Client",
    "ConfigError",
    "Conflict",
    "Controller",
    "Delete",
    "Delivery",
    "EventRecorder",
    "Forbidden",
    "Gone",
    "Init",
    "InitApply",
    "InitDone",
    "Invalid",
    "KeyChanges",
    "KubeConfig",
    "ListPage",
    "Mapper",
    "MethodNotAllowed",
    "NotFound",
    "ObjectKey",
    "ObjectList",
    "ObjectRef",
    "Overlay",
    "ReconcileQueue",
    "Requeue",
    "Resource",
    "ServerError",
    "Store",
    "TooManyRequests",
    "Unauthorized",
    "WatchEvent",
    "Watched",
    "Written",
    "by_field",
    "by_label",
    "by_owner",
    "drop_managed_fields",
    "each",
    "http_client",
    "itself",
    "labelled",
    "load_config",
    "open_watch",
    "owners",
    "reflect",
    "run_watch",
]
