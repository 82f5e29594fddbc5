"""The picture joins Configurations, Instances, Pods and Jobs; its text names what is wrong."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.observe.picture import akri_requests, picture, render_text


def config(name: str, *, nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"discoveryHandler": {"name": "debugEcho"}, "capacity": 2},
        "status": {"nodes": nodes or []},
    }


def instance(name: str, cfg: str, usage: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {
            "configurationName": cfg,
            "capacity": 2,
            "shared": True,
            "nodes": ["n1"],
            "deviceUsage": usage,
            **spec,
        },
    }


def pod(name: str, node: str, resources: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "apps", "name": name, "labels": extra.pop("labels", {})},
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": resources}}]},
        "status": {"phase": extra.pop("phase", "Running")},
    }


BAD_HANDLER = {
    "node": "n2",
    "instances": 0,
    "handlers": [],
    "problems": [],
    "conditions": [
        {"type": "HandlerAvailable", "status": "False", "reason": "NoHandler",
         "message": "no discovery handler named 'debugEcho' is registered with the agent on n2"},
        {"type": "DiscoveryDetailsValid", "status": "True", "reason": "Valid", "message": ""},
    ],
}  # fmt: skip
GOOD = {
    "node": "n1",
    "instances": 1,
    "handlers": [{"endpoint": "embedded", "state": "Active"}],
    "conditions": [{"type": "HandlerAvailable", "status": "True", "reason": "Registered"}],
}


def test_akri_requests_sums_akri_resources_only() -> None:
    p = pod("p", "n1", {"akri.sh/cam-1": "1", "cpu": "1"})
    p["spec"]["containers"].append({"resources": {"requests": {"akri.sh/cam-1": "2"}}})
    assert akri_requests(p) == {"cam-1": 3}
    assert akri_requests({"spec": {}}) == {}


def test_which_pod_holds_which_slot() -> None:
    pic = picture(
        [config("cam", nodes=[GOOD, BAD_HANDLER])],
        [instance("cam-1", "cam", {"cam-1-0": "", "cam-1-1": "n1"}),
         instance("cam-2", "cam", {"cam-2-0": "C:cam-0:n1"})],
        [pod("user", "n1", {"akri.sh/cam-1": "1"}),
         pod("anyone", "n1", {"akri.sh/cam": "1"}),
         pod("done", "n1", {"akri.sh/cam-1": "1"}, phase="Succeeded"),
         pod("elsewhere", "n2", {"akri.sh/cam-1": "1"}),
         pod("broker", "n1", {}, labels={"akri.sh/instance": "cam-1",
                                         "akri.sh/configuration": "cam"})],
    )  # fmt: skip
    (cfg,) = pic["configurations"]
    assert cfg["instances"] == ["cam-1", "cam-2"]
    inst1, inst2 = pic["instances"]
    assert [(s["slot"], s["node"], s["pods"]) for s in inst1["slots"]] == [
        ("cam-1-0", "", []),
        ("cam-1-1", "n1", ["apps/user"]),
    ]
    assert inst1["used"] == 1
    assert inst2["slots"][0] == {
        "slot": "cam-2-0", "node": "n1", "vdev": "cam-0", "pods": ["apps/anyone"],
    }  # fmt: skip
    # the broker is in apps, the Instance in ns: brokers are matched in their own namespace
    assert inst1["brokers"] == []
    text = render_text(pic)
    assert "cam-1-1" in text and "n1  apps/user" in text
    assert "cam-2-0" in text and "n1 (as cam-0)  apps/anyone" in text
    assert "node n2: handlers no handler; 0 instance(s); HandlerAvailable=False" in text
    assert "no discovery handler named 'debugEcho' is registered with the agent on n2" in text
    assert "node n1: handlers 1 Active; 1 instance(s); ok" in text


def test_brokers_jobs_orphans_and_nodes() -> None:
    broker = pod("cam-1-pod", "n1", {}, labels={"akri.sh/instance": "cam-1"})
    broker["metadata"]["namespace"] = "ns"
    job = {
        "metadata": {"namespace": "ns", "name": "j", "labels": {"akri.sh/instance": "cam-1"}},
        "status": {"active": 1},
    }
    cfg_svc_pod = pod("cfg-level", "n1", {}, labels={"akri.sh/configuration": "cam"})
    cfg_svc_pod["metadata"]["namespace"] = "ns"
    node = {
        "metadata": {"name": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    pic = picture(
        [config("cam")],
        [instance("cam-1", "cam", {}), instance("lost-1", "lost", {}, shared=False)],
        [broker, cfg_svc_pod],
        [job],
        [node, {"metadata": {"name": "n2"}}],
    )
    inst = pic["instances"][0]
    assert [(b["kind"], b["name"], b["phase"]) for b in inst["brokers"]] == [
        ("Pod", "ns/cam-1-pod", "Running"),
        ("Job", "ns/j", "Running"),
    ]
    assert pic["configurations"][0]["brokers"][0]["name"] == "ns/cfg-level"
    assert pic["nodes"] == [{"name": "n1", "ready": True}, {"name": "n2", "ready": False}]
    text = render_text(pic)
    assert "no agent has reported on it yet" in text
    assert "Instances without their Configuration:\n  Instance lost-1  local" in text
    assert "broker Pod ns/cam-1-pod  on n1  Running" in text


def test_empty() -> None:
    assert render_text(picture([], [])) == "No Configurations or Instances.\n"


usage_values = st.sampled_from(["", "n1", "n2", "C:cam-0:n1", "garbage"])


@given(st.dictionaries(st.sampled_from([f"cam-1-{i}" for i in range(5)]), usage_values),
       st.integers(0, 4))  # fmt: skip
def test_every_slot_below_capacity_is_listed_and_held_ones_beyond_it(
    usage: dict[str, str], capacity: int
) -> None:
    pic = picture([], [instance("cam-1", "cam", usage, capacity=capacity)])
    slots = {s["slot"]: s for s in pic["instances"][0]["slots"]}
    held = {k for k, v in usage.items() if v}
    assert set(slots) == {f"cam-1-{i}" for i in range(capacity)} | held
    assert pic["instances"][0]["used"] == len(held)
    render_text(pic)
