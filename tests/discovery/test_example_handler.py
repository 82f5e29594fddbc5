"""The handler-writing example (k8s/examples/custom-handler/file_devices.py), as
docs/handlers.md tells a user to run it: stubs generated from protos/discovery.proto with
grpc_tools, the handler a process of its own (grpcio, nothing of akri-trio), registering with a
real agent process on the real control plane. Its devices become Instances; bad
discoveryDetails reach the Configuration's status in the handler's own words.

The agent watches only this test's namespace, for a made-up node, with a kubelet stand-in.
docs/handlers.md's Python handler runs as written too, against the agent's registration server."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from akri_trio.discovery.registration import serve_registration
from akri_trio.discovery.registry import Registry
from akri_trio.discovery.wire import request_to_proto, response_from_proto
from akri_trio.kube import Client, NotFound, Resource, load_config
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.rpc.gen.discovery_grpc import DiscoveryHandlerStub
from akri_trio.rpc.uds import open_channel
from tests.support.akri_cluster import (
    debug_echo_config,
    ensure_namespace,
    install_crds,
    purge_namespace,
)
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api, when

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "k8s" / "examples" / "custom-handler" / "file_devices.py"
NAMESPACES = Resource.core("namespaces", "Namespace", namespaced=False)
WAIT_S = 60  # generous: the machine is shared; it takes seconds


def generate_stubs(out: Path) -> None:
    """The command the example's docstring and docs/handlers.md give."""
    out.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'protos'}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(REPO / "protos" / "discovery.proto"),
        ],
        check=True,
    )


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, SIGTERMed (then killed) on the way out; its output goes to `log`."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            proc.kill()  # a no-op once it has exited
            proc.wait()


def configuration(name: str, namespace: str, details: str) -> dict[str, Any]:
    config = debug_echo_config(name, namespace, [], capacity=1, details=details)
    config["spec"]["discoveryHandler"]["name"] = "fileDevices"
    return config


@pytest.mark.k8s
async def test_example_handler_devices_become_instances(
    cluster: dict[str, str], sock_dir: Path
) -> None:
    stubs = sock_dir / "stubs"
    generate_stubs(stubs)
    # Device nodes must live under /dev (the agent refuses any other host path for them), so
    # the example's "devices" are plain files in a directory of the test's own there.
    devices = Path("/dev") / f"akri-trio-exh-{secrets.token_hex(3)}"
    devices.mkdir()
    (devices / "usb-cam0").touch()
    (devices / "other").touch()  # not matched by the Configuration's pattern
    handlers_dir = sock_dir / "akri"
    handlers_dir.mkdir()
    node = f"exh-node-{secrets.token_hex(2)}"
    ns = f"exh-{secrets.token_hex(3)}"
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]}
    agent_argv = [
        sys.executable,
        "-m",
        "akri_trio",
        "agent",
        f"--node-name={node}",
        f"--namespace={ns}",
        f"--discovery-handlers-directory={handlers_dir}",
        f"--device-plugin-dir={sock_dir / 'device-plugins'}",
        f"--pod-resources-socket={sock_dir / 'pod-resources.sock'}",
        "--metrics-port=-1",
    ]
    handler_env = {
        **env,
        "PYTHONPATH": str(stubs),
        "DISCOVERY_HANDLERS_DIRECTORY": str(handlers_dir),
        "FILE_DEVICES_POLL_SECONDS": "0.2",
    }
    kubelet = KubeletStandin(sock_dir / "device-plugins").start()
    async with Client.open(load_config(cluster["KUBECONFIG"])) as api:
        await install_crds(api)
        await ensure_namespace(api, ns)

        async def instances() -> dict[str, dict[str, Any]]:
            return {
                o["spec"]["brokerProperties"]["FILE_DEVICE_PATH"]: o
                for o in (await api.list(INSTANCES, namespace=ns)).items
            }

        async def _no_instances() -> bool:
            return not await instances()

        async def conditions(name: str) -> dict[str, tuple[str, str]] | None:
            obj = await api.get(CONFIGURATIONS, name, namespace=ns)
            for entry in (obj.get("status") or {}).get("nodes") or []:
                if entry["node"] == node:
                    return {c["type"]: (c["status"], c["message"]) for c in entry["conditions"]}
            return None

        try:
            with (
                process(agent_argv, env, sock_dir / "agent.log"),
                process([sys.executable, str(EXAMPLE)], handler_env, sock_dir / "handler.log"),
            ):
                details = json.dumps({"directory": str(devices), "pattern": "usb-*"})
                await api.create(CONFIGURATIONS, configuration("files", ns, details), namespace=ns)
                found = await until_api(
                    instances, what="the example handler's device as an Instance", seconds=WAIT_S
                )
                assert list(found) == [str(devices / "usb-cam0")]
                spec = found[str(devices / "usb-cam0")]["spec"]
                assert spec["nodes"] == [node]
                assert spec["configurationName"] == "files"
                assert spec["shared"] is False  # the handler registered shared=False

                # The stream stays open: a new entry is a new full list, a new Instance.
                (devices / "usb-cam1").touch()
                await until_api(
                    lambda: when(instances, lambda found: len(found) == 2),
                    what="the second device's Instance",
                    seconds=WAIT_S,
                )

                bad = configuration("bad", ns, json.dumps({"directory": "relative/path"}))
                await api.create(CONFIGURATIONS, bad, namespace=ns)
                rejected = await until_api(
                    lambda: when(
                        lambda: conditions("bad"),
                        lambda c: c is not None and c["DiscoveryDetailsValid"][0] == "False",
                    ),
                    what="the handler's INVALID_ARGUMENT in the Configuration's status",
                    seconds=WAIT_S,
                )
                assert rejected is not None
                message = rejected["DiscoveryDetailsValid"][1]
                assert "discoveryDetails.directory: must be an absolute path" in message
                assert rejected["HandlerAvailable"][0] == "True"

                # Deleted Configurations: the agent, still running, removes their Instances.
                for name in ("files", "bad"):
                    await api.delete(CONFIGURATIONS, name, namespace=ns)
                await until_api(_no_instances, what="the Instances to go", seconds=WAIT_S)
        finally:
            kubelet.stop()
            shutil.rmtree(devices, ignore_errors=True)
            with trio.move_on_after(30, shield=True):
                await purge_namespace(api, ns, limit_s=20)
                with contextlib.suppress(NotFound):
                    await api.delete(NAMESPACES, ns)


def docs_handler(directory: Path) -> str:
    """The Python block of docs/handlers.md's "Writing your own discovery handler", serving under
    `directory` instead of /var/lib/akri."""
    page = (REPO / "docs" / "handlers.md").read_text()
    section = page.split("### Writing your own discovery handler", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'Path("/var/lib/akri")' in code
    return code.replace('Path("/var/lib/akri")', f"Path({str(directory)!r})")


async def test_docs_python_handler_registers_and_discovers(sock_dir: Path) -> None:
    script = sock_dir / "thermometers.py"
    script.write_text(docs_handler(sock_dir))
    registry = Registry(clock=trio.current_time)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_registration, registry, sock_dir / "agent-registration.sock")
        with process([sys.executable, str(script)], dict(os.environ), sock_dir / "handler.log"):

            async def registered() -> list[str] | None:
                return list(registry.get("thermometers")) or None

            (endpoint,) = await until_api(
                registered, what="docs/handlers.md's handler to register", seconds=WAIT_S
            )
            assert registry.registrations("thermometers")[0].shared is True
            async with open_channel(endpoint) as channel:
                stream = DiscoveryHandlerStub(channel).Discover(
                    request_to_proto("hosts: [t1, t2]", {})
                )
                first = await stream.__anext__()
                await stream.aclose()  # type: ignore[attr-defined]
            devices = response_from_proto(first)
            assert [(d.id, d.properties) for d in devices] == [
                ("t1", {"THERMOMETER_HOST": "t1"}),
                ("t2", {"THERMOMETER_HOST": "t2"}),
            ]
        nursery.cancel_scope.cancel()


def test_example_image_copies_only_what_its_ignore_file_lets_in() -> None:
    """Its build context is the repository, whose own .dockerignore keeps protos/ and k8s/ out."""
    here = EXAMPLE.parent
    lines = (here / "Dockerfile").read_text().splitlines()
    sources = [
        src
        for line in lines
        if line.startswith("COPY ") and "--from" not in line
        for src in line.split()[1:-1]
    ]
    ignore = (here / "Dockerfile.dockerignore").read_text().splitlines()
    let_in = {line[1:] for line in ignore if line.startswith("!")}
    assert sources and set(sources) <= let_in
    assert all((REPO / src).is_file() for src in sources)
