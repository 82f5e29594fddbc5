"""Where the API server serves the `resource.k8s.io/v1` types DRA mode reads and writes."""

from __future__ import annotations

from typing import Final

from akri_trio.address import Resource

GROUP: Final = "resource.k8s.io"
RESOURCE_SLICES: Final = Resource(GROUP, "v1", "resourceslices", "ResourceSlice", namespaced=False)
DEVICE_CLASSES: Final = Resource(GROUP, "v1", "deviceclasses", "DeviceClass", namespaced=False)
RESOURCE_CLAIMS: Final = Resource(GROUP, "v1", "resourceclaims", "ResourceClaim")
RESOURCE_CLAIM_TEMPLATES: Final = Resource(
    GROUP, "v1", "resourceclaimtemplates", "ResourceClaimTemplate"
)
