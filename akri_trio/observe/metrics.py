"""Prometheus metrics: counters, gauges, histograms and the text exposition format 0.0.4.

Upstream Akri declares its agent metrics and never touches them, so only process metrics ever
reach a scrape (research/akri-upstream.md §5). Ours are real, and small enough to own: a
registry of metric families, labelled children created on first use and removed when the thing
they describe goes away (a deleted Configuration must not report a stale gauge forever), and a
pure renderer from snapshots to text so the exact bytes a scraper sees are tested as strings.

Not thread-safe, on purpose: trio runs every task on one thread, so an increment is never
interleaved with a scrape. Code that updates metrics from `trio.to_thread` workers must hand the
update back to the trio thread (`trio.from_thread.run_sync`) rather than add locks here.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import re
import resource
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from time import monotonic
from typing import ClassVar, Generic, Literal, Protocol, TypeVar

import attrs

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_BUCKETS",
    "Collector",
    "Counter",
    "CounterChild",
    "Gauge",
    "GaugeChild",
    "Histogram",
    "HistogramChild",
    "MetricError",
    "MetricFamily",
    "ProcessCollector",
    "Registry",
    "Sample",
    "exposition",
    "format_value",
    "process_families",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The Go and Python clients' defaults: request latencies from 5 ms to 10 s.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

MetricType = Literal["counter", "gauge", "histogram"]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class MetricError(ValueError):
    """A metric was declared or used inconsistently (bad name, wrong labels, negative inc)."""


# --------------------------------------------------------------------------------------------
# Snapshots and the pure renderer


@attrs.frozen
class Sample:
    """One exposition line: `name{labels} value`."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@attrs.frozen
class MetricFamily:
    """Everything rendered under one `# HELP` / `# TYPE` pair, in output order."""

    name: str
    help: str
    type: MetricType
    samples: tuple[Sample, ...]


def format_value(value: float) -> str:
    """Go's rendering, which scrapers and golden files expect: `1` not `1.0`, `+Inf`, `NaN`."""
    value = float(value)  # an int is a valid `float` to mypy but has no is_integer() in 3.11
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    # Integral values print without a fraction; beyond 2^53 floats stop being exact integers,
    # so those keep repr's exponent form rather than pretending to digits they do not have.
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    # HELP text escapes only backslash and newline; a quote is literal there (format 0.0.4).
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def exposition(families: Iterable[MetricFamily]) -> str:
    """Render families in the order given as text format 0.0.4."""
    out: list[str] = []
    for family in families:
        out.append(f"# HELP {family.name} {_escape_help(family.help)}\n")
        out.append(f"# TYPE {family.name} {family.type}\n")
        for sample in family.samples:
            if sample.labels:
                pairs = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sample.labels)
                out.append(f"{sample.name}{{{pairs}}} {format_value(sample.value)}\n")
            else:
                out.append(f"{sample.name} {format_value(sample.value)}\n")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Metric families with labelled children


class Collector(Protocol):
    """Anything a Registry can scrape: it names what it will emit, then emits it on demand."""

    def names(self) -> Iterable[str]:
        """Every sample name this collector may produce (used to refuse clashes)."""
        ...

    def collect(self) -> Iterable[MetricFamily]: ...


class CounterChild:
    """A monotonically increasing value (one label combination of a Counter)."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        # `not >=` also refuses NaN, which would poison the counter for good.
        if not amount >= 0:
            raise MetricError(f"counters only go up; inc({amount!r})")
        self._value += amount

    @property
    def value(self) -> float:
        return self._value


class GaugeChild:
    """A value that goes up and down, or a callback evaluated at every scrape."""

    __slots__ = ("_fn", "_value")

    def __init__(self) -> None:
        self._value = 0.0
        self._fn: Callable[[], float] | None = None

    def set(self, value: float) -> None:
        self._settable()
        self._value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self._settable()
        self._value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._settable()
        self._value -= amount

    def set_function(self, fn: Callable[[], float]) -> None:
        """Report `fn()` at scrape time instead of a stored value (e.g. a queue's length)."""
        self._fn = fn

    @property
    def value(self) -> float:
        return float(self._fn()) if self._fn is not None else self._value

    def _settable(self) -> None:
        # Mixing the two would make the reported value depend on which came last; refuse it.
        if self._fn is not None:
            raise MetricError("gauge is driven by a callback; set/inc/dec are not allowed")


class HistogramChild:
    """Observations counted into buckets (one label combination of a Histogram)."""

    __slots__ = ("_bounds", "_clock", "_count", "_counts", "_sum")

    def __init__(self, bounds: tuple[float, ...], clock: Callable[[], float]) -> None:
        self._bounds = bounds
        self._clock = clock
        # Per-bucket (not cumulative) counts: observe stays O(log n); render accumulates.
        self._counts = [0] * len(bounds)
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        if math.isnan(value):
            raise MetricError("cannot observe NaN")
        # bisect_left: a value equal to a bound belongs in that bucket (`le` is inclusive).
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value
        self._count += 1

    @contextmanager
    def time(self) -> Iterator[None]:
        """Observe the block's duration on the histogram's clock, even if it raises."""
        start = self._clock()
        try:
            yield
        finally:
            self.observe(self._clock() - start)

    @property
    def count(self) -> int:
        return self._count

    @property
    def sum(self) -> float:
        return self._sum

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= bound) pairs, ending with +Inf."""
        running = 0
        out = []
        for bound, n in zip(self._bounds, self._counts, strict=True):
            running += n
            out.append((bound, running))
        return out


ChildT = TypeVar("ChildT", CounterChild, GaugeChild, HistogramChild)


class _Metric(Generic[ChildT]):
    """A named family of children, one per combination of label values."""

    _type: ClassVar[MetricType]
    _reserved_labels: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise MetricError(f"invalid metric name {name!r}")
        if isinstance(labelnames, str):
            # ("configuration") is a str, not a 1-tuple; iterating it would yield letters.
            raise MetricError(f"labelnames must be a sequence of names, not the str {labelnames!r}")
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise MetricError(f"invalid label name {label!r} for {name}")
            if label in self._reserved_labels:
                raise MetricError(f"label {label!r} is reserved in a {self._type} ({name})")
        if len(set(labelnames)) != len(labelnames):
            raise MetricError(f"duplicate label names {list(labelnames)} for {name}")
        self.name = name
        self.help = help
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self._labelset = frozenset(labelnames)
        self._children: dict[tuple[str, ...], ChildT] = {}
        if not labelnames:
            # An unlabelled metric is exported from birth, at zero, so a rate() has a baseline.
            self._children[()] = self._new_child()

    def _new_child(self) -> ChildT:
        raise NotImplementedError

    def _child_samples(self, child: ChildT, labels: tuple[tuple[str, str], ...]) -> list[Sample]:
        raise NotImplementedError

    def labels(self, **values: str) -> ChildT:
        """The child for these label values, created (at zero) on first use."""
        key = self._key(values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def remove(self, **values: str) -> bool:
        """Forget one child (the thing it measured is gone); False if it did not exist."""
        return self._children.pop(self._key(values), None) is not None

    def remove_matching(self, **partial: str) -> int:
        """Forget every child whose labels include `partial`; returns how many went.

        A deleted Configuration takes all its `{configuration=..., node=...}` children with it.
        """
        self._require_labels()
        unknown = partial.keys() - self._labelset
        if not partial or unknown:
            raise MetricError(
                f"{self.name}: remove_matching needs a non-empty subset of {list(self.labelnames)}"
                f", got {sorted(partial)}"
            )
        idx = [(self.labelnames.index(k), v) for k, v in partial.items()]
        doomed = [key for key in self._children if all(key[i] == v for i, v in idx)]
        for key in doomed:
            del self._children[key]
        return len(doomed)

    def clear(self) -> None:
        """Forget every child of a labelled metric."""
        self._require_labels()
        self._children.clear()

    def names(self) -> Iterable[str]:
        return (self.name,)

    def collect(self) -> Iterable[MetricFamily]:
        samples: list[Sample] = []
        # Sorted by label values so a scrape is byte-for-byte reproducible.
        for key in sorted(self._children):
            labels = tuple(zip(self.labelnames, key, strict=True))
            samples.extend(self._child_samples(self._children[key], labels))
        return (MetricFamily(self.name, self.help, self._type, tuple(samples)),)

    def _key(self, values: dict[str, str]) -> tuple[str, ...]:
        self._require_labels()
        if values.keys() != self._labelset:
            raise MetricError(
                f"{self.name} takes labels {list(self.labelnames)}, got {sorted(values)}"
            )
        key = tuple(values[n] for n in self.labelnames)
        for label, value in zip(self.labelnames, key, strict=True):
            if not isinstance(value, str):
                # str(True) is "True", upstream says "true": make the caller choose.
                raise MetricError(f"{self.name}: label {label} must be a str, got {value!r}")
        return key

    def _require_labels(self) -> None:
        if not self.labelnames:
            raise MetricError(f"{self.name} has no labels")

    def _only(self) -> ChildT:
        if self.labelnames:
            raise MetricError(f"{self.name} has labels {list(self.labelnames)}; use .labels()")
        return self._children[()]


class Counter(_Metric[CounterChild]):
    """Counts events. Name it `..._total`; the renderer does not add suffixes."""

    _type = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _child_samples(
        self, child: CounterChild, labels: tuple[tuple[str, str], ...]
    ) -> list[Sample]:
        return [Sample(self.name, labels, child.value)]

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    @property
    def value(self) -> float:
        return self._only().value


class Gauge(_Metric[GaugeChild]):
    """A current value: set, moved up and down, or computed by a callback at scrape time."""

    _type = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def _child_samples(
        self, child: GaugeChild, labels: tuple[tuple[str, str], ...]
    ) -> list[Sample]:
        return [Sample(self.name, labels, child.value)]

    def set(self, value: float) -> None:
        self._only().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._only().dec(amount)

    def set_function(self, fn: Callable[[], float]) -> None:
        self._only().set_function(fn)

    @property
    def value(self) -> float:
        return self._only().value


class Histogram(_Metric[HistogramChild]):
    """Distributions (durations in seconds, by convention) in cumulative `le` buckets."""

    _type = "histogram"
    _reserved_labels = frozenset({"le"})

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds and bounds[-1] != math.inf:
            bounds.append(math.inf)
        if len(bounds) < 2 or any(math.isnan(b) for b in bounds):
            raise MetricError(f"{name}: need at least one finite bucket bound, got {buckets!r}")
        if any(a >= b for a, b in itertools.pairwise(bounds)):
            raise MetricError(f"{name}: bucket bounds must strictly increase, got {buckets!r}")
        self._bounds = tuple(bounds)
        self._clock = clock
        super().__init__(name, help, labelnames)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds, self._clock)

    def _child_samples(
        self, child: HistogramChild, labels: tuple[tuple[str, str], ...]
    ) -> list[Sample]:
        samples = [
            Sample(f"{self.name}_bucket", (*labels, ("le", format_value(bound))), float(n))
            for bound, n in child.cumulative()
        ]
        samples.append(Sample(f"{self.name}_sum", labels, child.sum))
        samples.append(Sample(f"{self.name}_count", labels, float(child.count)))
        return samples

    def names(self) -> Iterable[str]:
        return (self.name, f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")

    def observe(self, value: float) -> None:
        self._only().observe(value)

    def time(self) -> AbstractContextManager[None]:
        return self._only().time()


# --------------------------------------------------------------------------------------------
# Registry


CollectorT = TypeVar("CollectorT", bound=Collector)


class Registry:
    """The set of collectors one /metrics endpoint exposes, rendered sorted by family name."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self._names: set[str] = set()

    def register(self, collector: CollectorT) -> CollectorT:
        names = set(collector.names())
        clash = names & self._names
        if clash:
            raise MetricError(f"already registered: {sorted(clash)}")
        self._names |= names
        self._collectors.append(collector)
        return collector

    def unregister(self, collector: Collector) -> None:
        self._collectors.remove(collector)
        self._names -= set(collector.names())

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help, labelnames))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, help, labelnames))

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        clock: Callable[[], float] = monotonic,
    ) -> Histogram:
        return self.register(Histogram(name, help, labelnames, buckets=buckets, clock=clock))

    def collect(self) -> list[MetricFamily]:
        families = [f for c in self._collectors for f in c.collect()]
        families.sort(key=lambda f: f.name)
        return families

    def render(self) -> str:
        """The /metrics body. Callbacks run here; an exception in one propagates."""
        return exposition(self.collect())


# --------------------------------------------------------------------------------------------
# Process metrics from /proc


def process_families(
    *,
    stat: str,
    boot_time: float,
    open_fds: int | None,
    max_fds: int | None,
    clock_ticks: int,
    page_size: int,
) -> list[MetricFamily]:
    """The standard `process_*` families from the text of /proc/<pid>/stat and friends.

    `stat`'s second field is the command in parentheses and may itself contain spaces and
    parentheses, so fields are counted from the last `)`.
    """
    fields = stat[stat.rindex(")") + 2 :].split()
    # proc(5) numbers fields from 1 and `state` is field 3, the first after the command.
    utime, stime = int(fields[14 - 3]), int(fields[15 - 3])
    starttime, vsize, rss = int(fields[22 - 3]), int(fields[23 - 3]), int(fields[24 - 3])

    def one(name: str, help: str, type_: MetricType, value: float) -> MetricFamily:
        return MetricFamily(name, help, type_, (Sample(name, (), value),))

    families = [
        one(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
            (utime + stime) / clock_ticks,
        ),
        one(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            "gauge",
            float(rss * page_size),
        ),
        one(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            "gauge",
            boot_time + starttime / clock_ticks,
        ),
        one(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            "gauge",
            float(vsize),
        ),
    ]
    if open_fds is not None:
        families.append(
            one("process_open_fds", "Number of open file descriptors.", "gauge", open_fds)
        )
    if max_fds is not None:
        families.append(
            one("process_max_fds", "Maximum number of open file descriptors.", "gauge", max_fds)
        )
    families.sort(key=lambda f: f.name)
    return families


class ProcessCollector:
    """Reads this process's /proc entries at every scrape; emits nothing where /proc is absent.

    `proc` is a parameter so tests can point it at a fabricated tree.
    """

    _NAMES = (
        "process_cpu_seconds_total",
        "process_max_fds",
        "process_open_fds",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_virtual_memory_bytes",
    )

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._boot_time: float | None = None  # constant for the life of the machine
        self._clock_ticks = os.sysconf("SC_CLK_TCK")
        self._page_size = resource.getpagesize()

    def names(self) -> Iterable[str]:
        return self._NAMES

    def collect(self) -> Iterable[MetricFamily]:
        try:
            stat = (self._proc / "self" / "stat").read_text()
            if self._boot_time is None:
                self._boot_time = _boot_time((self._proc / "stat").read_text())
        except (OSError, ValueError):
            return []
        try:
            open_fds: int | None = len(os.listdir(self._proc / "self" / "fd"))
        except OSError:
            open_fds = None
        try:
            max_fds = _max_open_files((self._proc / "self" / "limits").read_text())
        except OSError:
            max_fds = None
        return process_families(
            stat=stat,
            boot_time=self._boot_time,
            open_fds=open_fds,
            max_fds=max_fds,
            clock_ticks=self._clock_ticks,
            page_size=self._page_size,
        )


def _boot_time(proc_stat: str) -> float:
    for line in proc_stat.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


def _max_open_files(limits: str) -> int | None:
    # "Max open files            1024                 524288               files"
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            soft = line[len("Max open files") :].split()[0]
            return None if soft == "unlimited" else int(soft)
    return None
