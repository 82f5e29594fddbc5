"""`akri-trio discovery-handler <name> ...`: run one built-in handler as a standalone process.

Upstream ships a binary per handler for its DaemonSets; this is ours. It parses flags and the
environment into `run_standalone`'s arguments and nothing more. Like upstream's handlers, one
started with `POD_IP` in its environment (a DaemonSet sets it from `status.podIP`) and neither
`--socket` nor `--network` serves on that address, port 10000, and registers it as a network
endpoint, so agents can reach it across the Pod network.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import trio

from akri_trio.discovery.handlers import BUILTIN, UnknownHandler, load_handler
from akri_trio.discovery.standalone import REGISTRATION_SOCKET, handlers_directory, run_standalone
from akri_trio.flaghelp import Parser, add_log_arguments
from akri_trio.rpc import uds
from akri_trio.runtime.logs import log_startup, setup_logging

# upstream's handlers listen here when registering over the network (POD_IP)
POD_IP_PORT = 10000


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog="akri-trio discovery-handler",
        description="Serve a discovery handler and register it with the node's agent.",
    )
    parser.add_argument("name", help=f"handler name: {', '.join(sorted(BUILTIN))}")
    parser.add_argument(
        "--registration-socket",
        type=Path,
        help="the agent's registration socket "
        "(default $DISCOVERY_HANDLERS_DIRECTORY/agent-registration.sock)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--socket", type=Path, help="serve on this Unix socket (default <dir>/<name>.sock)"
    )
    where.add_argument(
        "--network",
        type=_host_port,
        metavar="HOST:PORT",
        help="serve on TCP instead (port 0 = any free port; default: POD_IP:10000 when POD_IP "
        "is set, else the Unix socket)",
    )
    parser.add_argument(
        "--advertise-host", help="host to register for --network (default: the bound host)"
    )
    uds.add_server_arguments(parser, os.environ if env is None else env)
    add_log_arguments(parser, os.environ if env is None else env)
    return parser


def main(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    environ = os.environ if env is None else env
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_format, defaults={"handler": args.name})
    try:
        handler = load_handler(args.name, environ)
    except UnknownHandler as exc:
        parser.error(str(exc))
    directory = handlers_directory(environ)
    socket_path, network, advertise = serving_endpoint(
        args.socket,
        args.network,
        args.advertise_host,
        environ.get("POD_IP", ""),
        directory / f"{handler.name}.sock",
    )
    log_startup(
        logging.getLogger("akri_trio.discovery"),
        "discovery-handler",
        {**vars(args), "socket": socket_path, "network": network, "handlers_directory": directory},
    )
    run = functools.partial(
        run_standalone,
        handler,
        registration_socket=args.registration_socket or directory / REGISTRATION_SOCKET,
        socket_path=socket_path,
        network=network,
        advertise_host=advertise,
        limits=uds.ServerLimits.of(args),
    )
    trio.run(_until_signalled, run)
    return 0


def serving_endpoint(
    socket: Path | None,
    network: tuple[str, int] | None,
    advertise_host: str | None,
    pod_ip: str,
    default_socket: Path,
) -> tuple[Path | None, tuple[str, int] | None, str | None]:
    """(socket path, network address, advertised host): the flags win, then POD_IP, then the
    default socket under the discovery handlers directory."""
    if socket is not None or network is not None:
        return socket, network, advertise_host
    if pod_ip.strip():
        return None, (pod_ip.strip(), POD_IP_PORT), advertise_host
    return default_socket, None, advertise_host


async def _until_signalled(run: Callable[[], Awaitable[None]]) -> None:
    # SIGTERM (the kubelet stopping the pod) cancels cleanly, so the socket file is removed.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            async for signum in signals:
                logging.getLogger(__name__).info("got signal %d: stopping", signum)
                nursery.cancel_scope.cancel()
                break
