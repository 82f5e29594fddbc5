"""The two Akri custom resources, `akri.sh/v0` Configuration and Instance, as attrs classes.

The shapes follow upstream's Rust structs field for field (akri-upstream.md §2) so a
Configuration written for upstream Akri structures here unchanged. Broker PodSpec / JobSpec and
the ServiceSpecs stay plain JSON dicts: we pass them to the API server, never interpret them, so
keeping them whole is what guarantees that nothing a user wrote is dropped.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from akri_trio.address import ObjectKey, Resource

JSON = dict[str, Any]

# Where the API server serves them (the CRDs in k8s/crds/).
CONFIGURATIONS = Resource("akri.sh", "v0", "configurations", "Configuration")
INSTANCES = Resource("akri.sh", "v0", "instances", "Instance")


@attrs.frozen
class ObjectMeta:
    name: str
    namespace: str = "default"
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = attrs.field(factory=dict)
    annotations: dict[str, str] = attrs.field(factory=dict)
    owner_references: tuple[JSON, ...] = ()
    finalizers: tuple[str, ...] = ()
    deletion_timestamp: str | None = None
    creation_timestamp: str | None = None

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(self.namespace, self.name)


# --- Configuration -------------------------------------------------------------------------------


@attrs.frozen
class KeyRef:
    """A key in a Secret or ConfigMap; `namespace` defaults to "default" as upstream."""

    key: str
    name: str
    namespace: str = "default"
    optional: bool | None = None


@attrs.frozen
class ValueFrom:
    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None


@attrs.frozen
class DiscoveryProperty:
    name: str
    value: str | None = None
    value_from: ValueFrom | None = None


@attrs.frozen
class DiscoveryHandlerInfo:
    name: str
    discovery_details: str = ""
    discovery_properties: tuple[DiscoveryProperty, ...] | None = None


@attrs.frozen
class BrokerSpec:
    """Upstream's one-of, serialized as a singleton map: {brokerPodSpec: ...} or
    {brokerJobSpec: ...}."""

    kind: Literal["pod", "job"]
    spec: JSON


@attrs.frozen
class ConfigurationSpec:
    discovery_handler: DiscoveryHandlerInfo
    capacity: int = 1
    broker_spec: BrokerSpec | None = None
    instance_service_spec: JSON | None = None
    configuration_service_spec: JSON | None = None
    broker_properties: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Configuration:
    metadata: ObjectMeta
    spec: ConfigurationSpec
    status: JSON = attrs.field(factory=dict)
    api_version: str = "akri.sh/v0"
    kind: str = "Configuration"


# --- Instance ------------------------------------------------------------------------------------


@attrs.frozen
class InstanceSpec:
    configuration_name: str
    cdi_name: str
    capacity: int
    broker_properties: dict[str, str] = attrs.field(factory=dict)
    shared: bool = False
    nodes: tuple[str, ...] = ()
    # Sparse: only claimed slots are present (free = absent or "").
    device_usage: dict[str, str] = attrs.field(factory=dict)
    # What brokers reported, "<node>/<file name>" -> contents (written per node by its agent).
    broker_info: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Instance:
    metadata: ObjectMeta
    spec: InstanceSpec
    api_version: str = "akri.sh/v0"
    kind: str = "Instance"
