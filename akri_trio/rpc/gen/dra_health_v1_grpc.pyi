# mypy: ignore-errors
# Typed stub for the purerpc module generated from dra_health_v1.proto; written by
# akri_trio.rpc.generate (purerpc's own plugin emits no types). Do not edit.
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any

import purerpc

from . import dra_health_v1_pb2 as dra_health_v1__pb2

Metadata = Sequence[tuple[str, str | bytes]]


class DRAResourceHealthServicer(purerpc.Servicer):
    def NodeWatchResources(self, input_message: dra_health_v1__pb2.NodeWatchResourcesRequest) -> AsyncIterator[dra_health_v1__pb2.NodeWatchResourcesResponse]: ...
    @property
    def service(self) -> purerpc.Service: ...


class DRAResourceHealthStub:
    # Calls go to /v1.DRAResourceHealth/<Method>.
    def __init__(self, channel: Any) -> None: ...
    def NodeWatchResources(self, message: dra_health_v1__pb2.NodeWatchResourcesRequest, *, metadata: Metadata | None = None) -> AsyncIterator[dra_health_v1__pb2.NodeWatchResourcesResponse]: ...
