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
# the core objects a Configuration's properties, and the webhook's certificate, are read from
SECRETS = Resource.core("secrets", "Secret")
CONFIG_MAPS = Resource.core("configmaps", "ConfigMap")


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
    """A key in a Secret or ConfigMap. `namespace` omitted (`OWN_NAMESPACE`) is the
    Configuration's own: reading a Configuration fills it in (`with_own_namespace`)."""

    key: str
    name: str
    namespace: str = ""
    optional: bool | None = None


OWN_NAMESPACE = ""


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


def with_own_namespace(config: Configuration) -> Configuration:
    """`config` with every discoveryProperties reference that names no namespace pointed at the
    Configuration's own. Upstream reads `default` then: the same for Configurations in
    `default`, and a Configuration elsewhere never reads another tenant's Secrets."""
    handler = config.spec.discovery_handler
    if not handler.discovery_properties:
        return config

    def own(ref: KeyRef | None) -> KeyRef | None:
        if ref is None or ref.namespace != OWN_NAMESPACE:
            return ref
        return attrs.evolve(ref, namespace=config.metadata.namespace)

    props = tuple(
        p
        if p.value_from is None
        else attrs.evolve(
            p,
            value_from=ValueFrom(
                own(p.value_from.secret_key_ref), own(p.value_from.config_map_key_ref)
            ),
        )
        for p in handler.discovery_properties
    )
    spec = attrs.evolve(
        config.spec, discovery_handler=attrs.evolve(handler, discovery_properties=props)
    )
    return attrs.evolve(config, spec=spec)


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
