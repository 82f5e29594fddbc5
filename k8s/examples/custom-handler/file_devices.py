"""fileDevices: a discovery handler written against protos/discovery.proto alone.

It shows what any handler, in any language, has to do to work with the akri-trio (or upstream
Akri) agent, using nothing of akri-trio: plain Python, grpcio and the stubs protoc generates
from discovery.proto:

    python -m grpc_tools.protoc -I protos --python_out=OUT --grpc_python_out=OUT \
        protos/discovery.proto
    PYTHONPATH=OUT python k8s/examples/custom-handler/file_devices.py

What it discovers: every entry of a directory on the node whose name matches a glob, as one
device each (e.g. `/dev/serial/by-id`, pattern `usb-FTDI*`). A Configuration asks for it with

    discoveryHandler:
      name: fileDevices
      discoveryDetails: '{"directory": "/dev/serial/by-id", "pattern": "usb-*"}'

The three duties of a handler:
1. Serve v0.DiscoveryHandler (here on a Unix socket in the agent's directory).
2. Register that endpoint with the agent (v0.Registration on agent-registration.sock), and
   register again whenever the agent restarts (its socket is then a new file).
3. Answer each Discover call with a stream that stays open: the first message at once, then a
   new message with the FULL list whenever it changes. Bad discoveryDetails are answered with
   INVALID_ARGUMENT and a message: the agent shows it in the Configuration's status and does
   not ask again.

Environment: DISCOVERY_HANDLERS_DIRECTORY (default /var/lib/akri), FILE_DEVICES_POLL_SECONDS
(how often a directory is listed, default 5).
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import discovery_pb2 as pb  # generated from protos/discovery.proto
import discovery_pb2_grpc as pb_grpc
import grpc

NAME = "fileDevices"
PROPERTY = "FILE_DEVICE_PATH"
# Devices in a node's own directory are seen by that node alone: not shared.
SHARED = False


def parse_details(text: str) -> tuple[Path, str]:
    """discoveryDetails -> (directory, glob); ValueError with a message for the user.
    JSON keeps this example free of a YAML library (and JSON is valid YAML)."""
    try:
        doc: Any = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"discoveryDetails: not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("discoveryDetails: must be a JSON object")
    directory = doc.get("directory")
    if not isinstance(directory, str) or not os.path.isabs(directory):
        raise ValueError("discoveryDetails.directory: must be an absolute path")
    pattern = doc.get("pattern", "*")
    if not isinstance(pattern, str):
        raise ValueError("discoveryDetails.pattern: must be a string (a glob)")
    return Path(directory), pattern


def scan(directory: Path, pattern: str) -> list[str]:
    """The paths of the directory's entries matching `pattern`, sorted; none if it is missing."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(str(directory / n) for n in names if fnmatch.fnmatchcase(n, pattern))


def to_response(paths: list[str]) -> pb.DiscoverResponse:
    return pb.DiscoverResponse(
        devices=[
            pb.Device(
                id=path,  # stable: the agent derives the Instance name from it
                properties={PROPERTY: path},  # env vars of the Pods that use the device
                device_specs=[pb.DeviceSpec(container_path=path, host_path=path, permissions="rw")],
            )
            for path in paths
        ]
    )


class FileDevices(pb_grpc.DiscoveryHandlerServicer):
    def __init__(self, poll_seconds: float) -> None:
        self.poll_seconds = poll_seconds

    def Discover(self, request: pb.DiscoverRequest, context: grpc.ServicerContext) -> Any:
        try:
            directory, pattern = parse_details(request.discovery_details)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        last = None
        # One stream per Configuration; it ends when the agent cancels it (the Configuration
        # was deleted or changed, or the agent stopped).
        while context.is_active():
            paths = scan(directory, pattern)
            if paths != last:
                last = paths
                yield to_response(paths)
            time.sleep(self.poll_seconds)


def inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def keep_registered(registration_socket: Path, endpoint: str, stop: threading.Event) -> None:
    """Register, retrying until the agent answers; then register again whenever its socket is
    replaced (a restarted agent has forgotten every handler)."""
    request = pb.RegisterDiscoveryHandlerRequest(
        name=NAME,
        endpoint=endpoint,
        endpoint_type=pb.RegisterDiscoveryHandlerRequest.UDS,
        shared=SHARED,
    )
    while not stop.is_set():
        seen = inode(registration_socket)
        try:
            with grpc.insecure_channel(f"unix://{registration_socket}") as channel:
                pb_grpc.RegistrationStub(channel).RegisterDiscoveryHandler(request, timeout=10)
        except grpc.RpcError as exc:
            print(f"registering failed ({exc.code().name}); retrying", file=sys.stderr, flush=True)
            stop.wait(2)
            continue
        print(f"registered {NAME} at {endpoint}", flush=True)
        while not stop.wait(1) and inode(registration_socket) == seen:
            pass


def main() -> int:
    directory = Path(os.environ.get("DISCOVERY_HANDLERS_DIRECTORY") or "/var/lib/akri")
    poll_seconds = float(os.environ.get("FILE_DEVICES_POLL_SECONDS") or 5)
    socket_path = directory / f"{NAME}.sock"
    socket_path.unlink(missing_ok=True)  # left by an earlier run

    # One thread per open Discover stream (one per Configuration using this handler).
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    pb_grpc.add_DiscoveryHandlerServicer_to_server(FileDevices(poll_seconds), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        keep_registered(directory / "agent-registration.sock", str(socket_path), stop)
    finally:
        server.stop(grace=1).wait()
        socket_path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
