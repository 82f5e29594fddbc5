"""Names in DRA mode: the driver, DeviceClasses, devices, pools and slices.

Every name is a pure function of Akri names, so the agent, the controller and a user writing a
claim by hand all arrive at the same one. Akri names are DNS subdomains of up to 253 chars that
may contain dots; DRA device names are DNS labels of up to 63 and attribute values hold at most
64 chars. A name that does not fit as it is gets a readable prefix and a hash of the whole
original, so distinct Akri names stay distinct DRA names.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

DRIVER: Final = "akri.sh"
DOMAIN: Final = "akri.sh"  # of the attributes and capacities we publish
LABEL_NAMESPACE: Final = "akri.sh/namespace"  # on DeviceClasses and ResourceSlices

DEVICE_NAME_MAX: Final = 63  # a DNS label
ATTRIBUTE_VALUE_MAX: Final = 64  # string attributes
POOL_NAME_MAX: Final = 253
OBJECT_NAME_MAX: Final = 253  # DeviceClass, ResourceSlice: DNS subdomains
HASH_CHARS: Final = 10
EXTENDED_NAME_MAX: Final = 63  # the name part of an extended resource name
INSTANCE_CLASS_DOMAIN: Final = f"instance.{DOMAIN}"  # Instance classes end in it

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NOT_LABEL_CHAR = re.compile(r"[^a-z0-9-]+")


def short_hash(text: str) -> str:
    """Ten lowercase hex chars (40 bits) of BLAKE2b. Collisions are left to chance: among a
    thousand hashed names of one pool, about one in two million."""
    return hashlib.blake2b(text.encode(), digest_size=HASH_CHARS // 2).hexdigest()


def is_dns_label(name: str) -> bool:
    return len(name) <= DEVICE_NAME_MAX and _DNS_LABEL.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    return 0 < len(name) <= OBJECT_NAME_MAX and all(
        _DNS_LABEL.fullmatch(p) for p in name.split(".")
    )


def _hashed_label(text: str, limit: int) -> str:
    """A DNS label of at most `limit` chars: a cleaned prefix of `text`, "-", its hash."""
    cleaned = _NOT_LABEL_CHAR.sub("-", text.lower())
    prefix = cleaned[: limit - HASH_CHARS - 1].strip("-")
    return f"{prefix}-{short_hash(text)}" if prefix else short_hash(text)


def device_name(instance: str, slot: int | None = None) -> str:
    """The DRA device of an Instance (`slot` None: the one consumable-capacity device) or of one
    of its slots (`<instance>-<slot>`): the text itself when it is a DNS label, else hashed."""
    text = instance if slot is None else f"{instance}-{slot}"
    return text if is_dns_label(text) else _hashed_label(text, DEVICE_NAME_MAX)


def fit_value(text: str) -> str:
    """A string attribute value for `text`: itself up to 64 chars, else a prefix and a hash.
    CEL selectors over Akri names compare against this (see `cel_string`)."""
    if len(text) <= ATTRIBUTE_VALUE_MAX:
        return text
    return f"{text[: ATTRIBUTE_VALUE_MAX - HASH_CHARS - 1]}-{short_hash(text)}"


def device_class_name(configuration: str, namespace: str) -> str:
    """`<configuration>.<namespace>.akri.sh`; an overlong one keeps its tail and hashes the
    Configuration's name."""
    return _class_name(configuration, f".{namespace}.{DOMAIN}")


def instance_class_name(instance: str, namespace: str) -> str:
    """`<instance>.<namespace>.instance.akri.sh`, the class of one Instance's devices; an
    overlong one keeps its tail and hashes the Instance's name."""
    return _class_name(instance, f".{namespace}.{INSTANCE_CLASS_DOMAIN}")


def _class_name(head: str, tail: str) -> str:
    name = f"{head}{tail}"
    if len(name) <= OBJECT_NAME_MAX:
        return name
    return f"{_hashed_label(head, DEVICE_NAME_MAX)}{tail}"


def extended_resource_name(name: str) -> str | None:
    """`akri.sh/<name>`, the extended resource a device plugin of that Configuration or
    Instance serves, when it is one the API takes (the part after the slash a qualified name
    of at most 63 chars; Akri's names of that length are DNS subdomains, which qualify)."""
    if len(name) > EXTENDED_NAME_MAX or not is_dns_subdomain(name):
        return None
    return f"{DOMAIN}/{name}"


def node_pool(node: str, namespace: str) -> str:
    """The pool of one node's non-shared Instances of one namespace: `node/<node>/<namespace>`.

    Per namespace, so that device names (from Instance names, unique per namespace) stay unique
    in it, and every device of a pool belongs to the one namespace whose claims may use it.
    """
    return _pool(f"node/{node}/{namespace}")


def shared_pool(namespace: str, instance: str) -> str:
    """The pool of one shared Instance: `shared/<namespace>/<instance>`."""
    return _pool(f"shared/{namespace}/{instance}")


def is_shared_pool(pool: str) -> bool:
    """Whether `pool` is a shared Instance's (`shared_pool`; a shortened name keeps the prefix)."""
    return pool.startswith("shared/")


def _pool(name: str) -> str:
    if len(name) <= POOL_NAME_MAX:
        return name
    head = name[: POOL_NAME_MAX - HASH_CHARS - 1].rstrip("-./")
    return f"{head}/{short_hash(name)}"


def slice_name(pool: str, index: int) -> str:
    """ResourceSlice `index` of `pool`: `akri.sh-<pool, cleaned>-<hash of pool>-<index>`."""
    suffix = f"-{short_hash(pool)}-{index}"
    cleaned = _NOT_LABEL_CHAR.sub("-", pool.lower())
    room = OBJECT_NAME_MAX - len(DRIVER) - 1 - len(suffix)
    return f"{DRIVER}-{cleaned[:room].strip('-')}{suffix}"


def cel_string(text: str) -> str:
    """A CEL string literal for `text`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
