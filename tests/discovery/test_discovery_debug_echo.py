"""debugEcho's availability file, driven through the real handler with a mock clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from akri_trio.discovery.handlers.debug_echo import (
    DEFAULT_POLL_S,
    POLL_ENV,
    PROPERTY,
    DebugEcho,
    parse_details,
)
from akri_trio.discovery.interface import discover_changes
from akri_trio.model.device import Device


async def test_offline_and_restore(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    availability = tmp_path / "availability.txt"
    handler = DebugEcho(availability_path=availability, poll_interval=1.0)
    details = parse_details("descriptions: [foo0, foo1]")
    online = [Device("foo0", {PROPERTY: "foo0"}), Device("foo1", {PROPERTY: "foo1"})]
    sent: list[tuple[float, list[Device]]] = []

    async def send(devices: list[Device]) -> None:
        sent.append((trio.current_time(), devices))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(discover_changes, handler, details, {}, send)
        await trio.sleep(0.5)
        assert [d for _, d in sent] == [online]  # no file: devices are there

        availability.write_text("OFFLINE\n")
        await trio.sleep(1.0)
        assert [d for _, d in sent] == [online, []]
        assert sent[-1][0] - sent[0][0] <= 1.0  # noticed within one poll interval

        await trio.sleep(10)
        assert len(sent) == 2  # nothing sent while nothing changes

        availability.write_text("ONLINE\n")
        await trio.sleep(1.0)
        assert [d for _, d in sent] == [online, [], online]

        availability.write_text("OFFLINE")
        await trio.sleep(1.0)
        availability.unlink()  # a missing file means available
        await trio.sleep(1.0)
        assert [d for _, d in sent] == [online, [], online, [], online]
        nursery.cancel_scope.cancel()


async def test_starts_offline_when_file_says_so(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    availability = tmp_path / "availability.txt"
    availability.write_text("OFFLINE")
    handler = DebugEcho(availability_path=availability)
    sent: list[list[Device]] = []

    async def send(devices: list[Device]) -> None:
        sent.append(devices)

    with trio.move_on_after(5):
        await discover_changes(handler, parse_details("descriptions: [x]"), {}, send)
    assert sent == [[]]


def test_the_poll_period_comes_from_the_environment() -> None:
    assert DebugEcho.from_env({}).poll_interval == DEFAULT_POLL_S == 2.0
    assert DebugEcho.from_env({POLL_ENV: "0.25"}).poll_interval == 0.25
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError):
            DebugEcho.from_env({POLL_ENV: bad})
