"""DRA mode gives a container the discovered device's mounts and device nodes, as device-plugin
mode's Allocate does: through the claim's CDI spec, applied by the real containerd. The agent
runs in-process with a handler of the test's own that reports one device with a read-only
mount of a host directory and a device node (the host's /dev/null)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from akri_trio.agent.configurations import ConfigurationLimits
from akri_trio.discovery.device_rules import DeviceRules
from akri_trio.discovery.interface import Properties, Send
from akri_trio.kube import Resource
from akri_trio.model import naming
from akri_trio.model.device import Device, DeviceSpec, Mount
from tests.support.kubectl import Kubectl, claim_pod
from tests.support.node_agent import (
    dra_agent_in_process,
    dra_class_and_template,
    fresh_namespace,
)
from tests.support.polling import until_api

pytestmark = pytest.mark.node

NS = "akri-dra-cdi-e2e"
CONFIG = "dra-files"
TEMPLATE = "dra-files"
HANDLER = "draNodeFiles"
PODS = Resource.core("pods", "Pod")
SCRIPT = (
    "cat /akri/hello; ls /dev/akri-null && echo hi > /dev/akri-null && echo WROTE; "
    "touch /akri/new 2>/dev/null || echo READ-ONLY; env | grep ^FILES; sleep 3600"
)


@attrs.frozen
class FilesHandler:
    """One device: a read-only mount of `host_dir` at /akri and /dev/null as /dev/akri-null."""

    host_dir: Path
    name: str = HANDLER
    shared: bool = False

    def parse_details(self, text: str) -> str:
        return text

    async def discover(self, details: str, properties: Properties, send: Send) -> None:
        device = Device(
            "files0",
            properties={"FILES": "yes"},
            mounts=(Mount("/akri", str(self.host_dir), read_only=True),),
            device_specs=(DeviceSpec("/dev/akri-null", "/dev/null", "rw"),),
        )
        await send([device])
        await trio.sleep_forever()


async def test_the_container_gets_the_devices_mounts_and_device_nodes(
    node_cluster: dict[str, str],
) -> None:
    with tempfile.TemporaryDirectory(prefix="ak", dir="/tmp") as d:
        root = Path(d)
        (root / "files").mkdir()
        (root / "files" / "hello").write_text("hello-from-the-host\n")
        (root / "files").chmod(0o755)
        await _run(node_cluster, root)


async def _run(node_cluster: dict[str, str], root: Path) -> None:
    kubectl = Kubectl(node_cluster)
    node = node_cluster["AKRI_TRIO_NODE_NAME"]
    inst = naming.instance_name(CONFIG, naming.device_hash("files0", node))
    await trio.to_thread.run_sync(fresh_namespace, kubectl, NS)
    dra_class_and_template(kubectl, NS, CONFIG, TEMPLATE, inst)
    kubectl.apply(
        {
            "apiVersion": "akri.sh/v0",
            "kind": "Configuration",
            "metadata": {"name": CONFIG, "namespace": NS},
            "spec": {"discoveryHandler": {"name": HANDLER, "discoveryDetails": ""}, "capacity": 1},
        }
    )
    handler = FilesHandler(root / "files")
    # The agent lets handlers mount only the directories it is told to.
    limits = ConfigurationLimits(devices=DeviceRules(mount_dirs=(str(root / "files"),)))
    agent = dra_agent_in_process(node_cluster, NS, CONFIG, root, handlers=(handler,), limits=limits)
    async with agent as (api, _):
        await api.create(PODS, claim_pod("files", NS, SCRIPT, TEMPLATE))

        async def running() -> Any:
            pod = await api.get(PODS, "files", namespace=NS)
            return pod.get("status", {}).get("phase") == "Running"

        await until_api(running, seconds=90, what="the pod Running")

        async def logs() -> str:
            out = await trio.to_thread.run_sync(kubectl, "logs", "files", "-n", NS)
            return str(out) if "FILES=yes" in out else ""

        lines = (await until_api(logs, what="the pod's output")).splitlines()
        assert "hello-from-the-host" in lines  # the mount
        assert "/dev/akri-null" in lines and "WROTE" in lines  # the device node
        assert "READ-ONLY" in lines  # mounted read-only
