"""Hostile input to an agent running as a process against the real control plane.

One `akri-trio agent` process (debugEcho embedded under this module's own name, see
tests/support/echo_agent.py) serves a node name of its own and only the Configurations that carry
this module's label, in two namespaces of its own; a kubelet stand-in takes its device plugins.
Each test then plays a tenant or a handler that misbehaves: a Secret of another namespace, a
second Configuration of the same name, devices a kubelet must not get, colliding instance
hashes, a capacity over the agent's maximum, a poisoned deviceUsage key.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from akri_trio.kube.client import Client, Resource
from akri_trio.kube.config import KubeConfig, load_config
from akri_trio.kube.errors import Forbidden, NotFound
from akri_trio.model import naming
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from tests.support.akri_cluster import ensure_namespace, install_crds, purge_namespace
from tests.support.chart import render
from tests.support.kubelet_standin import KubeletStandin
from tests.support.polling import until_api, when
from tests.support.rbac import RBAC_KINDS, account_token
from tests.support.traverse import traversable_by_others

TAG = secrets.token_hex(3)
NODE = f"hostile-{TAG}"
ECHO = f"hostileEcho{TAG}"
LABEL = {"hostile-test": TAG}
NS_A, NS_B = f"hostile-a-{TAG}", f"hostile-b-{TAG}"
MAX_CAPACITY = 5
MAX_PER_HANDLER = 4
WAIT_S = 45  # polling the API server while a hostile handler floods it
SECRET_VALUE = f"s3cr3t-{TAG}"
OTHER_SECRET_VALUE = f"other-{TAG}"
SECRETS = Resource.core("secrets", "Secret")
NAMESPACES = Resource.core("namespaces", "Namespace", namespaced=False)
REPO = Path(__file__).resolve().parents[2]


class Agent:
    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.log_path = tmp / "agent.log"
        self.kubelet = KubeletStandin(tmp / "plugins").start()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "tests.support.echo_agent",
                    "--echo-name", ECHO,
                    "--node-name", NODE,
                    "--configuration-selector", f"hostile-test={TAG}",
                    "--device-plugin-dir", str(tmp / "plugins"),
                    "--pod-resources-socket", str(tmp / "pod-resources" / "kubelet.sock"),
                    "--discovery-handlers-directory", str(tmp / "akri"),
                    "--debug-echo-availability", str(tmp / "availability"),
                    "--metrics-port", "-1",
                    "--log-level", "debug",
                    "--max-capacity", str(MAX_CAPACITY),
                    "--max-devices-per-handler", str(MAX_PER_HANDLER),
                ],
                cwd=REPO,
                env={**os.environ, "KUBECONFIG": env["KUBECONFIG"], "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self.kubelet.stop()


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM (the agent then removes its sockets), SIGKILL after 20 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _prepare(env: dict[str, str]) -> None:
    async with Client.open(load_config(env["KUBECONFIG"])) as api:
        await install_crds(api)
        for ns in (NS_A, NS_B):
            await ensure_namespace(api, ns)


async def _clean(env: dict[str, str]) -> None:
    async with Client.open(load_config(env["KUBECONFIG"])) as api:
        for ns in (NS_A, NS_B):
            await purge_namespace(api, ns)
            with contextlib.suppress(NotFound):
                await api.delete(NAMESPACES, ns)


@pytest.fixture(scope="module")
def namespaces(cluster: dict[str, str]) -> Iterator[None]:
    """The CRDs and this module's two namespaces; emptied and deleted at the end."""
    trio.run(_prepare, cluster)
    try:
        yield
    finally:
        trio.run(_clean, cluster)


@pytest.fixture(scope="module")
def agent(
    cluster: dict[str, str], namespaces: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agent]:
    # Unix socket paths must stay short: pytest's tmp dirs are too deep.
    tmp = Path(tmp_path_factory.mktemp("hostile", numbered=True))
    short = Path("/tmp") / f"hostile-{TAG}"
    short.symlink_to(tmp)
    running = Agent(cluster, short)
    try:
        yield running
    finally:
        running.stop()
        short.unlink()


def config(
    name: str, namespace: str, descriptions: list[str], *, capacity: int = 2, **handler: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace, "labels": LABEL},
        "spec": {
            "discoveryHandler": {
                "name": ECHO,
                "discoveryDetails": yaml.safe_dump({"descriptions": descriptions}),
                **handler,
            },
            "capacity": capacity,
        },
    }


async def conditions(api: Client, name: str, namespace: str) -> dict[str, tuple[str, str, str]]:
    obj = await api.get(CONFIGURATIONS, name, namespace=namespace)
    entries = [e for e in (obj.get("status") or {}).get("nodes") or [] if e["node"] == NODE]
    return {
        c["type"]: (c["status"], c["reason"], c["message"])
        for e in entries
        for c in e.get("conditions") or []
    }


async def instances(api: Client, namespace: str, config_name: str) -> dict[str, dict[str, Any]]:
    items = (await api.list(INSTANCES, namespace=namespace)).items
    return {
        i["metadata"]["name"]: i
        for i in items
        if i["spec"]["configurationName"] == config_name and NODE in i["spec"].get("nodes", [])
    }


async def kubelet_until(agent: Agent, predicate: Callable[[KubeletStandin], bool]) -> None:
    """Wait (in a thread) for the kubelet stand-in to see what `predicate` asks; 60 s at most."""
    await trio.to_thread.run_sync(agent.kubelet.wait_for, predicate, 60.0)


def instance_for(config_name: str, device: str) -> str:
    return naming.instance_name(config_name, naming.device_hash(device, NODE))


async def test_a_secret_of_another_namespace_is_refused_and_no_secret_is_ever_shown(
    agent: Agent, api: Client
) -> None:
    for ns, value in ((NS_A, SECRET_VALUE), (NS_B, OTHER_SECRET_VALUE)):
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": ns},
            "data": {"password": base64.b64encode(value.encode()).decode()},
        }
        await api.apply(SECRETS, secret, field_manager="hostile-tests", namespace=ns)

    def ref(namespace: str | None) -> list[dict[str, Any]]:
        key_ref = {"name": "creds", "key": "password"}
        if namespace is not None:
            key_ref["namespace"] = namespace
        return [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": key_ref}}]

    await api.create(
        CONFIGURATIONS,
        config("thief", NS_A, ["t0"], discoveryProperties=ref(NS_B)),
        namespace=NS_A,
    )
    await api.create(
        # no namespace: the Configuration's own (upstream: `default`, the same in `default`)
        CONFIGURATIONS,
        config("owner", NS_A, ["o0"], discoveryProperties=ref(None)),
        namespace=NS_A,
    )

    async def thief_refused() -> Any:
        found = (await conditions(api, "thief", NS_A)).get("PropertiesResolved")
        return found if found and found[0] == "False" else None

    _, reason, message = await until_api(thief_refused, seconds=WAIT_S)
    assert reason == "OtherNamespace"
    assert message.startswith("discoveryProperties 'PASSWORD': ")
    assert f"Secret {NS_B}/creds" in message and "own namespace" in message
    assert await instances(api, NS_A, "thief") == {}
    await until_api(lambda: instances(api, NS_A, "owner"), seconds=WAIT_S)

    async def owner_resolved() -> bool:  # the status is written after the Instances
        return (await conditions(api, "owner", NS_A)).get("PropertiesResolved", ("",))[0] == "True"

    await until_api(owner_resolved, seconds=WAIT_S)
    assert f"Secret {NS_B}/creds" in agent.log()  # the refusal is logged

    for name in ("thief", "owner"):
        shown = str(await api.get(CONFIGURATIONS, name, namespace=NS_A))
        assert SECRET_VALUE not in shown and OTHER_SECRET_VALUE not in shown
    log = agent.log()
    assert SECRET_VALUE not in log and OTHER_SECRET_VALUE not in log


async def test_a_second_configuration_of_the_same_name_is_refused_until_the_first_goes(
    agent: Agent, api: Client
) -> None:
    name = f"tenant-{TAG}"
    await api.create(CONFIGURATIONS, config(name, NS_A, ["a0"]), namespace=NS_A)
    first = await until_api(lambda: instances(api, NS_A, name), seconds=WAIT_S)
    await trio.sleep(1.1)  # a later creationTimestamp (one-second resolution)
    await api.create(CONFIGURATIONS, config(name, NS_B, ["b0"]), namespace=NS_B)

    async def refused() -> Any:
        found = (await conditions(api, name, NS_B)).get("Accepted")
        return found if found and found[0] == "False" else None

    _, reason, message = await until_api(refused, seconds=WAIT_S)
    assert reason == "NameTaken" and f"{NS_A}/{name}" in message

    async def owner_accepted() -> bool:
        return (await conditions(api, name, NS_A)).get("Accepted", ("",))[0] == "True"

    await until_api(owner_accepted, seconds=WAIT_S)
    assert await instances(api, NS_B, name) == {}
    assert list(await instances(api, NS_A, name)) == list(first)
    resource = f"akri.sh/{name}"
    assert agent.kubelet.healthy(resource) == [f"{name}-0"]  # A's, alone
    assert f"Configuration {NS_B}/{name} refused on this node" in agent.log()

    await api.delete(CONFIGURATIONS, name, namespace=NS_A)  # B takes the name over
    await until_api(lambda: instances(api, NS_B, name), seconds=WAIT_S)

    async def accepted() -> bool:
        return (await conditions(api, name, NS_B)).get("Accepted", ("",))[0] == "True"

    await until_api(accepted, seconds=WAIT_S)
    b0 = instance_for(name, "b0")
    await kubelet_until(
        agent,
        lambda k: (
            k.healthy(f"akri.sh/{b0}") == [f"{b0}-0", f"{b0}-1"]
            and k.healthy(resource) == [f"{name}-0"]
        ),
    )
    response = await trio.to_thread.run_sync(agent.kubelet.allocate, resource, [[f"{name}-0"]])
    assert response.container_responses[0].envs["DEBUG_ECHO_DESCRIPTION"] == "b0"


def colliding_pair() -> tuple[str, str]:
    """Two device ids whose local instance hashes on NODE are equal (24 bits: ~5000 tries)."""
    seen: dict[str, str] = {}
    i = 0
    while True:
        device = f"dev{i}"
        digest = hashlib.blake2b((device + NODE).encode(), digest_size=3).hexdigest()
        if digest in seen:
            return seen[digest], device
        seen[digest] = device
        i += 1


async def test_bad_devices_are_dropped_with_reasons_and_collisions_pick_one_device(
    agent: Agent, api: Client
) -> None:
    low, high = sorted(colliding_pair())
    name = f"bad-{TAG}"
    await api.create(
        CONFIGURATIONS,
        config(name, NS_A, [high, "nul\0byte", "dup", low, "dup"]),
        namespace=NS_A,
    )

    async def refused() -> Any:
        found = (await conditions(api, name, NS_A)).get("DevicesAccepted")
        return found if found and found[0] == "False" else None

    _, reason, message = await until_api(refused, seconds=WAIT_S)
    assert reason == "DevicesRefused"
    assert "'nul\\x00byte' dropped: property 'DEBUG_ECHO_DESCRIPTION' holds a NUL" in message
    assert "device id 'dup' sent 2 times" in message
    shared = instance_for(name, low)
    assert f"device ids {high!r} hash to Instance {shared}" in message
    made = await until_api(lambda: instances(api, NS_A, name), seconds=WAIT_S)
    assert set(made) == {shared, instance_for(name, "dup")}
    # The Instance describes the lowest id, and Allocate hands out the same device.
    assert made[shared]["spec"]["brokerProperties"] == {"DEBUG_ECHO_DESCRIPTION": low}
    await kubelet_until(agent, lambda k: len(k.healthy(f"akri.sh/{shared}")) == 2)
    response = await trio.to_thread.run_sync(
        agent.kubelet.allocate, f"akri.sh/{shared}", [[f"{shared}-0"]]
    )
    assert response.container_responses[0].envs["DEBUG_ECHO_DESCRIPTION"] == low
    assert f"hash to Instance {shared}" in agent.log()


async def test_device_and_capacity_limits_are_flags_with_a_status_condition(
    agent: Agent, api: Client
) -> None:
    many = f"many-{TAG}"
    await api.create(
        CONFIGURATIONS, config(many, NS_A, [f"d{i}" for i in range(6)]), namespace=NS_A
    )
    big = f"big-{TAG}"
    await api.create(
        CONFIGURATIONS, config(big, NS_A, ["x"], capacity=MAX_CAPACITY + 1), namespace=NS_A
    )

    async def cut() -> Any:
        found = (await conditions(api, many, NS_A)).get("DevicesAccepted")
        return found if found and found[0] == "False" else None

    _, _, message = await until_api(cut, seconds=WAIT_S)
    assert f"only the first {MAX_PER_HANDLER} by id are used" in message
    made = await until_api(
        lambda: when(lambda: instances(api, NS_A, many), lambda m: len(m) == MAX_PER_HANDLER),
        seconds=WAIT_S,
    )
    assert set(made) == {instance_for(many, f"d{i}") for i in range(MAX_PER_HANDLER)}

    async def too_big() -> Any:
        found = (await conditions(api, big, NS_A)).get("Accepted")
        return found if found and found[0] == "False" else None

    _, reason, message = await until_api(too_big, seconds=WAIT_S)
    assert reason == "CapacityTooLarge" and f"maximum {MAX_CAPACITY}" in message
    assert await instances(api, NS_A, big) == {}


async def test_a_poisoned_device_usage_key_leaves_every_call_working(
    agent: Agent, api: Client
) -> None:
    name = f"poison-{TAG}"
    await api.create(CONFIGURATIONS, config(name, NS_A, ["p0"], capacity=3), namespace=NS_A)
    inst = instance_for(name, "p0")
    await until_api(lambda: instances(api, NS_A, name), seconds=WAIT_S)
    resource = f"akri.sh/{inst}"
    await kubelet_until(agent, lambda k: len(k.healthy(resource)) == 3)
    poison = {f"{inst}-{'9' * 5000}": NODE, f"{inst}-x": "C:junk", f"{inst}-1": "someone"}
    await api.merge_patch(INSTANCES, inst, {"spec": {"deviceUsage": poison}}, namespace=NS_A)
    # ListAndWatch: the real slot someone holds turns unhealthy; the junk is no slot at all.
    await kubelet_until(agent, lambda k: k.healthy(resource) == [f"{inst}-0", f"{inst}-2"])
    chosen = await trio.to_thread.run_sync(
        agent.kubelet.preferred, resource, [f"{inst}-0", f"{inst}-2"], 1
    )
    assert len(chosen) == 1
    await trio.to_thread.run_sync(agent.kubelet.allocate, resource, [chosen])
    usage = (await api.get(INSTANCES, inst, namespace=NS_A))["spec"]["deviceUsage"]
    assert usage[chosen[0]] == NODE and set(poison) <= set(usage)
    # The configuration-level plugin answers too, and Allocate maps onto the free slot.
    config_resource = f"akri.sh/{name}"
    await kubelet_until(agent, lambda k: k.healthy(config_resource) == [f"{name}-0"])
    await trio.to_thread.run_sync(agent.kubelet.allocate, config_resource, [[f"{name}-0"]])
    assert agent.log().count("is not a slot; ignored") == 2  # once per key, however often seen
    assert agent.proc.poll() is None


HANDLER_GID = 65532
HANDLER = """
import functools, pathlib, sys, trio
from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.discovery.standalone import run_standalone
directory, name = pathlib.Path(sys.argv[1]), sys.argv[2]
echo = DebugEcho(name=name, availability_path=directory / "availability", poll_interval=0.2)
trio.run(functools.partial(
    run_standalone, echo, registration_socket=directory / "agent-registration.sock",
    socket_path=directory / f"{name}.sock"))
"""


async def test_a_non_root_handler_serves_an_agent_without_capabilities(
    cluster: dict[str, str], namespaces: None, api: Client, tmp_path: Path
) -> None:
    """The DaemonSets' shape: the agent is root with every capability dropped and the handlers'
    group as a supplementary one; the handler runs as that non-root user and group."""
    node, name = f"{NODE}-nonroot", f"nonroot-{TAG}"
    handler_name = f"{ECHO}NonRoot"
    directory = Path("/tmp") / f"hostile-h-{TAG}"
    directory.mkdir(mode=0o755)
    plugins = Path("/tmp") / f"hostile-p-{TAG}"
    kubelet = KubeletStandin(plugins).start()
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"], "PYTHONUNBUFFERED": "1"}
    setpriv = ["setpriv", "--reuid=0", "--regid=0", f"--groups={HANDLER_GID}"]
    no_caps = ["--inh-caps=-all", "--bounding-set=-all"]
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115, ASYNC230  (closed below)
    agent = subprocess.Popen(  # noqa: ASYNC220  (a process for the whole test)
        [
            *setpriv, *no_caps, sys.executable, "-m", "akri_trio", "agent",
            "--node-name", node,
            "--configuration-selector", f"hostile-test={TAG}",
            "--device-plugin-dir", str(plugins),
            "--pod-resources-socket", str(tmp_path / "pod-resources.sock"),
            "--discovery-handlers-directory", str(directory),
            "--handler-group", str(HANDLER_GID),
            "--metrics-port", "-1",
        ],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    handler: subprocess.Popen[bytes] | None = None
    stack = contextlib.ExitStack()
    try:
        registration = directory / "agent-registration.sock"
        await until_api(lambda: _returns(registration.exists()), seconds=30)
        non_root = [f"--reuid={HANDLER_GID}", f"--regid={HANDLER_GID}", "--clear-groups"]
        stack.enter_context(traversable_by_others(REPO, Path(sys.prefix)))
        handler = subprocess.Popen(  # noqa: ASYNC220  (a process for the whole test)
            ["setpriv", *non_root, *no_caps, sys.executable, "-c", HANDLER, str(directory),
             handler_name],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        cfg = config(name, NS_A, ["n0"])
        cfg["spec"]["discoveryHandler"]["name"] = handler_name
        await api.create(CONFIGURATIONS, cfg, namespace=NS_A)
        made = await until_api(lambda: _instances_on(api, node, name), seconds=60)
        assert list(made) == [naming.instance_name(name, naming.device_hash("n0", node))]
        info = directory.stat()
        assert (info.st_gid, oct(info.st_mode & 0o7777)) == (HANDLER_GID, oct(0o3770))
        assert oct(registration.stat().st_mode & 0o777) == oct(0o660)
        served = (directory / f"{handler_name}.sock").stat()
        assert (served.st_uid, served.st_gid) == (HANDLER_GID, HANDLER_GID)
        assert oct(served.st_mode & 0o777) == oct(0o660)
    finally:
        stop_process(handler)
        stack.close()
        stop_process(agent)
        log.close()
        kubelet.stop()
        print((tmp_path / "agent.log").read_text()[-3000:])
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(plugins, ignore_errors=True)


async def _returns(value: Any) -> Any:
    return value


async def _instances_on(api: Client, node: str, config_name: str) -> dict[str, Any]:
    items = (await api.list(INSTANCES, namespace=NS_A)).items
    return {
        i["metadata"]["name"]: i
        for i in items
        if i["spec"]["configurationName"] == config_name and node in i["spec"].get("nodes", [])
    }


async def test_the_chart_can_grant_secrets_per_namespace_only(
    cluster: dict[str, str], namespaces: None, api: Client
) -> None:
    """rbac.secretsNamespaces on the real API server: the agent's ServiceAccount reads the
    Secrets of the namespaces listed, and of no other."""
    release = f"hostile-{TAG}"
    objects = [
        o
        for o in render({"rbac": {"secretsNamespaces": [NS_A]}}, namespace=NS_B, release=release)
        if o["kind"] in RBAC_KINDS and o["metadata"]["name"].startswith(("akri-agent", release))
        and "agent" in o["metadata"]["name"]
    ]  # fmt: skip
    for ns in (NS_A, NS_B):
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "rbac-probe", "namespace": ns},
            "stringData": {"k": "v"},
        }
        await api.apply(SECRETS, secret, field_manager="hostile-tests", namespace=ns)
    try:
        for obj in objects:
            await api.apply(RBAC_KINDS[obj["kind"]], obj, field_manager="hostile-tests", force=True)
        token = await account_token(api, NS_B, "akri-agent-sa")
        config = KubeConfig(
            server=cluster["AKRI_TRIO_APISERVER"],
            token=token,
            ca_pem=await trio.Path(cluster["AKRI_TRIO_CA_CERT"]).read_bytes(),
        )
        async with Client.open(config) as agent_api:

            async def readable() -> bool:
                with contextlib.suppress(Forbidden):
                    await agent_api.get(SECRETS, "rbac-probe", namespace=NS_A)
                    return True
                return False

            await until_api(readable, seconds=30)  # RBAC is cached by the API server for a moment
            with pytest.raises(Forbidden):
                await agent_api.get(SECRETS, "rbac-probe", namespace=NS_B)
            await agent_api.list(CONFIGURATIONS)  # the rest of its rights are cluster-wide
    finally:
        for obj in objects:
            if not RBAC_KINDS[obj["kind"]].namespaced:
                with contextlib.suppress(NotFound):
                    await api.delete(RBAC_KINDS[obj["kind"]], obj["metadata"]["name"])
