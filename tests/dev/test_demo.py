"""The demo waits for its own Instances only (issue: it timed out on a cluster holding other,
stuck Instances). Running the demo itself is `scripts/just demo`."""

from __future__ import annotations

from typing import Any

from akri_trio_dev import demo


def _instance(namespace: str, config: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{config}-abcdef", "namespace": namespace}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"configurationName": config}}


def test_the_demo_waits_only_for_instances_of_its_configuration_in_its_namespace() -> None:
    mine = _instance(demo.NAMESPACE, demo.CONFIG)
    mine_going = _instance(demo.NAMESPACE, demo.CONFIG, deleting=True)
    others = [
        _instance(demo.NAMESPACE, "someone-elses", deleting=True),  # stuck, in our namespace
        _instance("default", demo.CONFIG, deleting=True),  # our Configuration's name elsewhere
        _instance("default", "other"),
    ]
    assert demo.ours([*others, mine, mine_going]) == [mine, mine_going]
    assert demo.ours(others) == []


def test_dra_mode_switches_both_the_agent_and_the_controller() -> None:
    env = {"AKRI_TRIO_KUBELET_ROOT_DIR": "/var/lib/kubelet", "AKRI_TRIO_CDI_DIR": "/run/cdi"}
    agent, controller = demo.allocation_args("dra", env)
    assert agent == [
        "--allocation", "dra", "--kubelet-root-dir", "/var/lib/kubelet", "--cdi-dir", "/run/cdi"
    ]  # fmt: skip
    assert controller == ["--allocation", "dra"]
    assert demo.allocation_args("device-plugin", env) == ([], [])
