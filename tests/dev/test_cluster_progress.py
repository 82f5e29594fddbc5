"""Build progress of `python -m akri_trio_dev cluster up`: step n/total, elapsed, and the time left
from the last build's recorded step durations (akri_trio_dev.cluster.progress), and the runner
driving the real gobuild/build.sh with a stand-in `go` that compiles nothing (no cluster, no Go)."""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio_dev.cluster import progress, runner
from akri_trio_dev.cluster.layout import COMPONENTS, Layout
from akri_trio_dev.cluster.progress import BuildMeter, Step

KUBERNETES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")


def step_line(index: int, total: int, name: str) -> str:
    return f"[build] 12:00:00 step {index}/{total}: {name}\n"


def test_step_lines_are_recognised_and_nothing_else() -> None:
    assert progress.parse_step(step_line(2, 5, "kubelet")) == Step(2, 5, "kubelet")
    assert progress.parse_step("[build] 12:00:00 kubernetes: go build ...") is None
    assert progress.parse_step("go: downloading step 1/2: x") is None  # go's own output
    assert progress.parse_step(step_line(6, 5, "x")) is None
    assert progress.parse_step(step_line(0, 5, "x")) is None


def test_first_build_has_no_estimate_and_records_every_step() -> None:
    meter = BuildMeter("kubernetes", started=100.0)
    assert meter.report(105.0) == "kubernetes: starting, 5s elapsed, " + (
        "no earlier build to estimate the rest from"
    )
    assert meter.feed("go: downloading k8s.io/api v0.37.2\n", 110.0) is None
    assert meter.feed(step_line(1, 2, "kube-apiserver"), 110.0) == (
        "kubernetes: step 1/2 (kube-apiserver), 10s elapsed, "
        "no earlier build to estimate the rest from"
    )
    meter.feed(step_line(2, 2, "kubectl"), 710.0)
    assert meter.finish(800.0) == (600.0, 90.0)


def test_estimate_is_what_the_last_build_took_for_the_rest() -> None:
    # Last time: 600 s, 60 s, 30 s; etcd and containerd after it took 170 s together.
    meter = BuildMeter("kubernetes", started=0.0, last=(600.0, 60.0, 30.0), after=170.0)
    assert meter.feed(step_line(1, 3, "kube-apiserver"), 0.0) == (
        "kubernetes: step 1/3 (kube-apiserver), 0s elapsed, about 14m20s left (from the last build)"
    )
    assert meter.left(400.0) == 200.0 + 60 + 30 + 170
    # Slower than last time: the step is taken to be about to end, never a negative time.
    assert meter.left(900.0) == 0.0 + 60 + 30 + 170
    meter.feed(step_line(2, 3, "kube-scheduler"), 950.0)
    assert meter.left(960.0) == 50.0 + 30 + 170


def test_no_estimate_when_the_last_build_had_other_steps_or_later_ones_are_unknown() -> None:
    other_steps = BuildMeter("kubernetes", started=0.0, last=(1200.0,))
    other_steps.feed(step_line(1, 5, "kube-apiserver"), 1.0)
    assert other_steps.left(2.0) is None
    assert other_steps.report(2.0).endswith("no estimate")
    unknown_after = BuildMeter("kubernetes", started=0.0, last=(10.0,), after=None)
    unknown_after.feed(step_line(1, 1, "kube-apiserver"), 1.0)
    assert unknown_after.left(2.0) is None


def test_a_build_without_every_step_is_not_recorded() -> None:
    assert BuildMeter("etcd", started=0.0).finish(5.0) is None  # no step lines at all
    partial = BuildMeter("kubernetes", started=0.0)
    partial.feed(step_line(1, 5, "kube-apiserver"), 1.0)
    assert partial.finish(5.0) is None


def test_durations_file_round_trips_and_tolerates_junk() -> None:
    durations = {"kubernetes": (812.34, 60.0), "etcd": (70.0,)}
    assert progress.load_durations(progress.dump_durations(durations)) == {
        "kubernetes": (812.3, 60.0),
        "etcd": (70.0,),
    }
    for junk in (None, "", "not json", "[1, 2]", '{"etcd": "fast"}', '{"etcd": [-1]}'):
        assert progress.load_durations(junk) == {}
    assert progress.load_durations('{"etcd": [true], "containerd": [9]}') == {"containerd": (9.0,)}
    assert progress.total_of(durations, ["kubernetes", "etcd"]) == pytest.approx(942.34)
    assert progress.total_of(durations, ["etcd", "containerd"]) is None
    assert progress.total_of(durations, []) == 0.0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.4, "59s"), (60, "1m00s"), (859, "14m19s"), (3600, "1h00m"), (-3, "0s")],
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert progress.format_seconds(seconds) == text


@given(
    last=st.lists(st.floats(0, 5000), min_size=1, max_size=6),
    after=st.floats(0, 5000),
    data=st.data(),
)
def test_estimate_never_negative_and_never_grows_within_a_step(
    last: list[float], after: float, data: st.DataObject
) -> None:
    meter = BuildMeter("k", started=0.0, last=tuple(last), after=after)
    index = data.draw(st.integers(1, len(last)))
    meter.feed(step_line(index, len(last), "x"), 10.0)
    assert meter.left(10.0) == pytest.approx(sum(last[index - 1 :]) + after)
    times = [10.0, *sorted(data.draw(st.lists(st.floats(10.0, 20000.0), max_size=5)))]
    estimates = [left for t in times if (left := meter.left(t)) is not None]
    assert len(estimates) == len(times)
    assert all(e >= 0 for e in estimates)
    assert all(a >= b for a, b in itertools.pairwise(estimates))


# ---- the runner with the real build.sh and a stand-in go ---------------------------------------

FAKE_GO = """#!/bin/bash
# Stands in for `go build ... -o DIR/ PACKAGE`: makes DIR/<the package's binary name>.
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
pkg=${*: -1}; name=${pkg##*/}
case $name in v[0-9]*) name=${pkg%/*}; name=${name##*/} ;; esac
printf '#!/bin/sh\\n' > "$out$name"; chmod +x "$out$name"
echo "compiled $pkg"
"""


def _ticks(step: float = 10.0) -> Callable[[], float]:
    now = [0.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


def test_build_shows_steps_records_durations_and_estimates_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_go = tmp_path / "go"
    fake_go.write_text(FAKE_GO)
    fake_go.chmod(fake_go.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("AKRI_TRIO_GO", str(fake_go))
    monkeypatch.delenv("AKRI_TRIO_BUILD_SCRIPT", raising=False)
    lay = Layout(home=tmp_path / "home")

    runner.ensure_binaries(lay, clock=_ticks(), progress_every=3600)
    first = capsys.readouterr().out
    for i, name in enumerate(KUBERNETES, 1):
        assert f"kubernetes: step {i}/5 ({name})" in first
    assert "step 1/1 (etcd)" in first and "step 3/3 (ctr)" in first
    assert "no earlier build to estimate the rest from" in first
    assert all(lay.binary(b).is_file() for c in COMPONENTS for b in c.binaries)
    recorded = json.loads(lay.build_durations.read_text())
    assert {k: len(v) for k, v in recorded.items()} == {"kubernetes": 5, "etcd": 1, "containerd": 3}

    # Kubernetes again (a version bump, a deleted directory): the estimate is last time's.
    for name in KUBERNETES:
        os.unlink(lay.binary(name))
    runner.ensure_binaries(lay, clock=_ticks(), progress_every=3600)
    second = capsys.readouterr().out
    expected = progress.format_seconds(sum(recorded["kubernetes"]))
    estimate = rf"kubernetes: step 1/5 \(kube-apiserver\), \S+ elapsed, about {expected} left"
    assert re.search(estimate + r" \(from the last build\)", second), second
    assert "etcd" not in second.replace("kube-", "")  # nothing else is rebuilt


def test_silence_in_the_build_output_becomes_progress_ticks() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd) as reading:
        with os.fdopen(write_fd, "w") as writing:
            lines = runner._lines_or_silence(reading, every=0.01)
            assert next(lines) is None  # nothing written yet: a tick, not a hang
            writing.write("compiled k8s.io/kubernetes/cmd/kubelet\n")
        # The writer closed: its line, perhaps after more ticks, and then the end.
        assert [line for line in lines if line is not None] == [
            "compiled k8s.io/kubernetes/cmd/kubelet\n"
        ]
