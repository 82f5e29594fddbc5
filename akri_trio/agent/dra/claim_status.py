"""brokerInfo in DRA mode: each workload's files in its claim's `status.devices` (the I/O edge).

In DRA mode a workload is a prepared claim: Prepare makes its brokerInfo directory (named for
the claim's uid) and mounts it through the claim's CDI spec, and the brokerInfo copier copies
the files into the Instance as in device-plugin mode and hands every running workload's files
here each pass. They go into the claim too, as the `data` of each of its devices of that
Instance (`dra.device_status`, the same `<node>/<file>` keys): a Pod's own claim shows what its
broker wrote.

A claim is read and written only when what this node wants in it changes (and once after the
agent starts, as nothing is remembered across runs): the write reads the claim, keeps the other
nodes' keys (a claim of a shared device may be prepared on several nodes) and applies our
entries on the version read, so a write that raced another is refused (409) and retried on the
next pass, like any failed write. A claim this node wrote and no longer prepares has its keys
removed while it exists; the API server drops `status.devices` itself when the claim is
deallocated.

Rights (with DRAResourceClaimGranularStatusAuthorization, on by default from 1.36): `patch` on
`resourceclaims/status`, and on the synthetic subresource `resourceclaims/driver` named
`akri.sh` the verb `associated-node:patch` (a claim allocated on the agent's own node, when its
token is bound to a Pod there) or `arbitrary-node:patch` (any other: a shared device's claim is
allocated on a node selector).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import attrs
import httpx

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import entry_key
from akri_trio.agent.brokerinfo._sync import Workloads
from akri_trio.agent.dra.preparer import Preparer
from akri_trio.dra import RESOURCE_CLAIMS
from akri_trio.dra.device_status import DeviceKey, apply_body, plan
from akri_trio.kube import ApiError, Client, NotFound

log = logging.getLogger(__name__)

FIELD_MANAGER = "akri-agent-brokerinfo"


@attrs.frozen
class Wanted:
    """This node's part of one claim's `status.devices`: per device, its entries, and the
    Instance each device stands for (whose problems a refused file is)."""

    namespace: str
    name: str
    entries: Mapping[DeviceKey, Mapping[str, str]]
    owners: Mapping[DeviceKey, ObjectKey]


class ClaimStatus:
    def __init__(self, api: Client, node: str, preparer: Preparer) -> None:
        self.api = api
        self.node = node
        self.preparer = preparer
        self.written: dict[str, Wanted] = {}  # claim uid -> what the claim holds of ours
        self._problems: dict[str, dict[ObjectKey, list[str]]] = {}  # per claim uid

    def wanted(self, workloads: Workloads) -> dict[str, Wanted]:
        """claim uid -> this node's part, for the claims prepared here whose Instances'
        directories were read (an Instance left out of `workloads`: keep what was written)."""
        owners = self.preparer.device_owners()
        out: dict[str, Wanted] = {}
        for uid, claim in self.preparer.prepared.items():
            entries: dict[DeviceKey, dict[str, str]] = {}
            of: dict[DeviceKey, ObjectKey] = {}
            for d in claim.devices:
                key = owners.get((d.pool, d.device))
                if key is None or key not in workloads:
                    break
                device = DeviceKey(d.pool, d.device, d.share_id)
                of[device] = key
                files = workloads[key].get(uid, {})
                entries[device] = {entry_key(self.node, n): t for n, t in files.items()}
            else:
                out[uid] = Wanted(claim.namespace, claim.name, entries, of)
        for uid, before in self.written.items():
            if uid not in self.preparer.prepared:
                out[uid] = Wanted(before.namespace, before.name, {}, before.owners)
        return out

    async def report(self, workloads: Workloads) -> dict[ObjectKey, Sequence[str]]:
        """Write what changed; per Instance, the files its claims' status could not take."""
        for uid, want in self.wanted(workloads).items():
            if self.written.get(uid) == want:
                continue
            problems = await self._write(uid, want)
            if problems is not None:
                self._problems[uid] = problems
        for uid in list(self._problems):
            if uid not in self.written and uid not in self.preparer.prepared:
                del self._problems[uid]
        out: dict[ObjectKey, list[str]] = {}
        for problems in self._problems.values():
            for key, found in problems.items():
                out.setdefault(key, []).extend(found)
        return dict(out)

    async def _write(self, uid: str, want: Wanted) -> dict[ObjectKey, list[str]] | None:
        """Apply `want` to the claim; what did not fit, per Instance (None: not written). A
        claim that is gone (or re-created under its name) takes nothing: done as well."""
        try:
            claim = await self.api.get(RESOURCE_CLAIMS, want.name, namespace=want.namespace)
        except NotFound:
            claim = {}
        except (ApiError, httpx.HTTPError) as exc:
            self._failed(want, exc)
            return None
        if (claim.get("metadata") or {}).get("uid") != uid:
            claim = {}
        status = plan(self.node, claim, want.entries)
        if claim and not status.unchanged:
            try:
                await self.api.apply(
                    RESOURCE_CLAIMS,
                    apply_body(claim, status.devices),
                    field_manager=FIELD_MANAGER,
                    force=True,
                    namespace=want.namespace,
                    subresource="status",
                )
            except NotFound:
                pass
            except (ApiError, httpx.HTTPError) as exc:
                self._failed(want, exc)
                return None
        if want.entries:
            self.written[uid] = want
        else:
            self.written.pop(uid, None)
        problems: dict[ObjectKey, list[str]] = {}
        for device, over in status.problems.items():
            if (key := want.owners.get(device)) is not None:
                problems.setdefault(key, []).extend(
                    f"{p} (claim {want.namespace}/{want.name})" for p in over
                )
        return problems

    def _failed(self, want: Wanted, exc: Exception) -> None:
        # Retried on the next pass (a conflict with another node's write, a refusal).
        log.warning(
            "could not write brokerInfo into claim %s/%s: %s", want.namespace, want.name, exc
        )
