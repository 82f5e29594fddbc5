"""The per-key reconcile queue: in order per key, never concurrent per key, parallel across keys.

Controllers are level-triggered: a reconcile looks at the current state of one object (a key,
e.g. `namespace/name`) and drives the world toward it. What must never happen is two reconciles
of one key racing each other (both would act on the same stale read); what should happen is
that an event arriving while its key reconciles causes one more reconcile afterwards, so the
last state is always seen. Different keys run in parallel up to `workers` at a time. This is
kopf's per-object queue and client-go's workqueue, on trio.

A reconcile returns `None` (done), `Requeue(after=s)` (look again later, e.g. a timeout it
waits out), or raises (logged, retried with per-key capped exponential backoff; a success
resets it). A fresh `enqueue` of a key waiting out a delay runs it now: news beats a timer.

Shutdown: cancel the scope around `run`. No new reconcile starts; those in flight get `drain`
seconds to finish and are cancelled after that, so shutdown is bounded even when a reconcile
hangs on an API server that is down. A reconcile must still be cancel-safe (every write it makes
is idempotent and re-done by the next reconcile): the drain is a courtesy, not a promise.
Keys may be any hashable value (e.g. `ObjectKey`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import attrs
import trio

from akri_trio.runtime import Backoff, Changed

log = logging.getLogger(__name__)


@attrs.frozen
class Requeue:
    """Reconcile this key again after `after` seconds (unless an event brings it sooner)."""

    after: float


K = TypeVar("K", bound=Hashable)

Reconcile = Callable[[K], Awaitable[Requeue | None]]

QUEUE_BACKOFF = Backoff(base=0.5, cap=300.0)
DRAIN_S = 5.0  # well inside a Pod's default 30 s termination grace period


class ReconcileQueue(Generic[K]):
    """`queue = ReconcileQueue(reconcile, workers=4)`; `nursery.start_soon(queue.run)`;
    then `queue.enqueue(key)` from anywhere in the same trio run (it never blocks)."""

    def __init__(
        self,
        reconcile: Reconcile[K],
        *,
        workers: int = 4,
        backoff: Backoff = QUEUE_BACKOFF,
        drain: float = DRAIN_S,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if not drain >= 0:
            raise ValueError(f"drain must be a non-negative number of seconds, got {drain!r}")
        self._reconcile = reconcile
        self._backoff = backoff
        self._rand = rand
        self._workers = workers
        self._drain = drain
        self._pending: dict[K, None] = {}  # ready to run, FIFO; never holds a running key
        self._running: set[K] = set()
        self._dirty: set[K] = set()  # enqueued while running: run again when done
        self._delayed: dict[K, float] = {}  # key -> trio deadline
        self._failures: dict[K, int] = {}
        self._ready = Changed()
        self._timer_changed = Changed()

    # --- feeding -----------------------------------------------------------------------------

    def enqueue(self, key: K) -> None:
        """Reconcile `key` as soon as a worker is free (and its previous reconcile is done)."""
        self._delayed.pop(key, None)
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._pending:
            self._pending[key] = None
            self._ready.bump()

    def enqueue_after(self, key: K, delay: float) -> None:
        """Reconcile `key` in `delay` seconds; an earlier schedule or a pending run wins."""
        if key in self._pending:
            return
        deadline = trio.current_time() + max(0.0, delay)
        if deadline < self._delayed.get(key, math.inf):
            self._delayed[key] = deadline
            self._timer_changed.bump()

    # --- introspection (metrics, tests) -------------------------------------------------------

    @property
    def running(self) -> frozenset[K]:
        return frozenset(self._running)

    def failures(self, key: K) -> int:
        """Consecutive failed reconciles of `key` (0 after a success)."""
        return self._failures.get(key, 0)

    def __len__(self) -> int:
        """Keys waiting: ready, dirty or delayed (not counting those running and clean)."""
        return len(self._pending.keys() | self._dirty | self._delayed.keys())

    # --- running -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch forever; cancel to stop (in-flight reconciles get `drain` seconds)."""
        stopping = trio.Event()
        async with trio.open_nursery() as nursery:
            workers: trio.Nursery = await nursery.start(self._hold_workers, stopping)
            nursery.start_soon(self._timer)
            task_status.started()
            try:
                await self._dispatch(workers)
            finally:
                stopping.set()

    async def _hold_workers(
        self, stopping: trio.Event, *, task_status: trio.TaskStatus[trio.Nursery]
    ) -> None:
        """The nursery reconciles run in: shielded from the cancellation that stops `run`, so
        they can finish, but only until `drain` seconds after `stopping`. With no drain it is
        not shielded at all: reconciles are cancelled together with `run`."""
        with trio.CancelScope(shield=self._drain > 0) as drain:
            async with trio.open_nursery() as workers:
                task_status.started(workers)
                await stopping.wait()
                drain.deadline = trio.current_time() + self._drain

    async def _dispatch(self, workers: trio.Nursery) -> None:
        slots = trio.Semaphore(self._workers)
        while True:
            while not self._pending:
                await self._ready.wait_past(self._ready.version)
            await slots.acquire()
            key = next(iter(self._pending))
            del self._pending[key]
            self._running.add(key)
            try:
                workers.start_soon(self._work, key, slots)
            except RuntimeError:
                # The workers' nursery closed while this task was being woken: `run` is being
                # cancelled, or a reconcile raised past it. Put the key back and wait for that
                # cancellation (or error) to arrive here.
                self._running.discard(key)
                self._pending[key] = None
                slots.release()
                await trio.sleep_forever()

    async def _work(self, key: K, slots: trio.Semaphore) -> None:
        try:
            result = await self._reconcile(key)
        except Exception:
            attempt = self._failures.get(key, 0)
            self._failures[key] = attempt + 1
            delay = self._backoff.delay(attempt, self._rand)
            log.exception(
                "reconcile %s failed (attempt %d); retry in %.1fs", key, attempt + 1, delay
            )
            self._finish(key)
            self.enqueue_after(key, delay)
        else:
            self._failures.pop(key, None)
            self._finish(key)
            if result is not None:
                self.enqueue_after(key, result.after)
        finally:
            slots.release()
            self._running.discard(key)

    def _finish(self, key: K) -> None:
        self._running.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.enqueue(key)

    async def _timer(self) -> None:
        """Moves delayed keys to ready when due; sleeps until the earliest deadline."""
        seen = self._timer_changed.version
        while True:
            deadline = min(self._delayed.values(), default=math.inf)
            with trio.move_on_at(deadline):
                seen = await self._timer_changed.wait_past(seen)
            now = trio.current_time()
            for key, due in list(self._delayed.items()):
                if due <= now:
                    self.enqueue(key)
