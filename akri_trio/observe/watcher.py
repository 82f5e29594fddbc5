"""The objects `picture` needs, fetched once (`fetch`) or kept current by watches (`ClusterWatch`).

`akri-trio status` lists once; `status --watch` and the dashboard keep one store per resource
with our watch (resume, relist on 410) and redraw when any of them changes. Pods are watched in
every namespace even with `-n`: a Pod anywhere may hold a slot of an Instance in `-n`'s
namespace. Read-only: nothing here writes to the cluster.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio

from akri_trio.kube import Client, Forbidden, Resource, Store, drop_managed_fields, reflect
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.observe.picture import LABEL_CONFIGURATION, picture
from akri_trio.runtime import Changed

PODS = Resource.core("pods", "Pod")
NODES = Resource.core("nodes", "Node", namespaced=False)
JOBS = Resource("batch", "v1", "jobs", "Job")
# Redraws are coalesced: a burst of changes (a relist, a Configuration with 50 Instances
# appearing) is one redraw after this long, not fifty.
SETTLE_S = 0.05


@attrs.frozen
class Source:
    resource: Resource
    cluster_wide: bool = False  # watched in every namespace whatever -n says
    label_selector: str | None = None


SOURCES = {
    "configurations": Source(CONFIGURATIONS),
    "instances": Source(INSTANCES),
    "pods": Source(PODS, cluster_wide=True),
    "jobs": Source(JOBS, label_selector=LABEL_CONFIGURATION),
    "nodes": Source(NODES, cluster_wide=True),
}


async def fetch(api: Client, namespace: str | None) -> tuple[dict[str, Any], list[str]]:
    """The picture from one list of each resource, and notes on what could not be read."""
    lists: dict[str, list[Any]] = {}
    notes: list[str] = []
    for name, source in SOURCES.items():
        ns = None if source.cluster_wide else namespace
        try:
            found = await api.list(
                source.resource, namespace=ns, label_selector=source.label_selector
            )
        except Forbidden as exc:
            if name in ("configurations", "instances"):
                raise
            notes.append(f"not shown: {name} ({exc})")
            found = None
        lists[name] = [] if found is None else list(found.items)
    return picture(**lists), notes


async def check_access(api: Client, namespace: str | None) -> None:
    """List Configurations and Instances once (one item each): a missing CRD or an RBAC
    refusal is then an error at start, not a watch that retries forever behind a blank view."""
    for resource in (CONFIGURATIONS, INSTANCES):
        await api.list_page(resource, namespace=namespace, limit=1)


class ClusterWatch:
    """One store per resource, kept by watches; `changes()` yields a picture per settled burst."""

    def __init__(self, api: Client, namespace: str | None) -> None:
        self.api = api
        self.namespace = namespace
        self.stores = {name: Store(transform=drop_managed_fields) for name in SOURCES}
        self._changed = Changed()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled; started once every store has its first list."""
        await check_access(self.api, self.namespace)
        async with trio.open_nursery() as nursery:
            for name, source in SOURCES.items():
                store = self.stores[name]
                nursery.start_soon(
                    functools.partial(
                        reflect,
                        self.api,
                        source.resource,
                        store,
                        namespace=None if source.cluster_wide else self.namespace,
                        label_selector=source.label_selector,
                    )
                )
                nursery.start_soon(self._notice, store)
            for store in self.stores.values():
                await store.wait_synced()
            task_status.started()

    async def _notice(self, store: Store) -> None:
        with store.subscribe() as changes:
            async for _ in changes:
                self._changed.bump()

    def picture(self) -> dict[str, Any]:
        return picture(**{name: store.snapshot().values() for name, store in self.stores.items()})

    async def changes(self) -> AsyncIterator[dict[str, Any]]:
        """The current picture, then a new one after each burst of changes (never two equal
        pictures in a row: a Pod's status heartbeat that changes nothing shown is skipped)."""
        seen = self._changed.version
        last = self.picture()
        yield last
        while True:
            await self._changed.wait_past(seen)
            await trio.sleep(SETTLE_S)
            seen = self._changed.version
            now = self.picture()
            if now != last:
                last = now
                yield now
