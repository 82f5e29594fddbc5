"""The DeviceClass of a Configuration and the CEL selectors over our attributes."""

from __future__ import annotations

from akri_trio.dra import (
    claim_spec,
    configuration_selector,
    device_class,
    fit_value,
    instance_selector,
)


def test_device_class_selects_the_configuration_by_namespace_and_name() -> None:
    body = device_class("debug-echo", "ns1")
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "DeviceClass"
    assert body["metadata"]["name"] == "debug-echo.ns1.akri.sh"
    assert body["metadata"]["labels"] == {
        "akri.sh/configuration": "debug-echo",
        "akri.sh/namespace": "ns1",
    }
    (selector,) = body["spec"]["selectors"]
    assert selector["cel"]["expression"] == (
        'device.driver == "akri.sh"'
        ' && device.attributes["akri.sh"].namespace == "ns1"'
        ' && device.attributes["akri.sh"].configuration == "debug-echo"'
    )


def test_the_driver_is_checked_before_any_attribute() -> None:
    """Another driver's device has no akri.sh attributes; reading one would abort allocation."""
    assert configuration_selector("c", "n").startswith('device.driver == "akri.sh" && ')


def test_overlong_names_are_selected_by_their_fitted_value() -> None:
    long = "c" * 100
    assert fit_value(long) in configuration_selector(long, "ns")
    expected = f'device.attributes["akri.sh"].instance == "{fit_value(long)}"'
    assert instance_selector(long) == expected
    assert "akri.sh/configuration" not in device_class(long, "ns")["metadata"]["labels"]


def test_claim_spec_asks_for_one_device_of_the_class_and_instance() -> None:
    assert claim_spec("debug-echo", "ns1") == {
        "devices": {
            "requests": [
                {"name": "device", "exactly": {"deviceClassName": "debug-echo.ns1.akri.sh"}}
            ]
        }
    }
    (request,) = claim_spec("debug-echo", "ns1", "debug-echo-abc123")["devices"]["requests"]
    (selector,) = request["exactly"]["selectors"]
    assert selector["cel"]["expression"] == instance_selector("debug-echo-abc123")
