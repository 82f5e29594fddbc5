"""The controller's settings: what `akri-trio controller`'s flags (controller/cli.py) decide."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

import attrs

from akri_trio.controller.reconcilers import NODE_LOST_GRACE_S
from akri_trio.runtime.http import DEFAULT_MAX_CONNECTIONS

__all__ = ["ControllerSettings", "default_identity"]


def default_identity() -> str:
    """Unique per process: the Pod's name (or host) and a random suffix, as client-go does."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


@attrs.frozen
class ControllerSettings:
    kubeconfig: Path | None = None
    namespace: str | None = None  # watch this namespace only (Nodes are cluster-wide)
    metrics_port: int | None = 8080
    metrics_host: str = "0.0.0.0"
    metrics_max_connections: int = DEFAULT_MAX_CONNECTIONS
    leader_elect: bool = True
    lease_name: str = "akri-controller"
    lease_namespace: str = "akri"
    identity: str = attrs.field(factory=default_identity)
    workers: int = 8
    allocation: str = "device-plugin"  # or "dra"
    node_lost_grace: float = NODE_LOST_GRACE_S  # a NotReady node at start: seconds before cleanup
