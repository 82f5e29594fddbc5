"""Applies the rules netrules.py describes: idempotent add, remove, and removal of all of ours."""

from __future__ import annotations

import subprocess

from akri_trio_dev.cluster.netrules import CHAINS, Chain, Rule


class IptablesError(Exception):
    """iptables refused a rule; the message holds its stderr."""


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True)


def _must(argv: list[str]) -> None:
    proc = _run(argv)
    if proc.returncode != 0:
        raise IptablesError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def _ensure_chain(chain: Chain) -> None:
    if _run(["iptables", "-w", "-t", chain.table, "-S", chain.name]).returncode != 0:
        _must(chain.create())
    if _run(chain.jump.check()).returncode != 0:
        _must(chain.jump.append())


def add(rule: Rule) -> None:
    """Add `rule` unless present (its chain and the jump to it too)."""
    _ensure_chain(next(c for c in CHAINS if (c.table, c.name) == (rule.table, rule.chain)))
    if _run(rule.check()).returncode != 0:
        _must(rule.append())


def present(rule: Rule) -> bool:
    return _run(rule.check()).returncode == 0


def remove(rule: Rule) -> None:
    """Remove every copy of `rule` (none is fine)."""
    while _run(rule.check()).returncode == 0:
        _must(rule.delete())


def remove_all() -> None:
    """Our chains and the jumps to them, whatever they hold (`down`)."""
    for chain in CHAINS:
        while _run(chain.jump.check()).returncode == 0:
            _must(chain.jump.delete())
        _run(chain.flush())
        _run(chain.remove())
