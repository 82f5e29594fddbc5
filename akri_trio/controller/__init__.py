"""The controller: broker Pods, Jobs and Services for Instances, and cleanup after lost nodes.

This package holds the pure decisions (no I/O): what to make (brokers, services), when
(lifecycle), what to undo when a node is lost (nodeloss) and who leads (lease). The edges that
watch and write (run, reconcilers, leader, cli) import these names from here; nothing here
imports them, so `import akri_trio.controller` stays free of I/O.
"""

from akri_trio.controller.brokers import (
    PLACEHOLDER,
    akri_labels,
    broker_job,
    broker_pod,
    broker_pods,
    configuration_selector,
    instance_selector,
    owner_reference,
    pin_to_node,
    rename_placeholder,
)
from akri_trio.controller.lifecycle import (
    PENDING_TIMEOUT_S,
    STABLE_AFTER_S,
    Delay,
    JobPlan,
    PodPlan,
    Retry,
    plan_job,
    plan_pods,
)
from akri_trio.controller.names import (
    broker_job_name,
    broker_pod_name,
    configuration_service_name,
    instance_service_name,
    label_value,
)
from akri_trio.controller.nodeloss import (
    InstanceRelease,
    NodeLossPlan,
    NodeState,
    StatusRelease,
    Transition,
    left_without_nodes,
    node_ready,
    node_transition,
    plan_node_loss,
    ready_changed_at,
    release_instance,
    release_status,
    served_nodes,
    shared_claim_holders,
)
from akri_trio.controller.observed import Delete, ObservedPod, timestamp
from akri_trio.controller.services import (
    ServicePlan,
    configuration_of,
    configuration_service,
    fingerprinted,
    instance_service,
    plan_services,
    up_to_date,
)

__all__ = [
    "PENDING_TIMEOUT_S",
    "PLACEHOLDER",
    "STABLE_AFTER_S",
    "Delay",
    "Delete",
    "InstanceRelease",
    "JobPlan",
    "NodeLossPlan",
    "NodeState",
    "ObservedPod",
    "PodPlan",
    "Retry",
    "ServicePlan",
    "StatusRelease",
    "Transition",
    "akri_labels",
    "broker_job",
    "broker_job_name",
    "broker_pod",
    "broker_pod_name",
    "broker_pods",
    "configuration_of",
    "configuration_selector",
    "configuration_service",
    "configuration_service_name",
    "fingerprinted",
    "instance_selector",
    "instance_service",
    "instance_service_name",
    "label_value",
    "left_without_nodes",
    "node_ready",
    "node_transition",
    "owner_reference",
    "pin_to_node",
    "plan_job",
    "plan_node_loss",
    "plan_pods",
    "plan_services",
    "ready_changed_at",
    "release_instance",
    "release_status",
    "rename_placeholder",
    "served_nodes",
    "shared_claim_holders",
    "timestamp",
    "up_to_date",
]
