"""Upstream Akri's naming rules, in one place.

Everything a discovery handler, a broker or a human sees by name — Instance names, kubelet
resource names, slot ids, deviceUsage values, env var names — must match upstream Akri byte for
byte, or Configurations and brokers written for upstream stop working. Pure functions only.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from typing import Final

import attrs

AKRI_PREFIX: Final = "akri.sh"
API_VERSION: Final = "akri.sh/v0"
FINALIZER_FIELD_MANAGER_SUFFIX: Final = "-fin"

# Labels set on broker Pods, Jobs and Services (upstream shared/src/k8s/*.rs).
LABEL_CONFIGURATION: Final = "akri.sh/configuration"
LABEL_INSTANCE: Final = "akri.sh/instance"
LABEL_TARGET_NODE: Final = "akri.sh/target-node"
LABEL_CONTROLLER: Final = "controller"
CONTROLLER_VALUE: Final = "akri.sh"


def device_hash(device_id: str, node: str | None) -> str:
    """Six lowercase hex chars: BLAKE2b(3 bytes) of the id, plus the node name for local devices.

    `node` is None for shared devices (every node must compute the same name for them) and the
    node's name for local ones (two nodes' `/dev/video0` are different devices).
    """
    source = device_id if node is None else device_id + node
    return hashlib.blake2b(source.encode(), digest_size=3).hexdigest()


def instance_name(configuration: str, digest: str) -> str:
    return f"{configuration}-{digest}"


def cdi_kind(configuration: str) -> str:
    return f"{AKRI_PREFIX}/{configuration}"


def cdi_name(configuration: str, digest: str) -> str:
    """The Instance's `spec.cdiName`: `akri.sh/<config>=<hash>`."""
    return f"{cdi_kind(configuration)}={digest}"


def resource_name(plugin: str) -> str:
    """The kubelet extended resource of an instance- or configuration-level plugin."""
    return f"{AKRI_PREFIX}/{plugin}"


def slot_id(instance: str, index: int) -> str:
    """Instance-level kubelet device id and deviceUsage key: `<instance>-<i>`."""
    return f"{instance}-{index}"


def vdev_id(configuration: str, index: int) -> str:
    """Configuration-level (virtual) kubelet device id: `<config>-<n>`."""
    return f"{configuration}-{index}"


class BadId(ValueError):
    """A slot or vdev id that does not have the `<name>-<non-negative int>` shape."""


# Longest index text a slot or vdev id may carry. Capacities stay far below 10**9; anyone can
# write any key into deviceUsage, and int() of a longer string costs time (and past 4300
# digits raises ValueError), so a longer "index" is simply not an index.
MAX_INDEX_DIGITS: Final = 9


def _is_index(text: str) -> bool:
    """Canonical decimal: ASCII digits (str.isdigit alone admits '²', which int() refuses),
    no leading zero, at most MAX_INDEX_DIGITS long."""
    return (
        0 < len(text) <= MAX_INDEX_DIGITS
        and text.isascii()
        and text.isdigit()
        and (len(text) == 1 or text[0] != "0")
    )


def index_after(prefix: str, device_id: str) -> int | None:
    """`i` if `device_id` is exactly `<prefix>-<i>`, else None: split_indexed for one known
    name, without building the pair (it runs for every deviceUsage key on every change)."""
    n = len(prefix)
    if len(device_id) <= n + 1 or device_id[n] != "-" or not device_id.startswith(prefix):
        return None
    index = device_id[n + 1 :]
    return int(index) if _is_index(index) else None


def split_indexed(device_id: str) -> tuple[str, int]:
    """`"cam-8120fe-1"` -> `("cam-8120fe", 1)`: upstream parses ids with rsplit_once('-')."""
    name, sep, index = device_id.rpartition("-")
    if not sep or not name or not _is_index(index):
        raise BadId(f"not a '<name>-<index>' device id: {device_id!r}")
    return name, int(index)


def plugin_socket_name(plugin: str, unix_seconds: int) -> str:
    """Device-plugin socket file name in the kubelet's device-plugins directory."""
    return f"{plugin}-{unix_seconds}.sock"


def env_var_names(key: str, digest: str) -> tuple[str, str]:
    """A broker property is injected twice: as-is and suffixed with the upper-cased hash."""
    return key, f"{key}_{digest.upper()}"


# --- brokerInfo keys ------------------------------------------------------------------------------
# "<node>/<file name>": each node writes (and a lost node's cleanup removes) only its own prefix.

BROKER_INFO_SEPARATOR: Final = "/"


def node_broker_info(broker_info: Mapping[str, str] | None, node: str) -> dict[str, str]:
    """The part of an Instance's brokerInfo that `node` writes."""
    prefix = node + BROKER_INFO_SEPARATOR
    return {k: v for k, v in (broker_info or {}).items() if k.startswith(prefix)}


# --- deviceUsage values -------------------------------------------------------------------------
# "" = free; "<node>" = claimed by that node's instance-level plugin;
# "C:<vdev>:<node>" = claimed by that node's configuration-level plugin for virtual device <vdev>;
# "D:<claim uid>:<node>" = held by a DRA claim prepared on that node, recorded by its agent in
# device-plugin mode after a switch back from DRA mode (agent/dra/holdings.py);
# "DX:<claim uid>:<node>" = the same, of a claim made for a Pod's `akri.sh/<instance>` extended
# resource, which the scheduler counts on that node as a device plugin's.


@attrs.frozen
class Free:
    pass


@attrs.frozen
class NodeClaim:
    node: str


@attrs.frozen
class ConfigClaim:
    vdev: str
    node: str


@attrs.frozen
class DraClaim:
    claim: str  # the ResourceClaim's uid
    node: str
    counted: bool = False  # its Pod's request of `akri.sh/<instance>` counts on the node


Usage = Free | NodeClaim | ConfigClaim | DraClaim
FREE: Final = Free()


@functools.lru_cache(maxsize=4096)
def parse_usage(value: str) -> Usage:
    """Decode a deviceUsage value. Values written by other tools that we cannot decode are
    treated as held by that opaque owner (a NodeClaim of the raw value): never as free.

    Cached: a cluster has few distinct values (one per node, one per held vdev) and every
    ListAndWatch recomputation decodes them all; the results are frozen, so sharing is safe."""
    if value == "":
        return FREE
    if value.startswith("C:"):
        vdev, sep, node = value[2:].rpartition(":")
        if sep and vdev and node:
            return ConfigClaim(vdev, node)
    if value.startswith(("D:", "DX:")):
        counted = value.startswith("DX:")
        claim, sep, node = value[3 if counted else 2 :].rpartition(":")
        if sep and claim and node:
            return DraClaim(claim, node, counted)
    return NodeClaim(value)


def format_usage(usage: Usage) -> str:
    match usage:
        case Free():
            return ""
        case NodeClaim(node):
            return node
        case ConfigClaim(vdev, node):
            return f"C:{vdev}:{node}"
        case DraClaim(claim, node, counted):
            return f"{'DX' if counted else 'D'}:{claim}:{node}"


_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_dns1123_subdomain(name: str) -> bool:
    """Kubernetes object-name rule for Configurations and Instances."""
    return 0 < len(name) <= 253 and all(_DNS1123_LABEL.fullmatch(p) for p in name.split("."))
