"""Upstream's `FilterList` (akri-discovery-utils `filtering`): `items` plus `action`, Include or
Exclude, in the discoveryDetails of the ONVIF and OPC UA handlers.

One definition for both handlers, so a Configuration's filter means the same thing, and a bad one
reads the same, whichever handler it is written for. How an item *matches* stays with the
handler (exact application names for OPC UA; case-insensitive addresses, exact scopes and
normalized uuids for ONVIF); this module only parses the list and applies the action.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from akri_trio.discovery.interface import InvalidDetails, describe_kind, required_str_list

Action = Literal["Include", "Exclude"]


@attrs.frozen
class FilterList:
    items: tuple[str, ...]
    action: Action = "Include"

    def passes(self, matched: bool) -> bool:
        """Include keeps what matched an item, Exclude keeps what did not."""
        return matched if self.action == "Include" else not matched


def passes(filter_list: FilterList | None, matched: bool) -> bool:
    """Upstream's `should_include`: no filter passes everything."""
    return filter_list is None or filter_list.passes(matched)


def admits(filter_list: FilterList | None, item: str) -> bool:
    """For filters on one exact string (OPC UA's application names)."""
    return passes(filter_list, filter_list is not None and item in filter_list.items)


def parse_filter_list(doc: Mapping[str, Any], field: str) -> FilterList | None:
    """`doc[field]` as a FilterList; absent or null -> None. Errors name the field."""
    value = doc.get(field)
    if value is None:
        return None
    if not isinstance(value, dict):
        problem = "must be a mapping with `items` and optional `action`"
        raise InvalidDetails(field, f"{problem}, got {describe_kind(value)}")
    try:
        items = required_str_list(value, "items")
    except InvalidDetails as exc:  # it names the field relative to the FilterList
        raise InvalidDetails(f"{field}.{exc.field}", exc.problem) from None
    action = value.get("action", "Include")
    if action not in ("Include", "Exclude"):
        raise InvalidDetails(f"{field}.action", f"must be Include or Exclude, got {action!r}")
    return FilterList(items, action)
