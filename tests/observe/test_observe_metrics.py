"""The exact exposition a Prometheus scrape reads: upstream's names, labels and buckets, no
`_total` on upstream's counter, no `_created` series, and children that go when removed."""

from __future__ import annotations

import pytest
import trio
from prometheus_client import Gauge
from prometheus_client.parser import text_string_to_metric_families

from akri_trio.address import ObjectKey
from akri_trio.agent.metrics import AgentMetrics, slot_counts
from akri_trio.controller.metrics import ControllerMetrics
from akri_trio.model.resources import Instance, InstanceSpec, ObjectMeta
from akri_trio.observe.metrics import (
    CONTENT_TYPE,
    DISCOVERY_BUCKETS,
    GaugeSnapshot,
    Registry,
    SuffixlessCounter,
    UpstreamFamilies,
    new_registry,
    remove_matching,
    render,
)


def lines(registry: Registry, prefix: str) -> list[str]:
    return [
        line
        for line in render(registry).decode().splitlines()
        if line.startswith(prefix) or line.startswith(f"# TYPE {prefix}")
    ]


def test_content_type_is_the_classic_text_format() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_upstream_buckets() -> None:
    assert DISCOVERY_BUCKETS == (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 60.0)


def test_instance_count_has_upstream_labels_plus_namespace() -> None:
    reg = new_registry(process=False)
    fam = UpstreamFamilies(reg)
    fam.set_instance_count("cams", "onvif-cams", True, 3)
    fam.set_instance_count("cams", "onvif-cams", False, 0)
    assert lines(reg, "akri_instance_count") == [
        "# TYPE akri_instance_count gauge",
        'akri_instance_count{configuration="onvif-cams",is_shared="true",namespace="cams"} 3.0',
        'akri_instance_count{configuration="onvif-cams",is_shared="false",namespace="cams"} 0.0',
    ]
    fam.forget_configuration("cams", "onvif-cams")
    assert lines(reg, "akri_instance_count") == ["# TYPE akri_instance_count gauge"]


def test_discovery_result_is_exported_without_a_total_suffix() -> None:
    reg = new_registry(process=False)
    fam = UpstreamFamilies(reg)
    fam.discovery_result("debugEcho", True)
    fam.discovery_result("debugEcho", True)
    fam.discovery_result("udev", False)
    text = render(reg).decode()
    assert "akri_discovery_response_result_total" not in text
    assert "_created" not in text
    assert lines(reg, "akri_discovery_response_result") == [
        "# TYPE akri_discovery_response_result untyped",
        'akri_discovery_response_result{discovery_handler_name="debugEcho",result="Success"} 2.0',
        'akri_discovery_response_result{discovery_handler_name="udev",result="Fail"} 1.0',
    ]
    # What a Prometheus server parses: the bare name, upstream's labels.
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "akri_discovery_response_result"
    ]
    assert {(s.name, s.labels["result"], s.value) for s in family.samples} == {
        ("akri_discovery_response_result", "Success", 2.0),
        ("akri_discovery_response_result", "Fail", 1.0),
    }


def test_discovery_response_time_histogram_in_upstream_buckets() -> None:
    reg = new_registry(process=False)
    fam = UpstreamFamilies(reg)
    fam.discovery_response_time.labels(configuration="foo").observe(1.2)
    got = lines(reg, "akri_discovery_response_time")
    assert got[0] == "# TYPE akri_discovery_response_time histogram"
    buckets = [line for line in got if "_bucket" in line]
    assert [b.split('le="')[1].split('"')[0] for b in buckets] == [
        "0.25", "0.5", "1.0", "1.5", "2.0", "3.0", "5.0", "10.0", "60.0", "+Inf",
    ]  # fmt: skip
    assert 'akri_discovery_response_time_bucket{configuration="foo",le="1.0"} 0.0' in got
    assert 'akri_discovery_response_time_bucket{configuration="foo",le="1.5"} 1.0' in got
    assert 'akri_discovery_response_time_count{configuration="foo"} 1.0' in got


def test_suffixless_counter_counts_and_forgets() -> None:
    reg = new_registry(process=False)
    c = SuffixlessCounter("akri_things", "Things.", ("kind",), registry=reg)
    c.labels(kind="a").inc(2)
    c.labels(kind="b").inc()
    with pytest.raises(ValueError):
        c.labels(kind="a").inc(-1)
    c.remove_matching(kind="a")
    assert lines(reg, "akri_things") == ["# TYPE akri_things untyped", 'akri_things{kind="b"} 1.0']
    with pytest.raises(ValueError):
        SuffixlessCounter("akri_things", "again", ("kind",), registry=reg)  # a clash


def test_remove_matching_takes_every_child_with_those_labels() -> None:
    reg = new_registry(process=False)
    g = Gauge("g", "h", ("namespace", "configuration", "node"), registry=reg)
    for ns, cfg, node in [("a", "x", "n1"), ("a", "x", "n2"), ("a", "y", "n1"), ("b", "x", "n1")]:
        g.labels(namespace=ns, configuration=cfg, node=node).set(1)
    remove_matching(g, namespace="a", configuration="x")
    left = {
        (s.labels["namespace"], s.labels["configuration"]) for m in g.collect() for s in m.samples
    }
    assert left == {("a", "y"), ("b", "x")}
    with pytest.raises(ValueError):
        remove_matching(g)
    with pytest.raises(ValueError):
        remove_matching(g, nope="1")


def test_gauge_snapshot_replaces_the_whole_set() -> None:
    reg = new_registry(process=False)
    snap = GaugeSnapshot(Gauge("s", "h", ("a", "b"), registry=reg))
    snap.replace({("1", "x"): 2, ("2", "x"): 3})
    snap.replace({("2", "x"): 4})
    assert lines(reg, "s{") == ['s{a="2",b="x"} 4.0']


def test_controller_broker_pod_count_and_queue_depth() -> None:
    def pod(node: str | None, deleting: bool = False) -> dict[str, object]:
        labels = {"akri.sh/configuration": "foo"} | ({"akri.sh/target-node": node} if node else {})
        meta: dict[str, object] = {"labels": labels}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta}

    m = ControllerMetrics(
        new_registry(process=False),
        broker_pods=lambda: [pod("node-a"), pod("node-a", deleting=True), pod(None)],
    )
    queue = [1, 2, 3]
    m.queue_depth.labels(controller="brokers").set_function(lambda: float(len(queue)))
    assert lines(m.registry, "akri_broker_pod_count") == [
        "# TYPE akri_broker_pod_count gauge",
        'akri_broker_pod_count{configuration="foo",node="node-a"} 1.0',
    ]
    assert 'akri_reconcile_queue_depth{controller="brokers"} 3.0' in lines(
        m.registry, "akri_reconcile_queue_depth"
    )


def test_process_metrics_are_exported() -> None:
    text = render(new_registry()).decode()
    assert "process_resident_memory_bytes" in text
    assert "process_cpu_seconds_total" in text


def _inst(name: str, capacity: int, usage: dict[str, str]) -> Instance:
    return Instance(
        ObjectMeta(name=name, namespace="ns"),
        InstanceSpec(configuration_name="cfg", cdi_name="akri.sh/cfg=x", capacity=capacity,
                     device_usage=usage),
    )  # fmt: skip


def test_slot_counts() -> None:
    assert slot_counts(_inst("i", 3, {})) == (0, 3)
    assert slot_counts(_inst("i", 3, {"i-0": "n1", "i-1": "", "i-2": "C:cfg-0:n2"})) == (2, 1)
    # orphans past a lowered capacity are used; nothing is negative
    assert slot_counts(_inst("i", 1, {"i-0": "n1", "i-3": "n1"})) == (2, 0)


async def test_agent_metrics_names_and_slots() -> None:
    m = AgentMetrics(
        new_registry(process=False), slots=lambda: [_inst("cfg-abc", 2, {"cfg-abc-1": "node"})]
    )
    m.set_instance_count(ObjectKey("ns", "cfg"), False, 1)
    m.first_response(ObjectKey("ns", "cfg"), 0.3)
    m.discovery_result("debugEcho", True)
    m.observe_allocate("cfg-abc", "ok", 0.002)
    m.plugin_registrations.inc()
    await trio.lowlevel.checkpoint()
    text = render(m.registry).decode()
    slots = 'akri_instance_slots{configuration="cfg",instance="cfg-abc",namespace="ns",state='
    for line in (
        slots + '"used"} 1.0',
        slots + '"free"} 1.0',
        'akri_instance_count{configuration="cfg",is_shared="false",namespace="ns"} 1.0',
        'akri_discovery_response_time_count{configuration="cfg"} 1.0',
        'akri_discovery_response_result{discovery_handler_name="debugEcho",result="Success"} 1.0',
        'akri_allocate_duration_seconds_count{outcome="ok",plugin="cfg-abc"} 1.0',
        "akri_device_plugin_registrations_total 1.0",
    ):
        assert line in text, line
