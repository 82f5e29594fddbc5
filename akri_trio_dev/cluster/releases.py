"""What differs between the supported Kubernetes releases, for the cluster and the tests on it.

The local cluster runs each release as a user gets it: no feature gate is set on any process.
Its command lines and KubeletConfiguration are the same for every supported release: each flag
and field they set exists from 1.34 on (`failCgroupV1`, which 1.35+ kubelets need on cgroup v1
hosts, since 1.31; `podLogsDir` since 1.29), checked against the sources of both pinned
releases. What differs is which features are on by default, so which behaviours a release can
show: a test of a newer one is skipped on an older release, with a reason naming both
(tests/support/releases.py), and Akri itself adapts at run time (it probes for consumable
capacity and drops `extendedResourceName` where the API server does).

`DEFAULT_ON_FROM` is read from `pkg/features/kube_features.go` of the pinned releases (v1.34.4
and v1.37.2): the minor from which each feature gate Akri or its tests touch is on by default.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from akri_trio_dev.cluster.layout import minor_of

# gate -> the first minor release where it is on by default (all on from 1.34: resource.k8s.io/v1,
# DynamicResourceAllocation GA, DRAPrioritizedList, DRAAdminAccess,
# DRAResourceClaimDeviceStatus, KubeletPodResourcesDynamicResources, KubeletPodResourcesGet).
DEFAULT_ON_FROM: Final[Mapping[str, int]] = {
    "DynamicResourceAllocation": 34,
    "DRAConsumableCapacity": 36,  # one device with allowMultipleAllocations per Instance
    "DRAExtendedResource": 36,  # a DeviceClass's extendedResourceName (KEP-5004)
    "DRADeviceTaints": 36,  # device taints: the offline grace's akri.sh/offline
    "DRAPartitionableDevices": 36,
    "DRADeviceBindingConditions": 36,
    "ResourceHealthStatus": 36,  # device health in Pod status (KEP-4680)
}


def has_feature(version: str, gate: str) -> bool:
    """Whether Kubernetes `version` (v1.34.4, 1.34) has `gate` on by default."""
    return minor_of(version) >= DEFAULT_ON_FROM[gate]


def missing_features(version: str, gates: Iterable[str]) -> list[str]:
    """The gates of `gates` that `version` lacks (off by default), in the order given."""
    return [g for g in gates if not has_feature(version, g)]


def lacks_reason(version: str, gates: Iterable[str]) -> str | None:
    """Why a test needing `gates` cannot run on `version` (None: it can), naming the release
    each gate arrives in and the one the cluster runs."""
    missing = missing_features(version, gates)
    if not missing:
        return None
    needs = ", ".join(f"{g} (on by default from 1.{DEFAULT_ON_FROM[g]})" for g in missing)
    return f"needs {needs}; the cluster runs Kubernetes {version}"
