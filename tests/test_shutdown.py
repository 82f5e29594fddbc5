"""run_until_signalled: SIGTERM cancels the main task (its cleanup runs), and a main task that
returns ends the command without waiting for a signal."""

from __future__ import annotations

import logging
import os
import signal

import trio
import trio.lowlevel
import trio.testing

from akri_trio.shutdown import run_until_signalled

log = logging.getLogger(__name__)


async def test_sigterm_cancels_the_main_task_and_its_cleanup_runs() -> None:
    cleaned_up = False

    async def main() -> None:
        nonlocal cleaned_up
        try:
            await trio.sleep_forever()
        finally:
            cleaned_up = True

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_until_signalled, main, log)
            await trio.testing.wait_all_tasks_blocked()
            os.kill(os.getpid(), signal.SIGTERM)
    assert cleaned_up


async def test_a_main_task_that_returns_ends_the_command() -> None:
    async def main() -> None:
        await trio.lowlevel.checkpoint()

    with trio.fail_after(10):
        await run_until_signalled(main, log)
