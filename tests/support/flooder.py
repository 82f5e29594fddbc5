"""A process that floods an agent, for tests/agent/test_floods.py: a separate process, so the
attacker's own work does not count as the agent's event-loop lag.

- `python -m tests.support.flooder list DIR NAME COUNT`: a discovery handler registered as NAME
  with the agent whose registration socket is in DIR, answering every Discover with COUNT
  devices, a new list as soon as the stream takes the last one.
- `python -m tests.support.flooder junk SOCKET COUNT`: COUNT connections at once to the Unix
  socket SOCKET, each sending bytes that are not gRPC, each reopened as soon as it is closed.

Either prints `flooding` once the flood is at full strength, and runs until terminated.
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import trio

from akri_trio.discovery.interface import Properties, Send
from akri_trio.discovery.standalone import REGISTRATION_SOCKET, run_standalone
from akri_trio.model.device import Device

JUNK = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00\xff" * 64


@attrs.define
class ListFlood:
    name: str
    count: int
    shared: bool = False

    def parse_details(self, text: str) -> str:
        return text

    async def discover(self, details: str, properties: Properties, send: Send) -> None:
        devices = [Device(f"flood-{i:06d}", {"FLOOD": str(i)}) for i in range(self.count)]
        rounds = 0
        while True:
            # Each list differs from the last (only a list that changed is sent), in its last
            # device: one past any cap, so the agent has nothing to write.
            rounds += 1
            devices[-1] = Device(devices[-1].id, {"FLOOD": f"round {rounds}"})
            await send(list(devices))
            if rounds == 2:  # the first list was taken: the agent is reading them
                print("flooding", flush=True)


async def junk(socket: str, count: int) -> None:
    opened = 0

    async def one() -> None:
        nonlocal opened
        while True:
            try:
                stream = await trio.open_unix_socket(socket)
            except OSError:
                await trio.sleep(0.01)
                continue
            opened += 1
            if opened == count:  # all of them open at once, for the first time
                print("flooding", flush=True)
            try:
                await stream.send_all(JUNK)
                while await stream.receive_some():
                    pass
            except (trio.BrokenResourceError, OSError):
                pass
            finally:
                await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)


def main(argv: list[str]) -> int:
    if argv[0] == "list":
        directory, name, count = Path(argv[1]), argv[2], int(argv[3])
        handler = ListFlood(name, count)
        trio.run(
            lambda: run_standalone(
                handler,
                registration_socket=directory / REGISTRATION_SOCKET,
                socket_path=directory / f"{name}.sock",
            )
        )
    else:
        trio.run(junk, argv[1], int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
