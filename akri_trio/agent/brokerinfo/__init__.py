"""brokerInfo (seed 001): brokers report back to their Instance through files.

The agent gives each workload a directory (`--broker-info-dir`), mounts it into the broker's
container at Allocate, and copies every file in it into the Instance's `spec.brokerInfo` under
the key `<node>/<file name>`. The rules are in `_rules` (pure), the file system in `_disk`, the
Allocate (and Prepare) hook in `_mount`, the copy loop in `_sync`.
"""

from akri_trio.agent.brokerinfo._mount import CONTAINER_ROOT, ENV_VAR, WorkloadDirs, WorkloadMount
from akri_trio.agent.brokerinfo._rules import (
    FileRead,
    Limits,
    Selection,
    WorkloadDir,
    entry_key,
    field_manager,
    merge,
    node_entries,
    plan_dirs,
    select,
)
from akri_trio.agent.brokerinfo._sync import DEFAULT_PERIOD_S, BrokerInfo, WorkloadReports

__all__ = [
    "CONTAINER_ROOT",
    "DEFAULT_PERIOD_S",
    "ENV_VAR",
    "BrokerInfo",
    "FileRead",
    "Limits",
    "Selection",
    "WorkloadDir",
    "WorkloadDirs",
    "WorkloadMount",
    "WorkloadReports",
    "entry_key",
    "field_manager",
    "merge",
    "node_entries",
    "plan_dirs",
    "select",
]
