"""The FilterList shared by the ONVIF and OPC UA discoveryDetails (akri_trio.discovery.filters)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.discovery.filters import FilterList, admits, parse_filter_list, passes
from akri_trio.discovery.interface import InvalidDetails

names = st.text(max_size=6)


@given(st.lists(names, max_size=5), names)
def test_admits_is_exact_membership_turned_by_the_action(items: list[str], name: str) -> None:
    inside = name in items
    assert admits(FilterList(tuple(items), "Include"), name) is inside
    assert admits(FilterList(tuple(items), "Exclude"), name) is not inside
    assert admits(None, name)


def test_admits_is_case_sensitive_like_upstream() -> None:
    assert not admits(FilterList(("Server",)), "server")


@given(st.booleans())
def test_no_filter_passes_everything_and_the_actions_are_opposites(matched: bool) -> None:
    assert passes(None, matched)
    assert passes(FilterList(("x",), "Include"), matched) is matched
    assert passes(FilterList(("x",), "Exclude"), matched) is not matched


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({}, None),
        ({"f": None}, None),
        ({"f": {"items": ["a", "b"]}}, FilterList(("a", "b"), "Include")),
        ({"f": {"items": [], "action": "Exclude"}}, FilterList((), "Exclude")),
    ],
)
def test_parse_filter_list(doc: dict[str, Any], expected: FilterList | None) -> None:
    assert parse_filter_list(doc, "f") == expected


@pytest.mark.parametrize(
    ("value", "field", "problem"),
    [
        (["a"], "f", "must be a mapping with `items` and optional `action`, got a list"),
        ({}, "f.items", "is required"),
        ({"items": "a"}, "f.items", "must be a list of strings, got a string"),
        ({"items": ["a", 1]}, "f.items[1]", "must be a string"),
        ({"items": [], "action": "include"}, "f.action", "must be Include or Exclude"),
    ],
)
def test_bad_filter_lists_name_the_field(value: Any, field: str, problem: str) -> None:
    with pytest.raises(InvalidDetails) as bad:
        parse_filter_list({"f": value}, "f")
    assert bad.value.field == field
    assert problem in bad.value.problem
