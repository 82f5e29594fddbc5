"""NodePrepareResources / NodeUnprepareResources behind the kubelet plugin (the I/O edge).

Prepare reads each claim from the API server, keeps the devices of driver `akri.sh`, checks that
this node can stand behind each one and that each stands for an Instance of the claim's own
namespace (`plan.usable_devices`, `dra.resolve`), writes one CDI spec per claim giving the
container what device-plugin mode's Allocate gives, records the claim in the checkpoint, and
answers with the CDI device ids. Unprepare removes the spec and the record.

- Idempotent: a claim already in the checkpoint (with its spec file still there) is answered
  from the checkpoint without reading the API; unpreparing an unknown claim succeeds.
- Survives restarts: the checkpoint is a file in the plugin's directory, written atomically
  (and its directory synced) after the spec, so a prepared claim is never forgotten; a claim
  counts as prepared (or unprepared) only once that write succeeded, so what this run answers
  is what a restarted one reads. A spec without a record (a crash in between, a failed write)
  is rewritten by the retried prepare or removed by unprepare, which goes by uid.
- Bounded: one call is cut after PREPARE_TIMEOUT_S (below the kubelet's 45 s); claims not done
  by then are answered with an error, and the kubelet asks again.
- Serialized: one call at a time, so the checkpoint has one writer.
- Unprepare only (`new_claims=False`, a device-plugin-mode agent after a switch back from DRA
  mode, agent/dra/holdings.py): a claim not in the checkpoint is refused with an error saying
  why; one in it is answered from it, and unprepared as always. `changed` is bumped at every
  change of the record.
- brokerInfo (with `workloads`, the agent's `--broker-info-dir`): each Instance a claim is
  given gets a workload directory named for the claim's uid, mounted into the container by the
  claim's CDI spec as device-plugin mode's Allocate mounts it; `held` tells the copier which
  claims of an Instance are prepared (its workloads that still run).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import attrs
import httpx
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import WorkloadDirs
from akri_trio.agent.dra.plan import usable_devices
from akri_trio.agent.view import NodeView
from akri_trio.dra import (
    RESOURCE_CLAIMS,
    ClaimError,
    cdi_device_id,
    cdi_spec,
    counted_on_node,
    resolve,
    spec_file_name,
)
from akri_trio.dra.checkpoint import (
    BadCheckpoint,
    PreparedClaim,
    PreparedDevice,
    decode,
    encode,
)
from akri_trio.dra.health import DeviceHealth, device_health
from akri_trio.kube import ApiError, Client
from akri_trio.model.device import Mount
from akri_trio.model.edits import ContainerEdits, instance_edits
from akri_trio.model.resources import Instance
from akri_trio.runtime import Changed

log = logging.getLogger(__name__)

PREPARE_TIMEOUT_S = 20.0  # the kubelet gives a call 45 s
CHECKPOINT_FILE = "checkpoint.json"
NO_NEW_CLAIMS = (
    "this node's Akri agent runs in device-plugin mode: it only unprepares the claims it "
    "prepared in DRA mode (ask for akri.sh/... as an extended resource, or switch to DRA mode)"
)


@attrs.frozen
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str


class PrepareError(Exception):
    pass


def write_atomically(path: Path, text: str) -> None:
    """Readers (the runtime's CDI cache, a restarted agent) see the old file or the new one,
    also after a power loss (the file, then its directory's new entry, are synced to disk).
    The temporary name ends in neither .json nor .yaml, so no CDI reader picks it up."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def with_workload(
    edits: ContainerEdits, workloads: WorkloadDirs, inst: Instance, uid: str
) -> ContainerEdits:
    """`edits` plus the brokerInfo directory of the workload `uid` (a claim) of `inst`."""
    mount = workloads.mount(inst, (uid,))
    if mount is None:
        return edits
    return attrs.evolve(
        edits,
        env=(*edits.env, *mount.envs.items()),
        mounts=(*edits.mounts, Mount(mount.container_path, mount.host_path)),
    )


class Preparer:
    def __init__(
        self,
        api: Client,
        view: NodeView,
        *,
        cdi_dir: Path,
        state_dir: Path,
        consumable: bool,
        workloads: WorkloadDirs | None = None,
        new_claims: bool = True,
    ) -> None:
        self.api = api
        self.new_claims = new_claims
        self.changed = Changed()
        self.workloads = workloads
        self.view = view
        self.cdi_dir = cdi_dir
        self.checkpoint = state_dir / CHECKPOINT_FILE
        self.consumable = consumable
        self._lock = trio.Lock()
        self.prepared: dict[str, PreparedClaim] = {}

    def load(self) -> None:
        """Read the checkpoint. A missing one is empty. An unreadable one is moved aside and
        the record starts empty: nothing is lost, since unprepare goes by claim uid and a
        repeated prepare of a live claim reads it again from the API server."""
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.prepared = decode(self.checkpoint.read_text())
        except FileNotFoundError:
            self.prepared = {}
            return
        except BadCheckpoint as exc:
            aside = self.checkpoint.with_name(f"{self.checkpoint.name}.unreadable")
            os.replace(self.checkpoint, aside)
            log.error("DRA checkpoint %s moved to %s: %s", self.checkpoint, aside, exc)
            self.prepared = {}
            return
        log.info("DRA checkpoint: %d prepared claim(s)", len(self.prepared))

    def health(self) -> list[DeviceHealth]:
        """The health of the devices this node serves and has prepared (`dra.health`)."""
        usable = usable_devices(
            self.view.instances(),
            self.view.node,
            lambda key: self.view.device(key) is not None,
            consumable=self.consumable,
        )
        return device_health(usable, self.prepared.values())

    def device_owners(self) -> dict[tuple[str, str], ObjectKey]:
        """(pool, device) -> the Instance it stands for, of every device this node publishes or
        may use, discovered now or not."""
        usable = usable_devices(
            self.view.instances(), self.view.node, lambda _: True, consumable=self.consumable
        )
        return {
            (pool, device): ObjectKey(ref.namespace, ref.instance)
            for pool, devices in usable.items()
            for device, ref in devices.items()
        }

    def held(self) -> dict[ObjectKey, set[str]]:
        """Instance -> the uids of the claims prepared here that hold a device of it: its
        running workloads, as brokerInfo names their directories."""
        owners = self.device_owners()
        out: dict[ObjectKey, set[str]] = {}
        for uid, claim in self.prepared.items():
            for d in claim.devices:
                if (key := owners.get((d.pool, d.device))) is not None:
                    out.setdefault(key, set()).add(uid)
        return out

    def _save(self, prepared: dict[str, PreparedClaim]) -> None:
        """Write `prepared` as the checkpoint, then (not before: a failed write leaves the
        record as it was on disk) take it as this run's record."""
        write_atomically(self.checkpoint, encode(prepared))
        self.prepared = prepared
        self.changed.bump()

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """claim uid -> what was prepared, or why not."""
        return await self._each(claims, self._prepare_one, "prepare")

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        return await self._each(claims, self._unprepare_one, "unprepare")

    async def _each(
        self,
        claims: Sequence[ClaimRef],
        one: Callable[[ClaimRef], Awaitable[PreparedClaim]],
        verb: str,
    ) -> dict[str, PreparedClaim | str]:
        out: dict[str, PreparedClaim | str] = {}
        async with self._lock:
            with trio.move_on_after(PREPARE_TIMEOUT_S):
                for ref in claims:
                    try:
                        out[ref.uid] = await one(ref)
                    except (ClaimError, PrepareError, ApiError, httpx.HTTPError, OSError) as exc:
                        log.warning("%s %s/%s: %s", verb, ref.namespace, ref.name, exc)
                        out[ref.uid] = f"{verb} {ref.namespace}/{ref.name}: {exc}"
        for ref in claims:
            out.setdefault(ref.uid, f"{verb} {ref.namespace}/{ref.name}: timed out")
        return out

    async def _prepare_one(self, ref: ClaimRef) -> PreparedClaim:
        held = self.prepared.get(ref.uid)
        if held is not None and (self.cdi_dir / held.spec_file).exists():
            return held
        if not self.new_claims:
            raise PrepareError(NO_NEW_CLAIMS)
        claim = await self.api.get(RESOURCE_CLAIMS, ref.name, namespace=ref.namespace)
        usable = usable_devices(
            self.view.instances(),
            self.view.node,
            lambda key: self.view.device(key) is not None,
            consumable=self.consumable,
        )
        resolved = resolve(claim, ref.uid, usable)
        edits = []
        mounted: set[ObjectKey] = set()
        for allocated, device_ref in resolved:
            key = ObjectKey(device_ref.namespace, device_ref.instance)
            inst = self.view.instance(key)
            if inst is None:
                raise PrepareError(f"Instance {key} is gone")
            device_edits = instance_edits(inst, self.view.device(key))
            if self.workloads is not None and key not in mounted:
                # One directory per Instance of the claim (two devices of one Instance: one
                # workload, as a container given two slots of it in device-plugin mode).
                mounted.add(key)
                device_edits = with_workload(device_edits, self.workloads, inst, ref.uid)
            edits.append((allocated.index, device_edits))
        spec_file = spec_file_name(ref.uid)
        write_atomically(self.cdi_dir / spec_file, json.dumps(cdi_spec(ref.uid, edits), indent=1))
        devices = tuple(
            PreparedDevice(
                (a.request,),
                a.pool,
                a.device,
                (cdi_device_id(ref.uid, a.index),),
                a.share_id,
                a.slots,
            )
            for a, _ in resolved
        )
        prepared = PreparedClaim(
            ref.namespace, ref.name, devices, spec_file, counted=counted_on_node(claim)
        )
        self._save({**self.prepared, ref.uid: prepared})
        log.info(
            "prepared claim %s/%s: %s",
            ref.namespace,
            ref.name,
            ", ".join(f"{d.pool}/{d.device}" for d in devices) or "no device of ours",
        )
        return prepared

    async def _unprepare_one(self, ref: ClaimRef) -> PreparedClaim:
        held = self.prepared.get(ref.uid)
        spec_file = held.spec_file if held is not None else spec_file_name(ref.uid)
        (self.cdi_dir / spec_file).unlink(missing_ok=True)
        if held is not None:
            self._save({uid: c for uid, c in self.prepared.items() if uid != ref.uid})
            log.info("unprepared claim %s/%s", ref.namespace, ref.name)
        return held or PreparedClaim(ref.namespace, ref.name, (), spec_file)
