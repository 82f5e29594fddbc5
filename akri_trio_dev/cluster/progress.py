"""How far a build of the local cluster's binaries is: step n of total, elapsed, time left.

A cold Kubernetes build takes about 20 minutes on two cores, most of it silent inside
`go build`. gobuild/build.sh builds one binary per step and marks each step's start with a line
`[build] HH:MM:SS step N/TOTAL: NAME`; `BuildMeter` turns those lines and the clock into
progress lines, and the estimate of what is left comes from the step durations of the last
build that finished, which the runner keeps in `build/durations.json` of the cache directory.

Pure: the runner passes the lines, the times and the file's text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

STEP_LINE: Final = re.compile(r"^\[build\] \S+ step (\d+)/(\d+): (\S+)")

# component name -> seconds each step of its last finished build took, in step order
Durations = Mapping[str, tuple[float, ...]]


@attrs.frozen
class Step:
    index: int  # 1-based
    total: int
    name: str


def parse_step(line: str) -> Step | None:
    """The step a build.sh line starts, or None for any other line."""
    match = STEP_LINE.match(line)
    if match is None:
        return None
    index, total = int(match[1]), int(match[2])
    if not 1 <= index <= total:
        return None
    return Step(index, total, match[3])


def load_durations(text: str | None) -> dict[str, tuple[float, ...]]:
    """durations.json's content; anything missing or malformed is simply not known."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    known: dict[str, tuple[float, ...]] = {}
    for name, steps in doc.items():
        if (
            isinstance(steps, list)
            and steps
            and all(isinstance(s, int | float) and not isinstance(s, bool) for s in steps)
            and all(s >= 0 for s in steps)
        ):
            known[name] = tuple(float(s) for s in steps)
    return known


def dump_durations(durations: Durations) -> str:
    return json.dumps({k: [round(s, 1) for s in v] for k, v in sorted(durations.items())}) + "\n"


def total_of(durations: Durations, components: Iterable[str]) -> float | None:
    """Seconds the last builds of `components` took together; None if one was never built."""
    total = 0.0
    for name in components:
        if name not in durations:
            return None
        total += sum(durations[name])
    return total


def format_seconds(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@attrs.define
class BuildMeter:
    """The progress of one component's build.

    `last` is the step durations of its last finished build (None: never built here);
    `after` the seconds the components still to build after it took last time (None: not all
    known). Estimates use `last` only when it has as many steps as this build."""

    component: str
    started: float
    last: tuple[float, ...] | None = None
    after: float | None = 0.0
    step: Step | None = None
    step_started: float = 0.0
    finished_steps: list[float] = attrs.field(factory=list)

    def feed(self, line: str, now: float) -> str | None:
        """Take one line of build output; a progress line when it starts a step."""
        step = parse_step(line)
        if step is None:
            return None
        if self.step is not None:
            self.finished_steps.append(now - self.step_started)
        self.step, self.step_started = step, now
        return self.report(now)

    def left(self, now: float) -> float | None:
        """Seconds left until every component is built, if the last builds tell."""
        step, last = self.step, self.last
        if step is None or last is None or len(last) != step.total or self.after is None:
            return None
        i = step.index - 1
        # A step running longer than last time is taken to be about to end.
        current = max(last[i] - (now - self.step_started), 0.0)
        return current + sum(last[i + 1 :]) + self.after

    def report(self, now: float) -> str:
        elapsed = format_seconds(now - self.started)
        if self.step is None:
            where = "starting"
        else:
            where = f"step {self.step.index}/{self.step.total} ({self.step.name})"
        left = self.left(now)
        if left is not None:
            eta = f"about {format_seconds(left)} left (from the last build)"
        elif self.last is None:
            eta = "no earlier build to estimate the rest from"
        else:
            eta = "no estimate"
        return f"{self.component}: {where}, {elapsed} elapsed, {eta}"

    def finish(self, now: float) -> tuple[float, ...] | None:
        """The step durations to remember after the build succeeded: None unless every step
        was seen, in order (a build script without step lines leaves the record alone)."""
        if self.step is None:
            return None
        steps = (*self.finished_steps, now - self.step_started)
        if len(steps) != self.step.total or self.step.index != self.step.total:
            return None
        return steps
