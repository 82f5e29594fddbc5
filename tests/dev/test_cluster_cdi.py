"""The node's runtime injects devices through CDI: what a DRA driver (and a device plugin that
answers with CDI device names) stands on.

A CDI spec is written into the directory containerd is configured to read; a minimal device
plugin (grpcio, on the real kubelet) answers Allocate with nothing but that spec's device name.
The kubelet passes the name to containerd, and only containerd's CDI support can give the
container the env var and the device node the spec names. (A Pod's own annotations never reach
the runtime's container config, so the device plugin is the way to name a CDI device here.)
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc

dp_grpc: Any = deviceplugin_v1beta1_pb2_grpc  # grpcio stubs are untyped

pytestmark = [pytest.mark.k8s, pytest.mark.node]

RESOURCE = "cdi-test.akri-trio.example/dev"
CDI_KIND = "cdi-test.akri-trio.example/dev"
POD = "cluster-test-cdi"


class _Plugin(deviceplugin_v1beta1_pb2_grpc.DevicePluginServicer):
    """One healthy device, whose Allocate answer is only a CDI device name."""

    def GetDevicePluginOptions(self, request: Any, context: Any) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID="dev0", health="Healthy")])
        while context.is_active():
            time.sleep(0.2)

    def Allocate(self, request: Any, context: Any) -> dp.AllocateResponse:
        answers = [
            dp.ContainerAllocateResponse(cdi_devices=[dp.CDIDevice(name=f"{CDI_KIND}=dev0")])
            for _ in request.container_requests
        ]
        return dp.AllocateResponse(container_responses=answers)


@pytest.fixture
def cdi_plugin(node_cluster: dict[str, str]) -> Iterator[None]:
    cdi_dir = Path(node_cluster["AKRI_TRIO_CDI_DIR"])
    spec = {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": "dev0",
                "containerEdits": {
                    "env": ["CDI_TEST_DEVICE=dev0"],
                    "deviceNodes": [{"path": "/dev/akri-cdi-test", "hostPath": "/dev/null"}],
                },
            }
        ],
    }
    spec_file = cdi_dir / "akri-trio-cdi-test.json"
    spec_file.write_text(json.dumps(spec))
    plugin_dir = Path(node_cluster["AKRI_TRIO_DEVICE_PLUGIN_DIR"])
    socket = plugin_dir / "akri-trio-cdi-test.sock"
    socket.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dp_grpc.add_DevicePluginServicer_to_server(_Plugin(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as ch:
            dp_grpc.RegistrationStub(ch).Register(
                dp.RegisterRequest(version="v1beta1", endpoint=socket.name, resource_name=RESOURCE),
                timeout=10,
            )
        yield
    finally:
        server.stop(grace=0)
        socket.unlink(missing_ok=True)
        spec_file.unlink(missing_ok=True)


def _kubectl(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [env["KUBECTL"], *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={**os.environ, "KUBECONFIG": env["KUBECONFIG"]},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_runtime_injects_the_env_and_device_node_a_cdi_spec_names(
    node_cluster: dict[str, str], cdi_plugin: None
) -> None:
    env = node_cluster
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": "docker.io/library/busybox:latest",
                    "imagePullPolicy": "Never",
                    "command": [
                        "sh",
                        "-c",
                        'test -c /dev/akri-cdi-test && echo "node ok env=$CDI_TEST_DEVICE"',
                    ],
                    "resources": {"limits": {RESOURCE: "1"}},
                }
            ],
        },
    }
    _kubectl(env, "delete", "pod", POD, "--ignore-not-found", "--wait=true")
    _kubectl(env, "apply", "-f", "-", stdin=json.dumps(pod))
    try:
        deadline = time.monotonic() + 90
        phase = ""
        while time.monotonic() < deadline and phase not in ("Succeeded", "Failed"):
            phase = json.loads(_kubectl(env, "get", "pod", POD, "-o", "json"))["status"].get(
                "phase", ""
            )
            time.sleep(0.5)
        logs = _kubectl(env, "logs", POD)
        assert phase == "Succeeded", logs
        assert logs.strip() == "node ok env=dev0"
    finally:
        _kubectl(env, "delete", "pod", POD, "--ignore-not-found", "--wait=true")
