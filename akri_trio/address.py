"""How a Kubernetes object is addressed: its type (`Resource`) and its identity (`ObjectKey`).

Both the API client (`kube/`) and the plain-data models (`model/`) name resource types and
objects, and `model/` must not import anything that does I/O. So the two descriptors live here,
at the bottom, depending on nothing but attrs; `kube` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class Resource:
    """Addresses one resource type.

    `Resource("akri.sh", "v0", "configurations", "Configuration")`, `Resource.core("pods", "Pod")`.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @classmethod
    def core(cls, plural: str, kind: str, *, namespaced: bool = True) -> Resource:
        """A type of the legacy core group, served under /api/v1."""
        return cls("", "v1", plural, kind, namespaced)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The URL path; `namespace=None` on a namespaced type means all namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace is not None:
            parts.append(f"namespaces/{namespace}")
        elif not self.namespaced and namespace is not None:
            raise ValueError(f"{self.plural} is cluster-scoped; no namespace {namespace!r}")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError("empty object name")
            parts.append(name)
        if subresource is not None:
            if name is None:
                raise ValueError("a subresource needs an object name")
            parts.append(subresource)
        return "/".join(parts)


@attrs.frozen(order=True)
class ObjectKey:
    """One object of a resource type: `namespace` is "" for cluster-scoped objects.

    Ordered (namespace, then name) so sorted keys give a stable processing order. `str()` is
    client-go's key, `namespace/name`, or just `name` for a cluster-scoped object.
    """

    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectKey:
        """The key of an object as the API server returns it (a JSON mapping)."""
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            raise ValueError("object has no metadata.name")
        return cls(str(meta.get("namespace") or ""), str(name))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name
