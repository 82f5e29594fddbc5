"""Metric semantics and the exact exposition bytes a Prometheus scraper will parse."""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.observe.metrics import (
    DEFAULT_BUCKETS,
    Counter,
    Gauge,
    Histogram,
    MetricError,
    MetricFamily,
    ProcessCollector,
    Registry,
    Sample,
    exposition,
    format_value,
    process_families,
)

# ---------------------------------------------------------------------------------------------
# Golden exposition per type


def test_counter_unlabelled_is_exported_at_zero_then_counts() -> None:
    reg = Registry()
    c = reg.counter("akri_things_total", "Things seen.")
    assert reg.render() == (
        "# HELP akri_things_total Things seen.\n"
        "# TYPE akri_things_total counter\n"
        "akri_things_total 0\n"
    )
    c.inc()
    c.inc(2.5)
    assert c.value == 3.5
    assert reg.render().endswith("akri_things_total 3.5\n")


def test_counter_labelled_golden() -> None:
    reg = Registry()
    c = reg.counter(
        "akri_discovery_response_result", "Discovery results.", ["discovery_handler_name", "result"]
    )
    # Labelled metrics have no samples until a child exists.
    assert reg.render() == (
        "# HELP akri_discovery_response_result Discovery results.\n"
        "# TYPE akri_discovery_response_result counter\n"
    )
    c.labels(discovery_handler_name="udev", result="Success").inc(3)
    c.labels(result="Fail", discovery_handler_name="onvif").inc()
    assert reg.render() == (
        "# HELP akri_discovery_response_result Discovery results.\n"
        "# TYPE akri_discovery_response_result counter\n"
        'akri_discovery_response_result{discovery_handler_name="onvif",result="Fail"} 1\n'
        'akri_discovery_response_result{discovery_handler_name="udev",result="Success"} 3\n'
    )


def test_gauge_set_inc_dec_golden() -> None:
    reg = Registry()
    g = reg.gauge("akri_instance_count", "Instances.", ("configuration", "is_shared"))
    g.labels(configuration="cam", is_shared="true").set(4)
    g.labels(configuration="cam", is_shared="true").inc(2)
    g.labels(configuration="cam", is_shared="true").dec()
    g.labels(configuration="usb", is_shared="false").dec(0.5)
    assert reg.render() == (
        "# HELP akri_instance_count Instances.\n"
        "# TYPE akri_instance_count gauge\n"
        'akri_instance_count{configuration="cam",is_shared="true"} 5\n'
        'akri_instance_count{configuration="usb",is_shared="false"} -0.5\n'
    )


def test_histogram_golden_buckets_cumulative_with_inf_sum_count() -> None:
    reg = Registry()
    h = reg.histogram(
        "akri_discovery_response_time",
        "Discovery latency.",
        ["configuration"],
        buckets=[0.25, 1, 5],
    )
    child = h.labels(configuration="cam")
    for seconds in (0.1, 0.25, 0.3, 2.0, 7.0):  # 0.25 sits exactly on a bound: le is inclusive
        child.observe(seconds)
    assert reg.render() == (
        "# HELP akri_discovery_response_time Discovery latency.\n"
        "# TYPE akri_discovery_response_time histogram\n"
        'akri_discovery_response_time_bucket{configuration="cam",le="0.25"} 2\n'
        'akri_discovery_response_time_bucket{configuration="cam",le="1"} 3\n'
        'akri_discovery_response_time_bucket{configuration="cam",le="5"} 4\n'
        'akri_discovery_response_time_bucket{configuration="cam",le="+Inf"} 5\n'
        'akri_discovery_response_time_sum{configuration="cam"} 9.65\n'
        'akri_discovery_response_time_count{configuration="cam"} 5\n'
    )


def test_histogram_unlabelled_golden_at_zero() -> None:
    reg = Registry()
    reg.histogram("lat_seconds", "L.", buckets=(0.5,))
    assert reg.render() == (
        "# HELP lat_seconds L.\n# TYPE lat_seconds histogram\n"
        'lat_seconds_bucket{le="0.5"} 0\nlat_seconds_bucket{le="+Inf"} 0\n'
        "lat_seconds_sum 0\nlat_seconds_count 0\n"
    )


@given(
    bounds=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=8, unique=True).map(
        sorted
    ),
    values=st.lists(st.floats(-2e6, 2e6, allow_nan=False), max_size=50),
)
def test_histogram_buckets_count_observations_at_or_below_each_bound(
    bounds: list[float], values: list[float]
) -> None:
    child = Histogram("h", "h", ["k"], buckets=bounds).labels(k="x")
    for v in values:
        child.observe(v)
    cumulative = child.cumulative()
    assert [b for b, _ in cumulative] == [*bounds, math.inf]
    for bound, n in cumulative:
        assert n == sum(1 for v in values if v <= bound)
    assert child.count == len(values)
    assert child.sum == pytest.approx(sum(values))


def test_histogram_time_observes_duration_on_its_clock_even_on_error() -> None:
    now = [100.0]
    reg = Registry()
    h = reg.histogram("op_seconds", "Op.", buckets=(1, 10), clock=lambda: now[0])
    with h.time():
        now[0] += 3
    with pytest.raises(RuntimeError), h.time():
        now[0] += 0.5
        raise RuntimeError("boom")
    assert 'op_seconds_bucket{le="1"} 1\n' in reg.render()
    assert 'op_seconds_bucket{le="10"} 2\n' in reg.render()
    assert "op_seconds_sum 3.5\n" in reg.render()


async def test_histogram_time_with_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    h = Histogram("wait_seconds", "W.", ["op"], buckets=(60, 300), clock=trio.current_time)
    with h.labels(op="sync").time():
        await trio.sleep(120)
    assert h.labels(op="sync").cumulative() == [(60, 0), (300, 1), (math.inf, 1)]
    assert h.labels(op="sync").sum == 120


def test_histogram_default_buckets_and_monotonic_clock() -> None:
    h = Histogram("d_seconds", "D.")
    with h.time():
        pass
    text = exposition(h.collect())
    les = re.findall(r'le="([^"]+)"', text)
    assert les == [*(format_value(b) for b in DEFAULT_BUCKETS), "+Inf"]
    assert les[:3] == ["0.005", "0.01", "0.025"]
    assert 'd_seconds_bucket{le="+Inf"} 1\n' in text


# ---------------------------------------------------------------------------------------------
# Formatting, escaping, order


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (3.0, "3"),
        (-2.0, "-2"),
        (0.25, "0.25"),
        (1e-05, "1e-05"),
        (2.0**60, "1.152921504606847e+18"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_format_value(value: float, text: str) -> None:
    assert format_value(value) == text


def test_label_values_and_help_are_escaped() -> None:
    reg = Registry()
    g = reg.gauge("g", 'Help with \\ backslash,\nnewline and "quotes".', ["path"])
    g.labels(path='C:\\dev\n"cam"').set(1)
    assert reg.render() == (
        '# HELP g Help with \\\\ backslash,\\nnewline and "quotes".\n'
        "# TYPE g gauge\n"
        'g{path="C:\\\\dev\\n\\"cam\\""} 1\n'
    )


def test_render_order_is_sorted_by_name_and_label_values_not_insertion() -> None:
    def build(names: list[str], values: list[str]) -> str:
        reg = Registry()
        for name in names:
            g = reg.gauge(name, "x", ["k"])
            for v in values:
                g.labels(k=v).set(1)
        return reg.render()

    a = build(["b_metric", "a_metric"], ["z", "a", "m"])
    b = build(["a_metric", "b_metric"], ["m", "z", "a"])
    assert a == b
    sample_lines = [line for line in a.splitlines() if not line.startswith("#")]
    assert sample_lines == [
        'a_metric{k="a"} 1',
        'a_metric{k="m"} 1',
        'a_metric{k="z"} 1',
        'b_metric{k="a"} 1',
        'b_metric{k="m"} 1',
        'b_metric{k="z"} 1',
    ]


def test_exposition_of_plain_families() -> None:
    fam = MetricFamily("x", "X.", "gauge", (Sample("x", (("a", "1"),), 2.0),))
    assert exposition([fam]) == '# HELP x X.\n# TYPE x gauge\nx{a="1"} 2\n'


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize("name", ["", "9lives", "has-dash", "sp ace", "é"])
def test_invalid_metric_names_rejected(name: str) -> None:
    with pytest.raises(MetricError, match="invalid metric name"):
        Counter(name, "h")


@pytest.mark.parametrize("label", ["", "1a", "a-b", "__reserved"])
def test_invalid_label_names_rejected(label: str) -> None:
    with pytest.raises(MetricError, match="invalid label name"):
        Gauge("g", "h", [label])


def test_label_declaration_errors() -> None:
    with pytest.raises(MetricError, match="duplicate"):
        Gauge("g", "h", ["a", "a"])
    with pytest.raises(MetricError, match="not the str"):
        Gauge("g", "h", "configuration")
    with pytest.raises(MetricError, match="reserved"):
        Histogram("h", "h", ["le"])
    Gauge("g", "h", ["le"])  # only histograms reserve `le`


def test_labels_must_match_declared_names_exactly() -> None:
    g = Gauge("g", "h", ["configuration", "node"])
    with pytest.raises(MetricError, match=r"takes labels \['configuration', 'node'\]"):
        g.labels(configuration="c")
    with pytest.raises(MetricError, match="takes labels"):
        g.labels(configuration="c", node="n", extra="x")
    with pytest.raises(MetricError, match="must be a str"):
        g.labels(configuration="c", node=True)  # type: ignore[arg-type]
    with pytest.raises(MetricError, match=r"use \.labels\(\)"):
        g.set(1)
    with pytest.raises(MetricError, match="has no labels"):
        Gauge("u", "h").labels(a="b")


def test_counter_refuses_to_go_down() -> None:
    c = Counter("c_total", "h")
    with pytest.raises(MetricError, match="only go up"):
        c.inc(-1)
    with pytest.raises(MetricError, match="only go up"):
        c.inc(math.nan)
    assert c.value == 0


def test_histogram_bucket_validation() -> None:
    with pytest.raises(MetricError, match="strictly increase"):
        Histogram("h", "h", buckets=[1, 1])
    with pytest.raises(MetricError, match="strictly increase"):
        Histogram("h", "h", buckets=[2, 1])
    with pytest.raises(MetricError, match="at least one"):
        Histogram("h", "h", buckets=[])
    with pytest.raises(MetricError, match="at least one"):
        Histogram("h", "h", buckets=[math.inf])
    with pytest.raises(MetricError, match="NaN"):
        Histogram("h", "h").observe(math.nan)
    assert Histogram("h", "h", buckets=[1, math.inf])._bounds == (1.0, math.inf)


def test_registry_refuses_clashing_names() -> None:
    reg = Registry()
    reg.histogram("lat", "h")
    with pytest.raises(MetricError, match="already registered"):
        reg.gauge("lat", "h")
    with pytest.raises(MetricError, match=r"already registered: \['lat_count'\]"):
        reg.counter("lat_count", "h")
    g = reg.gauge("other", "h")
    reg.unregister(g)
    reg.gauge("other", "h")  # the name is free again


# ---------------------------------------------------------------------------------------------
# Callback gauges and removal


def test_callback_gauge_is_evaluated_at_each_scrape() -> None:
    reg = Registry()
    queue: list[str] = []
    reg.gauge("queue_depth", "Depth.").set_function(lambda: len(queue))
    assert reg.render().endswith("queue_depth 0\n")
    queue.extend(["a", "b"])
    assert reg.render().endswith("queue_depth 2\n")


def test_labelled_callback_gauge_and_no_mixing_with_set() -> None:
    reg = Registry()
    g = reg.gauge("slots_free", "Free.", ["configuration"])
    free = {"cam": 3}
    g.labels(configuration="cam").set_function(lambda: free["cam"])
    free["cam"] = 1
    assert 'slots_free{configuration="cam"} 1\n' in reg.render()
    with pytest.raises(MetricError, match="callback"):
        g.labels(configuration="cam").inc()


def test_callback_exception_propagates_from_render() -> None:
    reg = Registry()
    reg.gauge("bad", "h").set_function(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        reg.render()


def test_remove_one_child() -> None:
    reg = Registry()
    g = reg.gauge("akri_instance_count", "h", ["configuration"])
    g.labels(configuration="a").set(1)
    g.labels(configuration="b").set(2)
    assert g.remove(configuration="a") is True
    assert g.remove(configuration="a") is False
    assert 'configuration="a"' not in reg.render()
    assert 'akri_instance_count{configuration="b"} 2\n' in reg.render()
    # Re-created after removal starts from zero, not the old value.
    assert g.labels(configuration="a").value == 0
    with pytest.raises(MetricError, match="takes labels"):
        g.remove(config="a")


def test_remove_matching_drops_every_child_of_a_deleted_configuration() -> None:
    reg = Registry()
    pods = reg.gauge("akri_broker_pod_count", "h", ["configuration", "node"])
    for cfg in ("cam", "usb"):
        for node in ("n1", "n2"):
            pods.labels(configuration=cfg, node=node).set(1)
    assert pods.remove_matching(configuration="cam") == 2
    assert "cam" not in reg.render()
    assert reg.render().count("akri_broker_pod_count{") == 2
    with pytest.raises(MetricError, match="non-empty subset"):
        pods.remove_matching(bogus="x")
    with pytest.raises(MetricError, match="non-empty subset"):
        pods.remove_matching()
    pods.clear()
    assert "akri_broker_pod_count{" not in reg.render()


# ---------------------------------------------------------------------------------------------
# Process metrics

# A real /proc/<pid>/stat line, with a command name that contains ") (" to defeat naive splits.
STAT = (
    "4242 (we) (ird cmd) S 1 4242 4242 0 -1 4194560 1180 0 0 0 "
    "250 150 0 0 20 0 3 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 4096 "
    "0 0 0 0 17 2 0 0 0 0 0 0 0 0 0 0 0 0 0"
)


def test_process_families_from_stat_text() -> None:
    fams = process_families(
        stat=STAT, boot_time=1_700_000_000, open_fds=7, max_fds=1024, clock_ticks=100,
        page_size=4096,
    )  # fmt: skip
    assert exposition(fams) == (
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total 4\n"
        "# HELP process_max_fds Maximum number of open file descriptors.\n"
        "# TYPE process_max_fds gauge\n"
        "process_max_fds 1024\n"
        "# HELP process_open_fds Number of open file descriptors.\n"
        "# TYPE process_open_fds gauge\n"
        "process_open_fds 7\n"
        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
        "# TYPE process_resident_memory_bytes gauge\n"
        "process_resident_memory_bytes 10485760\n"
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
        "# TYPE process_start_time_seconds gauge\n"
        "process_start_time_seconds 1700000123.45\n"
        "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
        "# TYPE process_virtual_memory_bytes gauge\n"
        "process_virtual_memory_bytes 104857600\n"
    )


def test_process_collector_reads_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "self" / "fd").mkdir(parents=True)
    for fd in ("0", "1", "2"):
        (tmp_path / "self" / "fd" / fd).touch()
    (tmp_path / "self" / "stat").write_text(STAT + "\n")
    (tmp_path / "self" / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max open files            4096                 524288               files\n"
    )
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    reg = Registry()
    reg.register(ProcessCollector(tmp_path))
    text = reg.render()
    assert "process_open_fds 3\n" in text
    assert "process_max_fds 4096\n" in text
    assert f"process_resident_memory_bytes {2560 * os.sysconf('SC_PAGE_SIZE')}\n" in text
    ticks = os.sysconf("SC_CLK_TCK")
    assert f"process_cpu_seconds_total {format_value(400 / ticks)}\n" in text


def test_process_collector_without_proc_emits_nothing(tmp_path: Path) -> None:
    assert list(ProcessCollector(tmp_path / "absent").collect()) == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_collector_on_this_process_is_plausible() -> None:
    reg = Registry()
    reg.register(ProcessCollector())
    values = {m[1]: float(m[2]) for m in re.finditer(r"^(process_\w+) (\S+)$", reg.render(), re.M)}
    assert values["process_resident_memory_bytes"] > 1_000_000
    assert values["process_open_fds"] >= 3
    assert 0 < values["process_cpu_seconds_total"] < time.process_time() + 1
    # Started before now, and not before this machine booted a decade ago.
    assert time.time() - 86_400 * 3650 < values["process_start_time_seconds"] <= time.time()
