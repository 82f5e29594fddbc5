"""Naming must match upstream Akri byte for byte (akri-upstream.md §4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.model import naming
from akri_trio.model.naming import FREE, ConfigClaim, NodeClaim


@pytest.mark.parametrize(
    ("device_id", "node", "expected"),
    [
        ("my_local_device", "my_node", "e77db4"),  # upstream's test vectors
        ("my_local_device", "my_other_node", "099763"),
        ("my_shared_device", None, "4294ea"),
    ],
)
def test_device_hash_matches_upstream_vectors(
    device_id: str, node: str | None, expected: str
) -> None:
    assert naming.device_hash(device_id, node) == expected


def test_names_derived_from_configuration_and_hash() -> None:
    assert naming.instance_name("akri-onvif", "8120fe") == "akri-onvif-8120fe"
    assert naming.cdi_name("akri-onvif", "8120fe") == "akri.sh/akri-onvif=8120fe"
    assert naming.resource_name("akri-onvif-8120fe") == "akri.sh/akri-onvif-8120fe"
    assert naming.slot_id("akri-onvif-8120fe", 1) == "akri-onvif-8120fe-1"
    assert naming.vdev_id("akri-onvif", 3) == "akri-onvif-3"
    assert naming.plugin_socket_name("akri-onvif", 1700000000) == "akri-onvif-1700000000.sock"
    assert naming.env_var_names("DEBUG_ECHO_DESCRIPTION", "e77db4") == (
        "DEBUG_ECHO_DESCRIPTION",
        "DEBUG_ECHO_DESCRIPTION_E77DB4",
    )


@given(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True),
    st.integers(min_value=0, max_value=10**6),
)
def test_split_indexed_inverts_slot_id(name: str, index: int) -> None:
    assert naming.split_indexed(naming.slot_id(name, index)) == (name, index)


@pytest.mark.parametrize("bad", ["", "abc", "abc-", "-1", "abc-x", "abc-01", "abc-²", "abc-٣"])
def test_split_indexed_rejects_malformed_ids(bad: str) -> None:
    with pytest.raises(naming.BadId):
        naming.split_indexed(bad)


@given(st.sampled_from(["abc", "a-b", "abc-1"]), st.text(max_size=12))
def test_index_after_agrees_with_split_indexed(prefix: str, text: str) -> None:
    for device_id in (text, f"{prefix}{text}", f"{prefix}-{text}"):
        try:
            name, index = naming.split_indexed(device_id)
            expected = index if name == prefix else None
        except naming.BadId:
            expected = None
        assert naming.index_after(prefix, device_id) == expected


@pytest.mark.parametrize(
    ("value", "usage"),
    [
        ("", FREE),
        ("node-a", NodeClaim("node-a")),
        ("C:akri-onvif-0:node-b", ConfigClaim("akri-onvif-0", "node-b")),
        ("C:0:node-b", ConfigClaim("0", "node-b")),  # seed 000's numeric vdev ids
    ],
)
def test_usage_values_round_trip(value: str, usage: naming.Usage) -> None:
    assert naming.parse_usage(value) == usage
    assert naming.format_usage(usage) == value


@pytest.mark.parametrize("value", ["C:", "C:x", "C::n", "C:x:"])
def test_undecodable_config_claims_are_held_never_free(value: str) -> None:
    assert naming.parse_usage(value) == NodeClaim(value)


@given(st.text())
def test_any_nonempty_usage_value_is_held(value: str) -> None:
    assert (naming.parse_usage(value) == FREE) == (value == "")


def test_dns1123_subdomain() -> None:
    assert naming.is_dns1123_subdomain("akri-debug-echo-foo")
    assert naming.is_dns1123_subdomain("a.b-c")
    for bad in ("", "Upper", "-a", "a-", "a_b", "a" * 254):
        assert not naming.is_dns1123_subdomain(bad)
