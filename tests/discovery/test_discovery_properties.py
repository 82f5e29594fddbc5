"""discoveryProperties resolution (upstream's discovery_property_solver.rs rules)."""

from __future__ import annotations

import base64

import pytest

from akri_trio.discovery.properties import (
    ObjectRef,
    UnsolvableProperty,
    referenced_objects,
    resolve,
)
from akri_trio.model.convert import structure
from akri_trio.model.resources import Configuration, DiscoveryProperty, KeyRef, ValueFrom


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret_ref(key: str, optional: bool | None = None, name: str = "s") -> DiscoveryProperty:
    return DiscoveryProperty(
        "p", value_from=ValueFrom(secret_key_ref=KeyRef(key, name, "ns", optional))
    )


def cm_ref(key: str, optional: bool | None = None) -> DiscoveryProperty:
    return DiscoveryProperty(
        "p", value_from=ValueFrom(config_map_key_ref=KeyRef(key, "cm", "ns", optional))
    )


SECRETS = {("ns", "s"): {"data": {"user": b64(b"admin"), "bin": b64(b"\x00\xff")}}}
CONFIG_MAPS = {("ns", "cm"): {"data": {"text": "héllo"}, "binaryData": {"blob": b64(b"\x01")}}}


def test_the_upstream_documentation_example() -> None:
    props = [
        DiscoveryProperty("property_from_plain_text", value="plain text data"),
        DiscoveryProperty(
            "property_from_secret",
            value_from=ValueFrom(
                secret_key_ref=KeyRef("secret-key", "mysecret", "mysecret-namespace", False)
            ),
        ),
        DiscoveryProperty(
            "property_from_configmap",
            value_from=ValueFrom(
                config_map_key_ref=KeyRef(
                    "configmap-key", "myconfigMap", "myconfigmap-namespace", True
                )
            ),
        ),
    ]
    secrets = {("mysecret-namespace", "mysecret"): {"data": {"secret-key": b64(b"secret1")}}}
    cms = {("myconfigmap-namespace", "myconfigMap"): {"data": {"configmap-key": "configmap1"}}}
    assert resolve(props, cms, secrets) == {
        "property_from_plain_text": b"plain text data",
        "property_from_secret": b"secret1",
        "property_from_configmap": b"configmap1",
    }
    assert referenced_objects(props) == {
        ObjectRef("Secret", "mysecret-namespace", "mysecret"),
        ObjectRef("ConfigMap", "myconfigmap-namespace", "myconfigMap"),
    }


def test_values_and_sources() -> None:
    assert resolve(None, {}, {}) == {}
    assert resolve([DiscoveryProperty("a", value="é")], {}, {}) == {"a": "é".encode()}
    assert resolve([DiscoveryProperty("a")], {}, {}) == {"a": None}  # neither: no value
    assert resolve([secret_ref("bin")], CONFIG_MAPS, SECRETS) == {"p": b"\x00\xff"}
    assert resolve([cm_ref("text")], CONFIG_MAPS, SECRETS) == {"p": "héllo".encode()}
    assert resolve([cm_ref("blob")], CONFIG_MAPS, SECRETS) == {"p": b"\x01"}  # binaryData


def test_configmap_data_wins_over_binary_data() -> None:
    cms = {("ns", "cm"): {"data": {"k": "text"}, "binaryData": {"k": b64(b"bin")}}}
    assert resolve([cm_ref("k")], cms, {}) == {"p": b"text"}


@pytest.mark.parametrize(
    "prop",
    [
        secret_ref("missing", optional=True),
        secret_ref("user", optional=True, name="other"),  # no such Secret
        cm_ref("missing", optional=True),
    ],
)
def test_missing_optional_is_omitted(prop: DiscoveryProperty) -> None:
    others = [DiscoveryProperty("x", value="1")]
    assert resolve([prop, *others], CONFIG_MAPS, SECRETS) == {"x": b"1"}


@pytest.mark.parametrize(
    ("prop", "source"),
    [
        (secret_ref("missing"), "Secret ns/s key 'missing'"),
        (secret_ref("user", optional=False, name="other"), "Secret ns/other key 'user'"),
        (cm_ref("missing"), "ConfigMap ns/cm key 'missing'"),
    ],
)
def test_missing_required_names_property_and_source(prop: DiscoveryProperty, source: str) -> None:
    with pytest.raises(UnsolvableProperty) as info:
        resolve([prop], CONFIG_MAPS, SECRETS)
    assert info.value.property_name == "p"
    assert info.value.source == source
    assert "'p'" in str(info.value) and source in str(info.value)


def test_bad_base64_in_a_secret_is_unsolvable() -> None:
    secrets = {("ns", "s"): {"data": {"k": "not base64!"}}}
    with pytest.raises(UnsolvableProperty, match="invalid base64"):
        resolve([secret_ref("k")], {}, secrets)


def _read(config_namespace: str, **key_ref: str) -> Configuration:
    prop = {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", **key_ref}}}
    handler = {"name": "onvif", "discoveryProperties": [prop, {"name": "PLAIN", "value": "v"}]}
    body = {
        "metadata": {"name": "cams", "namespace": config_namespace},
        "spec": {"discoveryHandler": handler},
    }
    return structure(body, Configuration)


@pytest.mark.parametrize("namespace", ["default", "team-a"])
def test_a_reference_without_namespace_reads_the_configurations_own(namespace: str) -> None:
    """Upstream's `default` for a Configuration in `default`; elsewhere its own namespace,
    never another tenant's."""
    props = _read(namespace, key="pw").spec.discovery_handler.discovery_properties or ()
    assert referenced_objects(props) == {ObjectRef("Secret", namespace, "creds")}
    secrets = {(namespace, "creds"): {"data": {"pw": b64(b"hunter2")}}}
    assert resolve(props, {}, secrets) == {"PASSWORD": b"hunter2", "PLAIN": b"v"}


def test_a_reference_naming_a_namespace_keeps_it() -> None:
    """(Which the agent and the webhook then refuse: not the Configuration's namespace.)"""
    handler = _read("team-a", key="pw", namespace="team-b").spec.discovery_handler
    props = handler.discovery_properties or ()
    assert referenced_objects(props) == {ObjectRef("Secret", "team-b", "creds")}
