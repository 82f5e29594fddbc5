"""Attributes within DRA's limits, and a report of every property left out and why."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from akri_trio.dra import Omitted, device_attributes, fit_value

IDENTITY = {"configuration": "cam", "namespace": "ns", "instance": "cam-abc123"}


def test_identity_and_fitting_properties_are_published_qualified() -> None:
    attrs = device_attributes("cam", "ns", "cam-abc123", {"DEBUG_ECHO_DESCRIPTION": "foo0"})
    assert attrs.values == {**IDENTITY, "DEBUG_ECHO_DESCRIPTION": "foo0"}
    assert attrs.omitted == ()
    assert attrs.as_api()["akri.sh/instance"] == {"string": "cam-abc123"}
    assert set(attrs.as_api()) == {f"akri.sh/{k}" for k in attrs.values}


def test_properties_that_do_not_fit_are_reported_with_the_reason() -> None:
    attrs = device_attributes(
        "cam",
        "ns",
        "cam-abc123",
        {
            "UDEV_DEVNODE": "/dev/video0",
            "URL": "rtsp://" + "x" * 60,
            "ONVIF.NAME": "a",
            "A" * 33: "b",
            "instance": "spoof",
            "1ABC": "c",
        },
    )
    assert attrs.values == {**IDENTITY, "UDEV_DEVNODE": "/dev/video0"}
    assert set(attrs.omitted) == {
        Omitted("URL", "value longer than 64 chars"),
        Omitted("ONVIF.NAME", "name is not a C identifier"),
        Omitted("A" * 33, "name longer than 32 chars"),
        Omitted("instance", "name is reserved for an identifying attribute"),
        Omitted("1ABC", "name is not a C identifier"),
    }


def test_at_most_32_entries_with_capacities_counted() -> None:
    props = {f"P{i:02d}": str(i) for i in range(40)}
    attrs = device_attributes("cam", "ns", "cam-abc123", props, capacities=1)
    assert len(attrs.values) == 31
    assert [o.name for o in attrs.omitted] == [f"P{i:02d}" for i in range(28, 40)]
    assert {o.reason for o in attrs.omitted} == {"more than 32 attributes and capacities"}


def test_overlong_names_are_hashed_into_the_identity() -> None:
    config = "c" * 100
    attrs = device_attributes(config, "ns", config + "-abc123", {})
    assert attrs.values["configuration"] == fit_value(config)
    assert len(attrs.values["instance"]) == 64


@given(
    st.dictionaries(st.text(min_size=1, max_size=40), st.text(max_size=80), max_size=50),
    st.integers(0, 1),
)
def test_every_property_is_either_published_or_reported(
    props: dict[str, str], capacities: int
) -> None:
    attrs = device_attributes("cam", "ns", "cam-abc123", props, capacities=capacities)
    assert len(attrs.values) + capacities <= 32
    published = set(attrs.values) - set(IDENTITY)
    omitted = [o.name for o in attrs.omitted]
    assert len(omitted) == len(set(omitted))
    assert published | set(omitted) == set(props) and not published & set(omitted)
    for name in published:
        assert attrs.values[name] == props[name] and len(props[name]) <= 64 and len(name) <= 32
