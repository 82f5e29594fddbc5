"""A real asyncua OPC UA server as a child-process script, for the OPC UA tests and benchmark:
`python -c SERVER_SCRIPT --name N --port P [--type Server] [--register LDS] [--advertise URL]`
prints READY once it serves (and, with `--register`, is registered with the LDS)."""

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
