"""brokerInfo's agent side: a directory per workload at Allocate, and one task that copies what
brokers write there into their Instances.

Allocate (or Prepare) makes each workload's directory through `_mount.WorkloadDirs`, which the
copy loop is given too. `run` is one nursery child: every `period` seconds it lists the
directories (in a worker thread), ends the workloads whose slots this node no longer holds (the
reclaimer freed them, the Instance went, the node left it; see `_rules.plan_dirs`), reads what
counts, and server-side applies this node's part of each Instance's `spec.brokerInfo` where it
differs from what the watch cache shows (level-triggered: an entry lost in any way is written
again, and one another writer put under this node's name is removed). Work per pass is bounded
by the directories that exist and the per-directory limits; what one node writes into one
Instance, by its per-node budget (`_rules.Limits`). A file-system error is a problem like a
skipped file (the root directory's: one log line when it changes) and leaves what was written;
it never ends the loop.

In DRA mode a workload is a prepared claim (its directory is named for the claim's uid and made
by the kubelet plugin's Prepare): `held` says which claims of each Instance are prepared on
this node, and `reports` takes every running workload's own files each pass, for its claim's
`status.devices` (`agent/dra/claim_status.py`), with problems of its own (the claim's size
limit) reported like the others.

Files that break a rule are skipped and reported: one log line when the set of problems of an
Instance changes, and through `problems(configuration)`, which the agent puts in its entry of the
Configuration's status (a `BrokerInfoValid` condition; turning False records an Event).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence

import httpx
import trio

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import _disk, _rules
from akri_trio.agent.brokerinfo._mount import WorkloadDirs
from akri_trio.agent.plugins.claims import held_by
from akri_trio.agent.view import NodeView, config_key
from akri_trio.kube.client import Client
from akri_trio.kube.errors import ApiError, NotFound
from akri_trio.model.resources import INSTANCES
from akri_trio.runtime import sleep_to_tick

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 2.0
# How many problems of one Configuration its status shows (the rest are counted).
MAX_REPORTED = 10


# Instance -> slot (a claim uid in DRA mode) -> that running workload's own files.
Workloads = Mapping[ObjectKey, Mapping[str, Mapping[str, str]]]
# Where each running workload's files go besides its Instance (DRA mode: its claim); the
# answer: what could not go there, per Instance.
WorkloadReports = Callable[[Workloads], Awaitable[Mapping[ObjectKey, Sequence[str]]]]


class BrokerInfo:
    def __init__(
        self,
        api: Client,
        view: NodeView,
        dirs: WorkloadDirs,
        *,
        limits: _rules.Limits = _rules.Limits(),  # noqa: B008  (frozen)
        current: Callable[[ObjectKey], Mapping[str, str] | None],
        known: Callable[[], Iterable[ObjectKey]] = tuple,
        namespace: str | None = None,
        period: float = DEFAULT_PERIOD_S,
        on_problems: Callable[[ObjectKey], None] = lambda _: None,
        held: Callable[[], Mapping[ObjectKey, Collection[str]]] | None = None,
        reports: WorkloadReports | None = None,
    ) -> None:
        """`dirs`: the workload directories Allocate (or Prepare) makes, and the Configurations'
        generations. `current(instance key)`: its spec.brokerInfo as the watch cache has it
        (None: unknown). `known()`: the Instances in that cache. `on_problems`: the problems of
        that Configuration changed. `held()`: the slots each Instance's running workloads hold
        on this node (None: this node's deviceUsage claims). `reports`: where running
        workloads' files go besides."""
        self.api = api
        self.view = view
        self.node = view.node
        self.dirs = dirs
        self.limits = limits
        self.current = current
        self.known = known
        self.namespace = namespace
        self.period = period
        self.on_problems = on_problems
        self.held = held
        self.reports = reports
        self.manager = _rules.field_manager(self.node)
        # Instances this node has (or may have) entries on without a directory any more: a
        # pass checks that they are gone.
        self.leftover: set[ObjectKey] = set()
        self._problems: dict[ObjectKey, tuple[str, ...]] = {}  # per Instance
        self._root_problem = ""
        self._started = False

    # --- the copy loop -------------------------------------------------------------------------

    def problems(self, config: ObjectKey) -> list[str]:
        """What was skipped in the workload directories of this Configuration's Instances."""
        out = [
            f"{key.name}: {p}"
            for key, problems in sorted(self._problems.items())
            if (inst := self.view.instance(key)) is not None and config_key(inst) == config
            for p in problems
        ]
        if len(out) > MAX_REPORTED:
            out = [*out[:MAX_REPORTED], f"and {len(out) - MAX_REPORTED} more"]
        return out

    async def run(self) -> None:
        while True:
            await self.pass_once()
            await sleep_to_tick(self.period)

    async def pass_once(self) -> None:
        if not self._started:
            # Entries this node wrote before a restart whose directories are gone (the host
            # directory was wiped, or the agent now has another one) go on the first pass.
            self._started = True
            self.leftover.update(
                key for key in self.known() if _rules.node_entries(self.current(key), self.node)
            )
        # The worker threads are abandoned on cancellation (shutdown does not wait for a
        # removal of what a broker left): a pass is redone whole, never resumed.
        try:
            found = await trio.to_thread.run_sync(
                _disk.instance_dirs, self.dirs.root, self.namespace, abandon_on_cancel=True
            )
        except OSError as exc:
            self._root_failed(f"cannot list {self.dirs.root}: {exc}")
            return
        self._root_failed("")
        held = None if self.held is None else self.held()
        plans = {key: self._plan(key, names, held) for key, names in found.items()}
        reads, untidy = await trio.to_thread.run_sync(
            self._carry_out_and_read, plans, abandon_on_cancel=True
        )
        keys = sorted(set(plans) | self.leftover)
        elsewhere: Mapping[ObjectKey, Sequence[str]] = {}
        if self.reports is not None:
            elsewhere = await self.reports(
                {
                    key: _rules.running_workloads(reads.get(key, []))
                    for key in keys
                    if key not in untidy
                }
            )
        for key in keys:
            selections = [s for _, s in reads.get(key, [])]
            files = _rules.merge(selections)
            desired, over = _rules.desired_entries(self.node, files, self.limits)
            problems = [*(p for s in selections for p in s.problems), *over]
            self._report(key, [*problems, *elsewhere.get(key, ())])
            if key in untidy:
                continue  # what it wrote stays until its directories can be put in order
            inst = self.view.instance(key)
            if inst is None or await self._write(key, desired):
                self.leftover.discard(key)
            else:
                self.leftover.add(key)  # retried next pass, even once its directory is gone

    def _plan(
        self, key: ObjectKey, names: list[str], held: Mapping[ObjectKey, Collection[str]] | None
    ) -> _rules.DirPlan:
        inst = self.view.instance(key)
        slots: Collection[str] = ()
        if inst is not None:
            slots = (
                held_by(inst.spec.device_usage, self.node, key.name)
                if held is None
                else held.get(key, ())
            )
        return _rules.plan_dirs(
            names,
            held=slots,
            serving=inst is not None and self.node in inst.spec.nodes,
            generation=None if inst is None else self.dirs.generation(config_key(inst)),
        )

    def _carry_out_and_read(
        self, plans: Mapping[ObjectKey, _rules.DirPlan]
    ) -> tuple[dict[ObjectKey, list[tuple[str, _rules.Selection]]], set[ObjectKey]]:
        """In a worker thread: what each Instance's directories hold (directory name ->
        selection; "" for a problem of no directory), and the Instances whose plan failed. A
        file-system error (a read-only disk, a directory a broker took its permissions from)
        is reported as a problem of the Instance."""
        out: dict[ObjectKey, list[tuple[str, _rules.Selection]]] = {}
        untidy: set[ObjectKey] = set()
        for key, plan in plans.items():
            path = _disk.instance_dir(self.dirs.root, key)
            try:
                _disk.carry_out(path, plan)
            except OSError as exc:
                out[key] = [("", _rules.Selection({}, (f"cannot tidy its directories: {exc}",)))]
                untidy.add(key)
                continue
            out[key] = []
            for name in plan.report_from:
                try:
                    found = _disk.read_workload(path / name, self.limits)
                except OSError as exc:
                    out[key].append(("", _rules.Selection({}, (f"cannot list {name}: {exc}",))))
                else:
                    out[key].append((name, _rules.select(found, self.limits)))
        return out, untidy

    def _root_failed(self, problem: str) -> None:
        """One log line when the root directory's trouble changes."""
        if problem and problem != self._root_problem:
            log.warning("brokerInfo: %s (retried every pass)", problem)
        self._root_problem = problem

    def _report(self, key: ObjectKey, problems: list[str]) -> None:
        before = self._problems.get(key, ())
        now = tuple(problems)
        if now == before:
            return
        if now:
            self._problems[key] = now
            log.warning("brokerInfo of %s: %s", key, "; ".join(now))
        else:
            self._problems.pop(key, None)
        inst = self.view.instance(key)
        if inst is not None:
            self.on_problems(config_key(inst))

    async def _write(self, key: ObjectKey, desired: dict[str, str]) -> bool:
        """Make this node's part of the Instance's map `desired`, if the watch cache says it
        is not; level-triggered, so an entry lost by any means is written again. True when it
        is (or the Instance is gone)."""
        if _rules.node_entries(self.current(key), self.node) == desired:
            return True
        body = _rules.apply_body(key.namespace, key.name, desired)
        try:
            # Forced: a key under this node's name is this node's, whoever wrote it last.
            obj = await self.api.apply(
                INSTANCES, body, field_manager=self.manager, force=True, namespace=key.namespace
            )
            # The apply leaves the keys another manager wrote under this node's name (it
            # removes only its own): they go by a patch that tests each value first.
            info = obj.get("spec", {}).get("brokerInfo")
            if foreign := _rules.foreign_entries(info, self.node, desired):
                await self.api.json_patch(
                    INSTANCES,
                    key.name,
                    _rules.removal_ops(foreign),
                    field_manager=self.manager,
                    namespace=key.namespace,
                )
        except NotFound:
            return True
        except (ApiError, httpx.HTTPError) as exc:
            # Retried on the next pass; a refusal (the CRD's bounds, a foreign entry that
            # changed under the patch) is said here once per pass until it clears.
            log.warning("could not write brokerInfo of %s: %s", key, exc)
            return False
        return True
