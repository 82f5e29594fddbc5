"""The one asyncio event loop of the process, in its own thread, for asyncio-only libraries.

Some protocol libraries we need (asyncua for OPC UA) only run on asyncio. trio-asyncio was
tried and rejected (research/stack.md §5: it patches asyncio globally and breaks as soon as
another loop has run in the process), and a loop thread per library or per call would multiply
threads and sockets. So every asyncio-only user shares ONE loop, started lazily in a daemon
thread the first time someone needs it, and stopped at interpreter exit (or by the context
manager, which tests use to get a private bridge they can see stop).

`await bridge.run(coro)` schedules the coroutine as an asyncio task and sleeps in trio until
it is done. The bridge is cancellable in the trio sense: a trio cancellation cancels the
asyncio task and then waits (shielded, bounded by `unwind_grace`) for the task to unwind, so
the asyncio side's `finally` blocks (closing sockets, sessions) have run by the time the trio
caller's cancellation propagates. An idle loop sleeps in `select`: no CPU.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Final, TypeVar

import trio

log = logging.getLogger(__name__)

T = TypeVar("T")

UNWIND_GRACE_S: Final = 5.0
STOP_GRACE_S: Final = 5.0


class BridgeStopped(RuntimeError):
    """The bridge's loop stopped (process exit, or `stop()`) before the coroutine finished."""


class AioBridge:
    """One asyncio loop in one daemon thread. Thread-safe; `start` is idempotent.

    Use the process-wide instance through `shared()` / the module-level `run()`; build your
    own (`with AioBridge() as bridge:`) only when you need to watch it stop (tests).
    """

    def __init__(self, *, unwind_grace: float = UNWIND_GRACE_S, name: str = "aio-bridge") -> None:
        self.unwind_grace = unwind_grace
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle (called from any thread) --------------------------------------------------

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> asyncio.AbstractEventLoop:
        """Start the loop thread unless it runs already; return its loop."""
        with self._lock:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                return self._loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=self._main, args=(loop, ready), name=self._name, daemon=True
            )
            thread.start()
            ready.wait()
            self._loop, self._thread = loop, thread
            return loop

    def stop(self) -> None:
        """Cancel whatever still runs on the loop, let it unwind, stop and join the thread.
        Blocking (joins a thread); a no-op when not running."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if thread.is_alive():
            # RuntimeError: closed under our feet, the thread is finishing anyway
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_GRACE_S * 2)
            if thread.is_alive():
                log.error("asyncio bridge thread did not stop within %.0f s", STOP_GRACE_S * 2)

    def __enter__(self) -> AioBridge:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @staticmethod
    def _main(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                _cancel_leftovers(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    # ---- the bridge (called from trio) ---------------------------------------------------------

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the bridge loop and return its result (or raise its exception).

        A trio cancellation cancels the asyncio task and waits up to `unwind_grace` seconds
        for it to unwind before letting the cancellation through.
        """
        try:
            loop = self.start()
        except BaseException:
            coro.close()
            raise
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[asyncio.Task[T]] = []

        def wake() -> None:
            with contextlib.suppress(trio.RunFinishedError):  # trio is gone: nobody to wake
                token.run_sync_soon(done.set)

        def begin() -> None:  # in the loop thread
            task = loop.create_task(coro)
            box.append(task)
            task.add_done_callback(lambda _: wake())

        try:
            loop.call_soon_threadsafe(begin)
        except RuntimeError as exc:  # the loop closed between start() and here
            coro.close()
            raise BridgeStopped("the asyncio bridge stopped") from exc

        try:
            await done.wait()
        except trio.Cancelled:
            # FIFO: `cancel` runs after `begin`, so the task exists by then.
            # RuntimeError: the loop already stopped, and its stop cancelled the task
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lambda: box[0].cancel())
            with trio.CancelScope(shield=True), trio.move_on_after(self.unwind_grace) as grace:
                await done.wait()
            if grace.cancelled_caught:
                log.error(
                    "asyncio task %r did not unwind within %.1f s of its cancellation",
                    box[0] if box else coro,
                    self.unwind_grace,
                )
            elif not box[0].cancelled():
                box[0].exception()  # finished anyway: mark any exception as retrieved
            raise
        task = box[0]
        if task.cancelled():
            raise BridgeStopped("the asyncio bridge stopped before the coroutine finished")
        return task.result()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    gathered = asyncio.gather(*tasks, return_exceptions=True)
    try:
        loop.run_until_complete(asyncio.wait_for(gathered, STOP_GRACE_S))
    except (TimeoutError, concurrent.futures.CancelledError):
        log.error("asyncio bridge: %d task(s) ignored cancellation at stop", len(tasks))


# ---- the process-wide bridge -------------------------------------------------------------------

_shared = AioBridge()
atexit.register(_shared.stop)


def shared() -> AioBridge:
    """The process-wide bridge (its thread starts on first use)."""
    return _shared


async def run(coro: Coroutine[Any, Any, T]) -> T:
    """`await shared().run(coro)`."""
    return await _shared.run(coro)
