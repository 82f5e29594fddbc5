"""RFC 6902 JSON patch pieces for our guarded writes: a pointer from path segments, and a
removal that holds only while the entry still has the value seen (a `test` before it)."""

from __future__ import annotations

from typing import Any


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) from path segments."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def remove_if_unchanged(path: str, value: Any) -> list[dict[str, Any]]:
    """Remove `path`, and fail the whole patch (422) if it no longer holds `value`."""
    return [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}]
