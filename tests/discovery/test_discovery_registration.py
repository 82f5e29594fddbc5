"""The agent's registration server: validation, a real grpcio client, the socket file's life."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
import trio.testing

from akri_trio.discovery.registration import (
    InvalidRegistration,
    registration_from_request,
    serve_registration,
    share_with_group,
)
from akri_trio.discovery.registry import EndpointType, Registration, Registry
from akri_trio.rpc.gen import discovery_pb2 as pb
from akri_trio.rpc.gen import discovery_pb2_grpc
from akri_trio.rpc.uds import IDLE_TIMEOUT_S

UDS = pb.RegisterDiscoveryHandlerRequest.UDS
NETWORK = pb.RegisterDiscoveryHandlerRequest.NETWORK
pb_grpc: Any = discovery_pb2_grpc  # grpcio stubs are untyped


def request(
    name: str = "udev", endpoint: str = "/var/lib/akri/udev.sock", kind: int = UDS
) -> pb.RegisterDiscoveryHandlerRequest:
    return pb.RegisterDiscoveryHandlerRequest(
        name=name,
        endpoint=endpoint,
        endpoint_type=kind,  # type: ignore[arg-type]
        shared=False,
    )


def test_valid_requests() -> None:
    assert registration_from_request(request()) == Registration(
        "udev", "/var/lib/akri/udev.sock", EndpointType.UDS, False
    )
    net = registration_from_request(request("onvif", "http://10.1.2.3:10000", NETWORK))
    assert net.endpoint_type is EndpointType.NETWORK
    assert registration_from_request(request(endpoint="unix:///x/y.sock")).endpoint_type is (
        EndpointType.UDS
    )


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (request(name=""), "name must not be empty"),
        (request(name="  "), "name must not be empty"),
        (request(name="a b"), "must not contain whitespace"),
        (request(endpoint=""), "endpoint must not be empty"),
        (request(endpoint="relative.sock"), "UDS needs an absolute socket path"),
        (request(endpoint="http://h:1"), "UDS needs an absolute socket path"),
        (request(endpoint="/a.sock", kind=NETWORK), "NETWORK needs http://host:port"),
        (request(endpoint="https://h:1", kind=NETWORK), "bad endpoint"),
        (request(endpoint="http://h:notaport", kind=NETWORK), "bad endpoint"),
        (request(kind=7), "unknown endpoint_type 7"),
    ],
)
def test_invalid_requests(req: pb.RegisterDiscoveryHandlerRequest, message: str) -> None:
    with pytest.raises(InvalidRegistration, match=message):
        registration_from_request(req)


def _grpcio_register(
    path: Path, req: pb.RegisterDiscoveryHandlerRequest
) -> tuple[grpc.StatusCode, str]:
    """A blocking grpcio call (run it in a thread): the status code and details."""
    with grpc.insecure_channel(f"unix://{path}") as channel:
        try:
            pb_grpc.RegistrationStub(channel).RegisterDiscoveryHandler(req, timeout=5)
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def test_grpcio_client_bad_input_gets_invalid_argument_and_server_keeps_working(
    sock_dir: Path,
) -> None:
    registry = Registry(trio.current_time)
    path = sock_dir / "agent-registration.sock"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_registration, registry, path)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

            for bad, message in [
                (request(name=""), "name must not be empty"),
                (request(endpoint="nope"), "UDS needs an absolute socket path, got 'nope'"),
                (request(kind=5), "unknown endpoint_type 5"),
            ]:
                code, details = await trio.to_thread.run_sync(_grpcio_register, path, bad)
                assert code == grpc.StatusCode.INVALID_ARGUMENT
                assert message in details
            assert registry.names() == []

            good = request("debugEcho", "/var/lib/akri/debugEcho.sock")
            code, _ = await trio.to_thread.run_sync(_grpcio_register, path, good)
            assert code == grpc.StatusCode.OK
            assert [r.endpoint for r in registry.registrations("debugEcho")] == [
                "/var/lib/akri/debugEcho.sock"
            ]
            nursery.cancel_scope.cancel()
    assert not path.exists()  # removed on shutdown


async def test_stale_socket_file_is_replaced(sock_dir: Path) -> None:
    path = sock_dir / "agent-registration.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a file nobody listens on, as a crashed agent leaves it
    old_inode = os.stat(path).st_ino
    registry = Registry(trio.current_time)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_registration, registry, path)
            assert os.stat(path).st_ino != old_inode
            code, _ = await trio.to_thread.run_sync(_grpcio_register, path, request())
            assert code == grpc.StatusCode.OK
            nursery.cancel_scope.cancel()
    assert not path.exists()


# ---- abuse of the registration socket (issue 8, item 15) ---------------------------------------


def test_names_and_endpoints_are_length_limited() -> None:
    with pytest.raises(InvalidRegistration, match="is 129 characters; the limit is 128") as info:
        registration_from_request(request(name="h" * 129))
    assert len(str(info.value)) < 200
    registration_from_request(request(name="h" * 128))
    long_path = "/" + "p" * 1024
    with pytest.raises(InvalidRegistration, match="is 1025 characters; the limit is 1024"):
        registration_from_request(request(endpoint=long_path))
    with pytest.raises(InvalidRegistration, match="the limit is 1024"):
        registration_from_request(request(endpoint="http://" + "h" * 2000 + ":1", kind=NETWORK))


async def test_junk_connections_cost_one_line_and_idle_ones_are_closed(
    sock_dir: Path, caplog: pytest.LogCaptureFixture, autojump_clock: Any
) -> None:
    registry = Registry(trio.current_time)
    with trio.fail_after(IDLE_TIMEOUT_S * 3):
        async with trio.open_nursery() as nursery:
            path = await nursery.start(serve_registration, registry, sock_dir / "r.sock")

            junk = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with junk:
                await junk.connect(os.fspath(path))
                await junk.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                while await junk.recv(65536):  # the server answers GOAWAY and hangs up
                    pass
            await trio.testing.wait_all_tasks_blocked()  # the server logs after hanging up
            records = [r for r in caplog.records if r.name == "akri_trio.rpc.uds"]
            assert [(r.levelname, r.exc_info) for r in records] == [("WARNING", None)]
            assert "not valid gRPC" in records[0].getMessage()
            assert "\n" not in records[0].getMessage()

            # Silent, and after a valid HTTP/2 preface without a call: both closed when idle.
            for hello in (
                b"",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
            ):
                idle = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                with idle:
                    await idle.connect(os.fspath(path))
                    await idle.send(hello)
                    start = trio.current_time()
                    while await idle.recv(65536):  # SETTINGS, then EOF at the idle timeout
                        pass
                    assert IDLE_TIMEOUT_S <= trio.current_time() - start < IDLE_TIMEOUT_S + 1
            nursery.cancel_scope.cancel()


# ---- the handlers directory shared with a group (review item 11) -------------------------------

HANDLER_UID = HANDLER_GID = 65532
OTHER_HANDLER_UID = 65533


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_a_handler_of_the_group_can_remove_only_its_own_sockets() -> None:
    """In the shared handlers directory a handler creates and removes its own socket, but can
    neither unlink nor rename over the agent's registration socket or the socket of a handler
    running as another user."""
    with tempfile.TemporaryDirectory(prefix="reg-sticky-", dir="/tmp") as parent:
        Path(parent).chmod(0o755)
        directory = Path(parent) / "akri"
        directory.mkdir(mode=0o755)
        share_with_group(directory, HANDLER_GID)
        info = directory.stat()
        assert (info.st_gid, oct(stat.S_IMODE(info.st_mode))) == (HANDLER_GID, oct(0o3770))
        (directory / "agent-registration.sock").touch(mode=0o660)  # the agent's (root's)
        other = directory / "other.sock"
        other.touch(mode=0o660)
        os.chown(other, OTHER_HANDLER_UID, HANDLER_GID)
        script = (
            'cd "$1"; touch mine.sock && mv mine.sock mine2.sock && rm mine2.sock && echo own-ok;'
            "touch mine.sock;"
            "rm -f agent-registration.sock 2>/dev/null || echo unlink-refused;"
            "mv -f mine.sock agent-registration.sock 2>/dev/null || echo replace-refused;"
            "rm -f other.sock 2>/dev/null || echo other-refused"
        )
        run = subprocess.run(
            ["setpriv", f"--reuid={HANDLER_UID}", f"--regid={HANDLER_GID}", "--clear-groups",
             "sh", "-c", script, "sh", str(directory)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert run.stdout.split() == [
            "own-ok",
            "unlink-refused",
            "replace-refused",
            "other-refused",
        ]
        assert (directory / "agent-registration.sock").exists() and other.exists()
