"""What the node tests share: the agent as a real process (so restarts are real), the debugEcho
Configuration they run, a namespace to start from and to leave clean, what a kubelet says its
Pods hold (pod-resources) and how a cluster component is killed."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import trio
import yaml

from akri_trio import dra
from akri_trio.agent.run import Agent, AgentSettings, run_agent
from akri_trio.kube import Client, load_config
from akri_trio.rpc.gen import podresources_v1_pb2 as pr
from akri_trio.rpc.gen import podresources_v1_pb2_grpc
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster import procs
from tests.support.kubectl import Kubectl
from tests.support.polling import until, until_api

CRDS = Path(__file__).parents[2] / "k8s" / "crds"
pr_grpc: Any = podresources_v1_pb2_grpc  # grpcio stubs are untyped


class AgentProcess:
    """`akri-trio agent <args>` with the cluster's kubeconfig, logging to `log`."""

    def __init__(self, kubectl: Kubectl, log: Path, args: Sequence[str]) -> None:
        self.environ = {**kubectl.environ, "PYTHONUNBUFFERED": "1"}
        self.log = log
        self.args = list(args)
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0  # the log's size when this run started

    def start(self) -> None:
        self.started_at = self.log.stat().st_size if self.log.exists() else 0
        log = open(self.log, "ab")  # noqa: SIM115  (closed with the process)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "akri_trio", "agent", *self.args],
            env=self.environ,
            stdout=log,
            stderr=log,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            assert self.process.wait(timeout=15) == 0, self.tail()
            self.process = None

    def kill(self) -> None:
        """SIGKILL: the agent dies as on a lost node, with no chance to clean up."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=15)
            self.process = None

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def this_run(self) -> str:
        """What the current run has logged so far."""
        with open(self.log, "rb") as f:
            f.seek(self.started_at)
            return f.read().decode(errors="replace")


def process_alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie has exited (this VM's init does not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def restart_kubelet(cluster: Mapping[str, str]) -> None:
    """Stop the node's kubelet (SIGTERM) and start it again through the local cluster's `up`.
    Destructive on a shared cluster: every session's Pods and plugins on the node notice."""
    run_dir = Path(cluster["AKRI_TRIO_CLUSTER_DIR"])
    pid = int(next(run_dir.rglob("kubelet.pid")).read_text().split()[0])
    os.kill(pid, signal.SIGTERM)
    until(lambda: not process_alive(pid), seconds=30, what="kubelet exited")
    run_cluster_command("up", "--node", check=True, capture_output=True)


def sigkill_component(cluster_dir: Path, name: str) -> None:
    """SIGKILL one of the cluster's processes (`kube-apiserver`, `kubelet`, ...) by its pid
    file, and wait until it is gone (`cluster up` starts it again)."""
    rec = procs.running(cluster_dir / "pids" / f"{name}.pid")  # never walk containerd's tree
    assert rec is not None, f"{name} is not running"
    os.kill(rec.pid, signal.SIGKILL)
    until(lambda: not procs.is_alive(rec), seconds=30, what=f"{name} gone")


def held_by_pods(socket: Path, namespace: str) -> dict[str, dict[str, list[str]]]:
    """pod -> resource -> device ids of `namespace`'s Pods, as the kubelet serving
    pod-resources at `socket` assigned them (akri.sh resources only)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        answer = pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=10
        )
    held: dict[str, dict[str, list[str]]] = {}
    for pod in answer.pod_resources:
        if pod.namespace != namespace:
            continue
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name.startswith("akri.sh/"):
                    ids = held.setdefault(pod.name, {}).setdefault(dev.resource_name, [])
                    ids.extend(dev.device_ids)
    return held


@asynccontextmanager
async def dra_agent_in_process(
    cluster: Mapping[str, str], namespace: str, configuration: str, work_dir: Path, **settings: Any
) -> AsyncIterator[tuple[Client, Agent]]:
    """An agent in DRA mode for the node, in this process, scoped to `namespace`, once the
    kubelet has registered its plugin; on the way out the namespace's Pods, `configuration`
    and its DeviceClass go first. `settings`: more AgentSettings (handlers, capacity mode)."""
    kubectl = Kubectl(cluster)
    agent_settings = AgentSettings(
        node=cluster["AKRI_TRIO_NODE_NAME"],
        namespace=namespace,
        discovery_handlers_directory=work_dir / "akri",
        metrics_port=None,
        allocation="dra",
        kubelet_root_dir=Path(cluster["AKRI_TRIO_KUBELET_ROOT_DIR"]),
        cdi_dir=Path(cluster["AKRI_TRIO_CDI_DIR"]),
        **settings,
    )
    config = load_config(Path(cluster["KUBECONFIG"]))
    async with Client.open(config) as api, trio.open_nursery() as nursery:
        try:
            agent: Agent = await nursery.start(
                functools.partial(run_agent, agent_settings, api=api)
            )
            dra_node = agent.dra
            assert dra_node is not None

            async def registered() -> bool:
                return dra_node.registered

            await until_api(registered, what="the kubelet registered the DRA plugin")
            yield api, agent
        finally:
            clear = functools.partial(
                clear_namespace, kubectl, namespace, configuration, dra_class=True
            )
            await trio.to_thread.run_sync(clear)
            nursery.cancel_scope.cancel()


def debug_echo_configuration(
    name: str, namespace: str, descriptions: Sequence[str], capacity: int
) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "discoveryHandler": {
                "name": "debugEcho",
                "discoveryDetails": yaml.safe_dump({"descriptions": list(descriptions)}),
            },
            "capacity": capacity,
        },
    }


def fresh_namespace(kubectl: Kubectl, namespace: str) -> None:
    """The akri.sh CRDs installed and `namespace` there, without the Pods or Configurations an
    interrupted earlier run left (they would hold devices)."""
    kubectl("apply", "-f", str(CRDS))
    kubectl(
        "wait", "--for=condition=Established", "crd/configurations.akri.sh", "crd/instances.akri.sh"
    )
    kubectl("create", "namespace", namespace, check=False)
    clear_namespace(kubectl, namespace)


def dra_class_and_template(
    kubectl: Kubectl, namespace: str, configuration: str, template: str, instance: str
) -> None:
    """The Configuration's DeviceClass (the controller's job in DRA mode; node tests run no
    controller) and a ResourceClaimTemplate `template` for one device of `instance`."""
    kubectl.apply(dra.device_class(configuration, namespace))
    kubectl.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": template, "namespace": namespace},
            "spec": {"spec": dra.claim_spec(configuration, namespace, instance)},
        }
    )


def clear_namespace(
    kubectl: Kubectl, namespace: str, configuration: str = "--all", *, dra_class: bool = False
) -> None:
    """Delete the namespace's Pods, then its Configuration(s), waiting for both, and with
    `dra_class` its ResourceClaimTemplates and the Configuration's DeviceClass."""
    kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    kubectl(
        "delete",
        "configurations.akri.sh",
        configuration,
        "-n",
        namespace,
        "--wait=true",
        "--timeout=30s",
        check=False,
    )
    if dra_class:
        kubectl("delete", "resourceclaimtemplates", "--all", "-n", namespace, check=False)
        kubectl(
            "delete", "deviceclass", dra.device_class_name(configuration, namespace), check=False
        )
