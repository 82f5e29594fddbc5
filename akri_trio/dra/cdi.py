"""The CDI spec of one prepared claim: what the container runtime adds to its containers.

One spec file per claim, one CDI device per allocated device of ours, each carrying exactly what
device-plugin mode's Allocate gives for that Instance (`model.edits`): every broker property as
KEY and KEY_<HASH>, the discovered device's mounts and device nodes. The kubelet gets the CDI
device ids back from NodePrepareResources and passes them to the runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from akri_trio.model.edits import ContainerEdits
from akri_trio.model.resources import JSON

CDI_VERSION: Final = "0.6.0"
CDI_KIND: Final = "akri.sh/claim"


def cdi_device_name(claim_uid: str, index: int) -> str:
    """Device `index` (its place in the claim's allocation results) of a claim."""
    return f"{claim_uid}-{index}"


def cdi_device_id(claim_uid: str, index: int) -> str:
    """The fully qualified CDI device name the runtime resolves: `akri.sh/claim=<uid>-<i>`."""
    return f"{CDI_KIND}={cdi_device_name(claim_uid, index)}"


def spec_file_name(claim_uid: str) -> str:
    return f"akri.sh-claim-{claim_uid}.json"


def container_edits(edits: ContainerEdits) -> JSON:
    """CDI `containerEdits` for one device."""
    out: JSON = {}
    env = edits.env_dict()
    if env:
        out["env"] = [f"{k}={v}" for k, v in env.items()]
    if edits.device_specs:
        out["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in edits.device_specs
        ]
    if edits.mounts:
        out["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in edits.mounts
        ]
    return out


def cdi_spec(claim_uid: str, devices: Sequence[tuple[int, ContainerEdits]]) -> JSON:
    """The spec of one claim: `devices` are (result index, edits) of its devices of ours."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {"name": cdi_device_name(claim_uid, i), "containerEdits": container_edits(e)}
            for i, e in devices
        ],
    }
