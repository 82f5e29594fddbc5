"""The format of `python -m akri_trio_dev cluster env`: shell `export KEY='value'` lines, and
reading them back.

People run `eval "$(python -m akri_trio_dev cluster env)"`, so a value must survive the shell
whatever it holds (a space in a path, a quote); single quotes keep everything literal. Tests, the
benchmarks and the demo read the same output back into a dict with `parse_exports`, the one parser
of it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

__all__ = ["export_lines", "parse_exports"]


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def export_lines(pairs: Mapping[str, object]) -> list[str]:
    """`export KEY='value'` per pair, values as text, always single-quoted."""
    return [f"export {key}={_quote(str(value))}" for key, value in pairs.items()]


def parse_exports(text: str) -> dict[str, str]:
    """KEY -> value from `export KEY='value'` lines (bare `KEY=value` lines too); other lines,
    blank lines and comments are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words[:1] == ["export"]:
            words = words[1:]
        if len(words) == 1 and "=" in words[0]:
            key, value = words[0].split("=", 1)
            out[key] = value
    return out
