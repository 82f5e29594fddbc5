"""A real asyncua OPC UA server as a child-process script, for the OPC UA tests and benchmark:
`python -c SERVER_SCRIPT --name N --port P [--type Server] [--register LDS] [--advertise URL]`
prints READY once it serves (and, with `--register`, is registered with the LDS).
`server_argv` builds that command line; `serving` runs one for a synchronous test."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# `--register LDS`: RegisterServer once (no renewal), advertising `--advertise` (default: its own
# endpoint) as its discovery URL.
SERVER_SCRIPT = r"""
import argparse, asyncio
from asyncua import Client, Server, ua

async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--type", default="Server")
    p.add_argument("--register")
    p.add_argument("--advertise")
    a = p.parse_args()
    server = Server()
    await server.init()
    endpoint = f"opc.tcp://127.0.0.1:{a.port}/akri/{a.name}/"
    server.set_endpoint(endpoint)
    server.set_server_name(a.name)
    await server.set_application_uri(f"urn:akri-trio-test:{a.name}")
    server.application_type = getattr(ua.ApplicationType, a.type)
    async with server:
        if a.register:
            reg = ua.RegisteredServer()
            reg.ServerUri = f"urn:akri-trio-test:{a.name}"
            reg.ProductUri = "urn:akri-trio-test"
            reg.DiscoveryUrls = [a.advertise or endpoint]
            reg.ServerType = server.application_type
            reg.ServerNames = [ua.LocalizedText(a.name)]
            reg.IsOnline = True
            client = Client(a.register)
            await client.connect_sessionless()
            try:
                await client.uaclient.register_server(reg)
            finally:
                await client.disconnect_sessionless()
        print("READY", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def server_argv(
    name: str,
    port: int,
    *,
    kind: str = "Server",
    register: str | None = None,
    advertise: str | None = None,
) -> list[str]:
    """The command line of one server (its endpoint: `endpoint(name, port)`)."""
    args = [sys.executable, "-c", SERVER_SCRIPT, "--name", name, "--port", str(port)]
    args += ["--type", kind]
    if register:
        args += ["--register", register]
    if advertise:
        args += ["--advertise", advertise]
    return args


def endpoint(name: str, port: int) -> str:
    """The URL a server serves and lists itself under (its device id to the opcua handler)."""
    return f"opc.tcp://127.0.0.1:{port}/akri/{name}/"


@contextlib.contextmanager
def serving(logs: Path, name: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A server of type Server, once it serves; killed on the way out."""
    with open(logs / f"{name}.log", "wb") as err:
        proc = subprocess.Popen(server_argv(name, port), stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        line = b""
        while b"READY" not in line:  # the script prints nothing before READY
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"{name} died: {(logs / f'{name}.log').read_text()}")
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()
