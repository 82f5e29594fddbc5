"""Shared plumbing for the benchmarks: the cluster, an isolated namespace, stats, the report.

Isolation. The local cluster is shared with other engineers' test runs, whose agents watch every
namespace and whose fixtures purge every akri object. So a benchmark
- works in its own namespace (`akri-bench`) with an agent that watches only that namespace
  (`AgentSettings.namespace`), so it never writes Instances for other people's Configurations;
- embeds the debugEcho handler under another name (`benchEcho`, via `AgentSettings.handlers`),
  so other agents see our Configurations but have no handler for them and create no Instances;
- checks at the end that its objects were not purged underneath it (a run that was is void).
Neither changes the code paths measured (discovery, reconcile, plugins, claims).
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import platform
import statistics
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from akri_trio.discovery.handlers.debug_echo import DebugEcho
from akri_trio.kube.client import JSON, Client
from akri_trio.kube.config import load_config
from akri_trio_dev import run_cluster_command
from akri_trio_dev.cluster.exports import parse_exports
from tests.support.akri_cluster import NAMESPACES
from tests.support.akri_cluster import purge_namespace as purge_akri_namespace

REPO = Path(__file__).resolve().parent.parent
BENCH_NS = "akri-bench"
HANDLER = "benchEcho"


# --- cluster ---------------------------------------------------------------------------------


def cluster_env() -> dict[str, str]:
    """`cluster up` (idempotent) then `cluster env` as a dict."""
    run_cluster_command("up", check=True, capture_output=True)
    return parse_exports(run_cluster_command("env", check=True, capture_output=True).stdout)


@asynccontextmanager
async def bench_api(kubeconfig: str) -> AsyncIterator[Client]:
    async with Client.open(load_config(Path(kubeconfig))) as api:
        yield api


def bench_echo(availability: Path, poll_interval: float = 0.2, shared: bool = False) -> DebugEcho:
    """The debugEcho handler, registered as `benchEcho` (see the module docstring)."""
    return DebugEcho(
        name=HANDLER, availability_path=availability, poll_interval=poll_interval, shared=shared
    )


def echo_config(name: str, descriptions: Sequence[str], capacity: int) -> JSON:
    import yaml

    return {
        "apiVersion": "akri.sh/v0",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": BENCH_NS},
        "spec": {
            "discoveryHandler": {
                "name": HANDLER,
                "discoveryDetails": yaml.safe_dump({"descriptions": list(descriptions)}),
            },
            "capacity": capacity,
            "brokerProperties": {},
        },
    }


async def prepare_namespace(api: Client, namespace: str = BENCH_NS) -> None:
    """CRDs installed, the namespace there and empty of akri objects."""
    from tests.support.akri_cluster import install_crds

    await install_crds(api)
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    await api.apply(NAMESPACES, body, field_manager="akri-trio-bench")
    await purge_namespace(api, namespace)


async def purge_namespace(api: Client, namespace: str = BENCH_NS, limit_s: float = 120) -> None:
    """Delete our Configurations, then our Instances (stripping finalizers of dead agents)."""
    await purge_akri_namespace(api, namespace, limit_s)


# --- numbers ---------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "n": float(len(samples)),
        "p50": percentile(samples, 50),
        "p90": percentile(samples, 90),
        "p99": percentile(samples, 99),
        "max": max(samples) if samples else math.nan,
        "mean": statistics.fmean(samples) if samples else math.nan,
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (also readable on a terminal)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    return "\n".join([line, sep, *body])


def code_stamp() -> str:
    """A short hash of akri_trio/ as it is on disk (the agent is edited while we measure)."""
    digest = hashlib.blake2b(digest_size=6)
    for path in sorted((REPO / "akri_trio").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load avg {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}; "
        f"akri_trio code {code_stamp()}"
    )


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


RESULTS = REPO / "bench" / "RESULTS.md"


def write_run(name: str, text: str, results: Path = RESULTS) -> None:
    """Append one run to the `<!-- runs:name -->` ... `<!-- /runs:name -->` block of
    RESULTS.md (created at the end of the file when missing); earlier runs stay."""
    start, end = f"<!-- runs:{name} -->", f"<!-- /runs:{name} -->"
    old = results.read_text() if results.exists() else "# Benchmark results\n"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        body, tail = rest.split(end, 1)
        new = f"{head}{start}{body.rstrip()}\n\n{text.rstrip()}\n{end}{tail}"
    else:
        new = f"{old.rstrip()}\n\n{start}\n{text.rstrip()}\n{end}\n"
    results.write_text(new)


def record_run(name: str, report: str, write: bool) -> None:
    """Append a run to RESULTS.md unless asked not to, or unless it is void: a run whose
    objects someone else's test fixture deleted underneath it says so in its report."""
    if "purged by someone else: True" in report:
        print("VOID run (our objects were deleted underneath us): not written")
    elif write:
        write_run(name, report)


def env_kubeconfig(env: Mapping[str, str]) -> str:
    return env["KUBECONFIG"]
