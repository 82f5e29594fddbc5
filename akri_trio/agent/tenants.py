"""Which Configuration of a name this node serves: the kubelet has no namespaces.

A Configuration `cam` in namespace `a` and one named `cam` in namespace `b` would both register
the kubelet resource `akri.sh/cam` (and, for a shared device, the same `akri.sh/cam-<hash>`)
on the same socket names: the kubelet would keep whichever registered last, and Pods of one
tenant would get the other's devices. So on a node one of them owns the name — the oldest
(creationTimestamp), then the first namespace in order, among the Configurations the agent
watches: the same answer on every node and after every restart as long as each node's agent
watches them all (an agent scoped by --namespace or --configuration-selector cannot see the
others) — and the others are refused with a status condition naming the owner. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from akri_trio.address import ObjectKey

REASON = "NameTaken"


def name_owner(same_name: Mapping[ObjectKey, str | None]) -> ObjectKey | None:
    """The Configuration that owns the kubelet names of its name, among `same_name` (every
    Configuration this node sees with that name: key -> its creationTimestamp)."""
    if not same_name:
        return None
    # RFC 3339 in UTC at one-second resolution: ordered as text. Missing (never from an API
    # server) sorts last.
    return min(same_name, key=lambda k: (same_name[k] or "~", k.namespace))


def refusal(key: ObjectKey, owner: ObjectKey) -> str:
    return (
        f"the kubelet resource akri.sh/{key.name} on this node belongs to Configuration "
        f"{owner} (created first; kubelet resources are per node, not per namespace): "
        f"rename this Configuration to use it here"
    )


def siblings(keys: Iterable[ObjectKey], key: ObjectKey) -> list[ObjectKey]:
    """The other Configurations of `key`'s name."""
    return sorted(k for k in keys if k.name == key.name and k != key)
