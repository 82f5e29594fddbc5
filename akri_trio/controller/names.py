"""Names and label values of the objects the controller makes, always valid for the API server.

Upstream's rules (`<node>-<instance>-pod` for a shared Instance, `<instance>-pod` otherwise,
`<instance>-<generation>-job`, `<instance>-svc`, `<configuration>-svc`) are kept byte for byte
whenever their result is valid, so brokers made by upstream's controller are recognised as
ours. Upstream never shortens, and its results can be refused by the API server:

- the Pod's `app` label repeats the Pod name, and a label value is at most 63 characters;
- a Job's name becomes its Pods' `job-name` label, so it is also held to 63;
- a Service name is a DNS-1035 label: at most 63 characters, starting with a letter;
- the `akri.sh/*` labels hold Configuration, Instance and node names, which may be up to 253
  characters.

A name that would break one of these rules is shortened to
`<head>-<6 hex of BLAKE2b(full name)>-<suffix>`: the head is the start of the upstream name cut
to fit, the digest keeps two long names that share a head apart. A Service name that would
start with a digit gets `s` prepended to its head. A label value that is too long becomes
`<head>-<digest>` the same way (`label_value`); selectors must use the same function.
Pure functions only.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from akri_trio.model import naming

MAX_LABEL: Final = 63

_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_NOT_NAME_CHAR = re.compile(r"[^a-z0-9.-]")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=3).hexdigest()


def is_label_value(text: str) -> bool:
    return len(text) <= MAX_LABEL and _LABEL_VALUE.fullmatch(text) is not None


def is_short_name(name: str) -> bool:
    """A DNS-1123 subdomain that also fits in a label value."""
    return len(name) <= MAX_LABEL and naming.is_dns1123_subdomain(name)


def is_dns1035_label(name: str) -> bool:
    return is_short_name(name) and "." not in name and name[0].isalpha()


def _shortened(full: str, suffix: str, *, letter_first: bool) -> str:
    """`<head>-<digest>-<suffix>` within MAX_LABEL, using only [a-z0-9-]."""
    tail = f"-{_digest(full)}-{suffix}"
    head = _NOT_NAME_CHAR.sub("-", full.lower()).replace(".", "-")
    if letter_first and not head[:1].isalpha():
        head = "s" + head
    head = head[: MAX_LABEL - len(tail)].strip("-") or "s"
    return head + tail


def _named(base: str, suffix: str, *, dns1035: bool = False) -> str:
    full = f"{base}-{suffix}"
    if is_dns1035_label(full) if dns1035 else is_short_name(full):
        return full
    return _shortened(full, suffix, letter_first=dns1035)


def broker_pod_name(instance: str, node: str, shared: bool) -> str:
    """Upstream replaces '.' in the Instance name (not in the node name) by '-'."""
    base = instance.replace(".", "-")
    return _named(f"{node}-{base}" if shared else base, "pod")


def broker_job_name(instance: str, generation: int) -> str:
    return _named(f"{instance}-{generation}", "job")


def claim_template_name(instance: str) -> str:
    """The ResourceClaimTemplate of an Instance's brokers in DRA mode: `<instance>-claim`."""
    return _named(instance, "claim")


def instance_service_name(instance: str) -> str:
    return _named(instance, "svc", dns1035=True)


def configuration_service_name(configuration: str) -> str:
    return _named(configuration, "svc", dns1035=True)


def label_value(text: str) -> str:
    """`text` when it is a valid label value, else a shortened stand-in (a node name > 63)."""
    if is_label_value(text):
        return text
    tail = f"-{_digest(text)}"
    head = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[: MAX_LABEL - len(tail)]
    return (head.strip("-_.") or "x") + tail
