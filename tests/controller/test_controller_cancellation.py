"""The controller's cancellation harness: stop it in the middle of creating brokers, start it
again, and check that it converges to exactly what is wanted, with nothing left behind.

In-process runs hold one broker create at a chosen point (`Hold`, as the agent's harness does
for claims) and cancel the controller there; afterwards the task tree and the fd table are back
to where they were, and a fresh controller makes every broker once. A process run SIGKILLs the
controller while it creates brokers for many Instances, then starts it again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from akri_trio.controller.run import ControllerSettings, RunningController, run_controller
from akri_trio.kube import Client, load_config
from akri_trio.model.resources import CONFIGURATIONS
from tests.controller.support import (
    broker_config,
    brokers,
    fake_nodes,
    make_instance,
    namespace,
    pod_spec,
)
from tests.support.cancellation import (
    Gate,
    Hold,
    all_tasks,
    fds_return_to,
    is_pod_create,
    open_fds,
    tasks_return_to,
)
from tests.support.intercept import Intercepting
from tests.support.polling import until_api

STOP_S = 5.0
REPO = Path(__file__).resolve().parents[2]


async def _expected(api: Client, ns: str, n: int, node: str) -> set[str]:
    config = await api.create(CONFIGURATIONS, broker_config("cfg", ns, pod=pod_spec(nowhere=True)))
    names = set()
    for i in range(n):
        await make_instance(api, config, f"cfg-{i:06x}", [node], shared=False)
        names.add(f"cfg-{i:06x}-pod")
    return names


async def _converged(api: Client, ns: str, want: set[str]) -> bool:
    pods = await brokers(api, ns)
    names = [p["metadata"]["name"] for p in pods]
    assert len(names) == len(set(names))
    return set(names) == want


@pytest.mark.parametrize("hold", [Hold.BEFORE_SEND, Hold.AFTER_ANSWER])
async def test_cancelled_mid_create_converges_after_restart(
    api: Client, cluster: dict[str, str], hold: Hold
) -> None:
    # No heartbeat task: the harness counts tasks and fds; the test ends well inside the grace.
    async with namespace(api, "ctl-cancel") as ns, fake_nodes(api, heartbeat=False) as (node,):
        want = await _expected(api, ns, 6, node)
        # One worker: while the held create parks, no other broker is made.
        settings = ControllerSettings(
            namespace=ns, leader_elect=False, metrics_port=None, workers=1
        )
        tasks_before = len(all_tasks())
        fds_before = open_fds()
        gate = Gate(is_pod_create, hold, at=3)
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def run(task_status: trio.TaskStatus[RunningController]) -> None:
                # Its own connections, closed with it: the fd check sees what the run left.
                with scope:
                    async with Client.open(load_config(cluster["KUBECONFIG"])) as own:
                        gated = Intercepting(own, gate).client
                        await run_controller(settings, api=gated, task_status=task_status)

            await nursery.start(run)
            with trio.fail_after(30):
                await gate.reached.wait()
            scope.cancel()
            stopped = trio.current_time()
        assert trio.current_time() - stopped < STOP_S
        await tasks_return_to(tasks_before)
        await fds_return_to(fds_before)
        made = {p["metadata"]["name"] for p in await brokers(api, ns)}
        assert made < want  # stopped in the middle

        async with trio.open_nursery() as nursery:
            await nursery.start(lambda **kw: run_controller(settings, api=api, **kw))
            await until_api(lambda: _converged(api, ns, want), what="every broker exactly once")
            nursery.cancel_scope.cancel()


async def test_sigkilled_mid_create_converges_after_restart(
    api: Client, cluster: dict[str, str], tmp_path: Path
) -> None:
    async with namespace(api, "ctl-kill") as ns, fake_nodes(api) as (node,):
        want = await _expected(api, ns, 60, node)
        log = (tmp_path / "controller.log").open("ab")
        cmd = [
            sys.executable, "-m", "akri_trio", "controller",
            "--kubeconfig", cluster["KUBECONFIG"],
            "--namespace", ns,
            "--no-leader-elect",
            "--metrics-port", "-1",
            "--workers", "2",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log)  # noqa: ASYNC220
        try:

            async def some() -> bool:
                return len(await brokers(api, ns)) >= 5

            await until_api(some, what="the first brokers", poll=0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            made = {p["metadata"]["name"] for p in await brokers(api, ns)}
            assert made < want, "killed too late to be in the middle"
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log)  # noqa: ASYNC220
            await until_api(lambda: _converged(api, ns, want), what="every broker exactly once")
        finally:
            proc.kill()
            proc.wait()
            log.close()
