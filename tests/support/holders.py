"""Who holds one Instance's device while a cluster switches allocation modes, as the switch
tests see it through kubectl: its `deviceUsage` slots plus the claims allocated it, sampled in a
thread through a whole module so a test can say no slot was ever held twice.

One class for the two switch modules (tests/node/test_allocation_switch_node.py, with the
processes restarted by hand, and tests/deploy/test_chart_allocation_switch.py, with `helm
upgrade`), so both count a claim and its `D:`/`DX:` records the same way: once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from akri_trio import dra
from akri_trio.model import naming
from tests.support.kubectl import Kubectl
from tests.support.polling import until


def count(allocated: Mapping[str, int], usage: Mapping[str, str]) -> int:
    """The slots of `usage` plus the claims `allocated` (claim uid -> devices or slots); a
    claim's `D:` records count with it, once."""
    recorded: dict[str, int] = {}
    plain = 0
    for value in usage.values():
        match naming.parse_usage(value):
            case naming.DraClaim(uid, _):
                recorded[uid] = recorded.get(uid, 0) + 1
            case _:
                plain += 1
    uids = allocated.keys() | recorded.keys()
    return plain + sum(max(allocated.get(u, 0), recorded.get(u, 0)) for u in uids)


class Holders:
    """The holders of the Instance `instance` in `namespace`, and the most seen at once."""

    def __init__(self, kubectl: Kubectl, namespace: str, instance: str) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.instance = instance
        self.most = 0  # the most holders the sampler saw at once
        self.when_most: tuple[dict[str, int], dict[str, str]] = ({}, {})  # what it saw then
        self.samples = 0
        self._stop = threading.Event()

    def get(self, *args: str) -> dict[str, Any]:
        """`kubectl get ... -o json`, or {} (missing, or the shared API server restarting)."""
        out = self.kubectl("get", *args, "-o", "json", check=False)
        return dict(json.loads(out)) if out else {}

    def usage(self) -> dict[str, str]:
        """The Instance's held slots."""
        inst = self.get("instances.akri.sh", self.instance, "-n", self.namespace)
        return {k: v for k, v in (inst.get("spec") or {}).get("deviceUsage", {}).items() if v}

    def allocated(self) -> dict[str, int]:
        """Claim uid -> how many of the Instance's devices (or slots) it is allocated, of the
        claims in the namespace reserved for a Pod that still exists."""
        live = self.get("pods", "-n", self.namespace).get("items", [])
        pods = {p["metadata"]["uid"] for p in live}
        out: dict[str, int] = {}
        for claim in self.get("resourceclaims", "-n", self.namespace).get("items", []):
            status = claim.get("status") or {}
            if not {r.get("uid") for r in status.get("reservedFor") or []} & pods:
                continue
            results = (status.get("allocation") or {}).get("devices") or {}
            held = sum(
                1
                for r in results.get("results") or []
                if r["driver"] == dra.DRIVER and r["device"].startswith(self.instance)
            )
            if held:
                out[claim["metadata"]["uid"]] = held
        return out

    def phase(self, pod: str) -> str:
        """The Pod's phase, "" while it does not exist (or the API server restarts)."""
        return str(self.get("pod", pod, "-n", self.namespace).get("status", {}).get("phase", ""))

    def wait_unschedulable(self, pod: str, why: str) -> None:
        """Until the scheduler has found no room for `pod` (its PodScheduled condition says
        Unschedulable); `why` is what the failure says it waited for."""

        def unschedulable() -> bool:
            status = self.get("pod", pod, "-n", self.namespace).get("status", {})
            return any(c.get("reason") == "Unschedulable" for c in status.get("conditions", []))

        until(unschedulable, seconds=90, what=f"{pod} unschedulable while {why}")

    def sample(self) -> None:
        # Claims before and after the slots, counted only when held at both reads: a holder
        # that hands a slot over (a slot freed then allocated to a claim, or a claim's Pod gone
        # then its slot claimed) is counted once at most, never twice.
        before = self.allocated()
        usage = self.usage()
        after = self.allocated()
        allocated = {u: min(n, after[u]) for u, n in before.items() if u in after}
        holders = count(allocated, usage)
        if holders > self.most:
            self.when_most = (allocated, usage)
        self.most = max(self.most, holders)
        self.samples += 1

    @contextmanager
    def sampling(self) -> Iterator[Holders]:
        """Sample every half second in a thread until the block ends."""

        def run() -> None:
            while not self._stop.wait(0.5):
                self.sample()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=30)
