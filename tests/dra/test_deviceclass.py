"""The DeviceClasses of a Configuration and of an Instance, and the CEL selectors over our
attributes."""

from __future__ import annotations

from akri_trio.dra import (
    claim_spec,
    configuration_selector,
    device_class,
    device_class_name,
    extended_resource_name,
    fit_value,
    instance_class,
    instance_class_name,
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


def test_a_configurations_class_serves_its_extended_resource() -> None:
    """A Pod asking `akri.sh/<configuration>` in its limits is allocated from this class."""
    assert device_class("debug-echo", "ns1")["spec"]["extendedResourceName"] == "akri.sh/debug-echo"


def test_an_instances_class_serves_its_extended_resource_and_selects_only_its_devices() -> None:
    body = instance_class("debug-echo", "ns1", "debug-echo-abc123")
    assert body["metadata"]["name"] == "debug-echo-abc123.ns1.instance.akri.sh"
    assert body["metadata"]["labels"] == {
        "akri.sh/configuration": "debug-echo",
        "akri.sh/instance": "debug-echo-abc123",
        "akri.sh/namespace": "ns1",
    }
    assert body["spec"]["extendedResourceName"] == "akri.sh/debug-echo-abc123"
    (selector,) = body["spec"]["selectors"]
    assert selector["cel"]["expression"] == (
        configuration_selector("debug-echo", "ns1")
        + " && "
        + instance_selector("debug-echo-abc123")
    )


def test_a_name_the_api_refuses_as_extended_resource_gets_no_extended_resource() -> None:
    """Past 63 chars `akri.sh/<name>` is no extended resource name (nor a device plugin's
    resource): the class still selects, for claims."""
    long = "c" * 64
    assert extended_resource_name("c" * 63) == "akri.sh/" + "c" * 63
    assert extended_resource_name(long) is None
    assert "extendedResourceName" not in device_class(long, "ns")["spec"]
    assert "extendedResourceName" not in instance_class("c", "ns", long)["spec"]
    assert instance_class("c", "ns", long)["spec"]["selectors"]


def test_instance_class_names_are_object_names_distinct_from_configuration_classes() -> None:
    assert instance_class_name("x", "ns") != device_class_name("x", "ns")
    long = instance_class_name("i" * 300, "ns")
    assert len(long) <= 253 and long.endswith(".ns.instance.akri.sh")
    assert long != instance_class_name("i" * 301, "ns")
