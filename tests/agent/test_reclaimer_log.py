"""The slot reclaimer logs upstream's "reclaiming unused slots - start" at the start of every
pass, at the default level: upstream's e2e `test_slot_reconciliation` reads the agent's last 20
seconds of log for it."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import trio

from akri_trio.agent.plugins.claims import Claims
from akri_trio.agent.reclaimer import DEFAULT_PERIOD_S, Reclaimer
from akri_trio.agent.view import NodeView
from akri_trio.kube import Client

UPSTREAM_LINE = "reclaiming unused slots - start"


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == UPSTREAM_LINE]


async def test_every_pass_starts_with_upstreams_line(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    view = NodeView("node-a")
    async with httpx.AsyncClient(base_url="http://api.invalid") as http:
        # nothing is held, so the API is never called; no kubelet answers on this socket, so
        # each pass is skipped after its line — the line comes first, whatever the pass does
        reclaimer = Reclaimer(view, Claims(Client(http), view), tmp_path / "kubelet.sock")
        with trio.move_on_after(2 * DEFAULT_PERIOD_S + 1):
            await reclaimer.run()
    lines = _lines(caplog)
    assert len(lines) == 3  # at 0, 10 and 20 s: always one within any 20 s
    assert all(r.levelno == logging.INFO for r in lines)


async def test_with_nothing_held_the_kubelet_is_not_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A DRA-mode agent runs the reclaimer for slots device-plugin mode left: most of the time
    there are none, and a pass costs no PodResources call."""
    caplog.set_level(logging.INFO)
    view = NodeView("node-a")
    async with httpx.AsyncClient(base_url="http://api.invalid") as http:
        reclaimer = Reclaimer(view, Claims(Client(http), view), tmp_path / "kubelet.sock")
        assert await reclaimer.pass_once() == 0
    assert len(_lines(caplog)) == 1
    assert not [r for r in caplog.records if "PodResources" in r.getMessage()]
