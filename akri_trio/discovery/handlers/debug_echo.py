"""debugEcho: upstream's test handler, which "discovers" whatever the Configuration lists.

It lets the whole pipeline (registration, Discover streams, Instances, device plugins, brokers)
run on any machine, and lets tests make devices vanish and return by writing `OFFLINE` into an
availability file, as upstream's e2e tests do. The parsing and the device list are pure; the
only I/O is a cheap stat of that file every 2 s (reading it only when it changed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from akri_trio.discovery.interface import (
    MAX_DETAILS_BYTES,
    Properties,
    Send,
    details_parser,
    load_mapping,
    max_details_bytes,
    required_str_list,
)
from akri_trio.model.device import Device
from akri_trio.runtime import sleep_to_tick

NAME: Final = "debugEcho"
PROPERTY: Final = "DEBUG_ECHO_DESCRIPTION"
SHARED_ENV: Final = "DEBUG_ECHO_INSTANCES_SHARED"
# Ours, not upstream's: lets tests and side-by-side handlers use their own file.
AVAILABILITY_ENV: Final = "DEBUG_ECHO_AVAILABILITY_PATH"
DEFAULT_AVAILABILITY_PATH: Final = Path("/tmp/debug-echo-availability.txt")
# Ours too: seconds between two looks at the availability file. Each look wakes the process, so
# an idle node pays for every one; 2 s is quick enough for a test handler (upstream's looks
# every 10 s).
POLL_ENV: Final = "DEBUG_ECHO_POLL_PERIOD"
DEFAULT_POLL_S: Final = 2.0
OFFLINE: Final = "OFFLINE"


@attrs.frozen
class DebugEchoDetails:
    descriptions: tuple[str, ...]


@details_parser
def parse_details(text: str, *, max_bytes: int = MAX_DETAILS_BYTES) -> DebugEchoDetails:
    """`descriptions: [..]` (required, strings). Other keys are ignored, as upstream's serde."""
    doc = load_mapping(text, max_bytes=max_bytes)
    return DebugEchoDetails(required_str_list(doc, "descriptions"))


def devices_for(details: DebugEchoDetails, availability: str | None) -> list[Device]:
    """The devices to report given the availability file's content (None: no file).

    Upstream checks `contains("OFFLINE")`, so any content mentioning it takes devices away.
    """
    if availability is not None and OFFLINE in availability:
        return []
    return [Device(id=d, properties={PROPERTY: d}) for d in details.descriptions]


def shared_from_env(env: Mapping[str, str]) -> bool:
    return env.get(SHARED_ENV, "").strip().lower() in ("true", "1")


def poll_period_from_env(env: Mapping[str, str]) -> float:
    """`DEBUG_ECHO_POLL_PERIOD` seconds (positive), or the default when unset."""
    text = env.get(POLL_ENV, "").strip()
    if not text:
        return DEFAULT_POLL_S
    period = float(text)
    if not period > 0:
        raise ValueError(f"{POLL_ENV} must be a positive number of seconds, not {text!r}")
    return period


FileSignature = tuple[int, int, int] | None


def _signature(path: Path) -> FileSignature:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


@attrs.define
class DebugEcho:
    """The handler. `poll_interval` is how often the availability file is stat-ed."""

    shared: bool = False
    availability_path: Path = DEFAULT_AVAILABILITY_PATH
    poll_interval: float = DEFAULT_POLL_S  # one stat of a tiny local file a look
    max_details_bytes: int = MAX_DETAILS_BYTES
    name: str = NAME

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DebugEcho:
        env = os.environ if env is None else env
        path = env.get(AVAILABILITY_ENV) or DEFAULT_AVAILABILITY_PATH
        return cls(
            shared=shared_from_env(env),
            availability_path=Path(path),
            poll_interval=poll_period_from_env(env),
            max_details_bytes=max_details_bytes(env),
        )

    def parse_details(self, text: str) -> DebugEchoDetails:
        return parse_details(text, max_bytes=self.max_details_bytes)

    async def discover(self, details: DebugEchoDetails, properties: Properties, send: Send) -> None:
        last: FileSignature | object = object()  # never equal: the first round always sends
        while True:
            # A stat (and rarely a read) of a tiny local file: cheaper than a thread hop.
            signature = _signature(self.availability_path)
            if signature != last:
                last = signature
                text = None if signature is None else _read(self.availability_path)
                await send(devices_for(details, text))
            await sleep_to_tick(self.poll_interval)
