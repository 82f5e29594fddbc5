"""Nodes lost while no controller ran, cleaned when one starts; the controller process's flags
and JSON log lines.

The controller runs as a process (`akri-trio controller --log-format json`), is stopped, and
while it is away one node the Instances name is deleted, another goes NotReady (its condition
says: ten minutes ago) and a third goes NotReady just now. The next controller removes the
first two as it would have removed them live, and says so in its log (with the `node` field)
and in Events; the third, maybe a kubelet restarting, keeps its entries until it has been
NotReady for the grace (`--node-lost-grace`), and loses them then.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from akri_trio.kube import JSON, Client
from akri_trio.kube.events import EVENTS
from akri_trio.model.resources import CONFIGURATIONS
from tests.controller.support import (
    NODES,
    fake_nodes,
    instance_gone,
    make_instance,
    namespace,
    served_configuration,
    set_ready,
    with_nodes,
)
from tests.support.polling import until_api

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 30  # long enough for the controller to start and clean the others first


def _lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


class ControllerProcess:
    def __init__(self, cluster: dict[str, str], ns: str, log: Path) -> None:
        self.cmd = [
            sys.executable, "-m", "akri_trio", "controller",
            "--kubeconfig", cluster["KUBECONFIG"],
            "--namespace", ns,
            "--no-leader-elect",
            "--metrics-port", "-1",
            "--log-format", "json",
            "--log-level", "info",
            "--node-lost-grace", str(GRACE_S),
        ]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.log.write_text("")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=out, stderr=out)  # noqa: ASYNC220

        async def synced() -> bool:
            return any("controller synced" in line["message"] for line in _lines(self.log))

        await until_api(synced, what="the controller synced")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


async def test_nodes_lost_while_no_controller_ran_are_cleaned_at_start(
    api: Client, cluster: dict[str, str], tmp_path: Path
) -> None:
    nodes = fake_nodes(api, 4)
    async with namespace(api, "ctl-away") as ns, nodes as (gone, down, blip, up):
        config = await served_configuration(api, ns, [gone, down, blip, up])
        shared = await make_instance(
            api,
            config,
            "cfg-aaaaaa",
            [gone, up],
            usage={"cfg-aaaaaa-0": gone, "cfg-aaaaaa-1": up},
            finalizers=[gone, up],
        )
        await make_instance(api, config, "cfg-bbbbbb", [gone], finalizers=[gone])
        await make_instance(api, config, "cfg-cccccc", [down, up], finalizers=[down])
        await make_instance(api, config, "cfg-dddddd", [blip, up], finalizers=[blip])

        controller = ControllerProcess(cluster, ns, tmp_path / "controller.log")
        try:
            await controller.start()
            assert controller.stop() == 0
            first = _lines(controller.log)
            # The start-up line: the version and the effective settings, as fields.
            assert "akri-trio controller" in first[0]["message"]
            assert first[0]["message"].endswith("starting")
            settings = first[0]["settings"]
            assert settings["namespace"] == ns and settings["log_format"] == "json"
            assert settings["leader_elect"] is False
            assert not any(line["level"] == "WARNING" for line in first)  # nothing was lost

            # While no controller runs: one node is deleted, two go NotReady.
            await api.delete(NODES, gone)
            await set_ready(api, down, False, since=600)
            await set_ready(api, blip, False)
            await controller.start()

            inst = await until_api(
                lambda: with_nodes(api, ns, "cfg-aaaaaa", [up]),
                what=f"{gone} removed from the shared Instance",
            )
            assert inst["spec"]["deviceUsage"] == {"cfg-aaaaaa-1": up}
            assert inst["metadata"]["finalizers"] == [up]
            assert inst["metadata"]["uid"] == shared["metadata"]["uid"]
            await until_api(
                lambda: instance_gone(api, ns, "cfg-bbbbbb"),
                what="the Instance left with no node deleted",
            )
            await until_api(
                lambda: with_nodes(api, ns, "cfg-cccccc", [up]), what=f"the NotReady {down} removed"
            )

            async def status_released() -> bool:
                cfg = await api.get(CONFIGURATIONS, "cfg", namespace=ns)
                named = {entry.get("node") for entry in cfg["status"].get("nodes") or []}
                return {up, blip} <= named and not named & {gone, down}

            await until_api(status_released, what="the lost nodes' status entries removed")

            async def node_lost() -> list[JSON]:
                selector = f"involvedObject.uid={shared['metadata']['uid']}"
                events = await api.list(EVENTS, namespace=ns, field_selector=selector)
                return [e for e in events.items if e["reason"] == "NodeLost"]

            (event,) = await until_api(node_lost, what="a NodeLost Event on the shared Instance")
            assert event["message"] == (
                f"node {gone} lost (deleted while no controller ran): "
                "removed from its nodes; freed cfg-aaaaaa-0"
            )
            lost = {
                line["node"]: line
                for line in _lines(controller.log)
                if line["level"] == "WARNING" and "is lost" in line["message"]
            }
            assert set(lost) == {gone, down}
            assert "NotReady when this controller started" in lost[down]["message"]
            # The node NotReady for less than the grace: kept, and looked at again then.
            assert any(
                line.get("node") == blip and "unless it is Ready again" in line["message"]
                for line in _lines(controller.log)
            )
            assert await with_nodes(api, ns, "cfg-dddddd", [blip, up])
            await until_api(
                lambda: with_nodes(api, ns, "cfg-dddddd", [up]),
                seconds=2 * GRACE_S,
                what=f"{blip} removed once NotReady for the grace",
            )
            assert blip in {
                line["node"]
                for line in _lines(controller.log)
                if line["level"] == "WARNING" and "is lost" in line["message"]
            }
            removed = [
                line
                for line in _lines(controller.log)
                if line["message"].startswith("removed lost")
            ]
            assert {(line["instance"], line["node"]) for line in removed} >= {
                (f"{ns}/cfg-aaaaaa", gone),
                (f"{ns}/cfg-cccccc", down),
            }
        finally:
            controller.stop()


def test_a_bad_log_level_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "akri_trio", "controller", "--log-level", "loud"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "invalid level 'loud'" in proc.stderr
    assert "Traceback" not in proc.stderr
