"""brokerInfo's Allocate (or Prepare) hook: a directory per workload, and its mount.

`WorkloadDirs` is what the device plugins' Allocate and the DRA kubelet plugin's Prepare need of
brokerInfo, and nothing more: the root directory and the Configuration generations. It is its
own object because the copy loop (`_sync.BrokerInfo`) reads, in DRA mode, the claims the DRA
node prepared, while the DRA node mounts the copy loop's directories: the agent builds this
first, gives it to the plugin manager or the DRA node, and then builds the copy loop with it
and the DRA node's `held` and `report`, each part wired through its constructor.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import _disk, _rules
from akri_trio.agent.view import config_key
from akri_trio.model.resources import Instance

log = logging.getLogger(__name__)

CONTAINER_ROOT = "/akri/broker-info"
ENV_VAR = "AKRI_BROKER_INFO"


@attrs.frozen
class WorkloadMount:
    container_path: str
    host_path: str
    envs: Mapping[str, str]


@attrs.frozen
class WorkloadDirs:
    """The workload directories under `root` (the agent's `--broker-info-dir`).
    `generation(config key)`: that Configuration's metadata.generation (None: gone)."""

    root: Path
    generation: Callable[[ObjectKey], int | None]

    def mount(self, inst: Instance, slots: Sequence[str]) -> WorkloadMount | None:
        """The directory of a workload that was just given `slots` of `inst` (the claim holds).
        None when it cannot be made: the broker then runs without one (logged)."""
        if not slots:
            return None
        key = inst.metadata.key
        generation = self.generation(config_key(inst)) or 0
        workload = _rules.WorkloadDir(min(slots), generation, secrets.token_hex(4))
        try:
            path = _disk.make_workload_dir(self.root, key, workload)
        except OSError as exc:
            log.warning("no brokerInfo directory for %s (%s): %s", key, workload.name, exc)
            return None
        container_path = f"{CONTAINER_ROOT}/{inst.metadata.name}"
        digest = inst.spec.cdi_name.rpartition("=")[2]
        envs = {ENV_VAR: container_path, f"{ENV_VAR}_{digest.upper()}": container_path}
        return WorkloadMount(container_path, str(path), envs)
