"""`akri-trio agent` with its embedded debugEcho handler registered under another name.

The shared test cluster runs other people's agents, which watch every namespace and embed
debugEcho: a Configuration naming `debugEcho` would get Instances (and device plugins) from all
of them. Registered as, say, `ctlEcho`, the same handler code serves only the Configurations
that name it. Usage: python -m tests.support.echo_agent --echo-name NAME <agent flags>.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import attrs
import trio

from akri_trio.agent.cli import parse_args
from akri_trio.agent.run import AgentSettings, run_agent
from akri_trio.discovery.handlers.debug_echo import DEFAULT_AVAILABILITY_PATH, DebugEcho


async def run_until_signal(settings: AgentSettings) -> None:
    """The agent until SIGTERM / SIGINT, like the CLI."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_agent, settings)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


def renamed_echo(settings: AgentSettings, name: str, poll_interval: float = 0.2) -> AgentSettings:
    """`settings` with debugEcho embedded as `name` instead of under its own name."""
    availability = settings.debug_echo_availability or DEFAULT_AVAILABILITY_PATH
    echo = DebugEcho(name=name, availability_path=Path(availability), poll_interval=poll_interval)
    return attrs.evolve(settings, enable_debug_echo=False, handlers=(*settings.handlers, echo))


def main(argv: list[str]) -> int:
    at = argv.index("--echo-name")
    name, rest = argv[at + 1], argv[:at] + argv[at + 2 :]
    trio.run(run_until_signal, renamed_echo(parse_args(rest, os.environ), name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
