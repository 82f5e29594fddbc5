"""DRA names are valid API names for any Akri name, deterministic, and keep distinct Akri
names distinct."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.dra import names
from akri_trio.model.naming import is_dns1123_subdomain

_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
# Akri names: DNS subdomains of up to 253 chars, often longer than a DNS label.
SUBDOMAINS = st.lists(_LABEL, min_size=1, max_size=12).map(".".join).filter(lambda s: len(s) <= 253)
POOL_SEGMENT = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def _valid_pool(pool: str) -> bool:
    return len(pool) <= 253 and all(
        POOL_SEGMENT.fullmatch(p) and is_dns1123_subdomain(p) for p in pool.split("/")
    )


def test_short_names_stay_readable() -> None:
    assert names.device_name("cam-abc123") == "cam-abc123"
    assert names.device_name("cam-abc123", 1) == "cam-abc123-1"
    assert names.device_class_name("cam", "ns") == "cam.ns.akri.sh"
    assert names.node_pool("127.0.0.1", "ns") == "node/127.0.0.1/ns"
    assert names.shared_pool("ns", "cam-abc123") == "shared/ns/cam-abc123"
    assert names.fit_value("x" * 64) == "x" * 64


def test_a_dotted_name_is_hashed_not_just_cleaned() -> None:
    """`a.b-c` and `a-b.c` would both clean to `a-b-c`."""
    one, two = names.device_name("a.b-c"), names.device_name("a-b.c")
    assert one != two
    assert one.startswith("a-b-c-") and names.is_dns_label(one)


@given(SUBDOMAINS, st.none() | st.integers(0, 10_000))
def test_device_names_are_dns_labels(instance: str, slot: int | None) -> None:
    name = names.device_name(instance, slot)
    assert names.is_dns_label(name)
    assert name == names.device_name(instance, slot)


@given(st.lists(st.tuples(SUBDOMAINS, st.none() | st.integers(0, 50)), unique=True, max_size=30))
def test_distinct_instances_and_slots_get_distinct_device_names(
    pairs: list[tuple[str, int | None]],
) -> None:
    # Within one pool all devices are slot devices or none is; check each mode.
    for mode in (True, False):
        chosen = [(i, s) for i, s in pairs if (s is None) is mode]
        made = {names.device_name(i, s) for i, s in chosen}
        assert len(made) == len(chosen)


@given(st.text(max_size=300))
def test_attribute_values_fit(text: str) -> None:
    value = names.fit_value(text)
    assert len(value) <= names.ATTRIBUTE_VALUE_MAX
    assert (value == text) is (len(text) <= names.ATTRIBUTE_VALUE_MAX)


@given(SUBDOMAINS, _LABEL)
def test_device_class_names_are_dns_subdomains(configuration: str, namespace: str) -> None:
    name = names.device_class_name(configuration, namespace)
    assert is_dns1123_subdomain(name)
    assert name.endswith(f".{namespace}.akri.sh")


@given(SUBDOMAINS, _LABEL, SUBDOMAINS)
def test_pool_and_slice_names_are_valid(node: str, namespace: str, instance: str) -> None:
    for pool in (names.node_pool(node, namespace), names.shared_pool(namespace, instance)):
        assert _valid_pool(pool), pool
        for index in (0, 7, 1000):
            assert is_dns1123_subdomain(names.slice_name(pool, index))


@given(SUBDOMAINS, SUBDOMAINS)
def test_pools_of_different_nodes_or_instances_differ(a: str, b: str) -> None:
    if a != b:
        assert names.node_pool(a, "ns") != names.node_pool(b, "ns")
        assert names.shared_pool("ns", a) != names.shared_pool("ns", b)
        assert names.slice_name(names.node_pool(a, "ns"), 0) != names.slice_name(
            names.node_pool(b, "ns"), 0
        )
    assert names.node_pool(a, "ns") != names.shared_pool("ns", b)


def test_cel_strings_escape_quotes_and_backslashes() -> None:
    assert names.cel_string('a"b\\c') == '"a\\"b\\\\c"'
