# mypy: ignore-errors
# Typed stub for the purerpc module generated from dra_v1.proto; written by
# akri_trio.rpc.generate (purerpc's own plugin emits no types). Do not edit.
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any

import purerpc

from . import dra_v1_pb2 as dra_v1__pb2

Metadata = Sequence[tuple[str, str | bytes]]


class DRAPluginServicer(purerpc.Servicer):
    async def NodePrepareResources(self, input_message: dra_v1__pb2.NodePrepareResourcesRequest) -> dra_v1__pb2.NodePrepareResourcesResponse: ...
    async def NodeUnprepareResources(self, input_message: dra_v1__pb2.NodeUnprepareResourcesRequest) -> dra_v1__pb2.NodeUnprepareResourcesResponse: ...
    @property
    def service(self) -> purerpc.Service: ...


class DRAPluginStub:
    # Calls go to /k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/<Method>.
    def __init__(self, channel: Any) -> None: ...
    async def NodePrepareResources(self, message: dra_v1__pb2.NodePrepareResourcesRequest, *, metadata: Metadata | None = None) -> dra_v1__pb2.NodePrepareResourcesResponse: ...
    async def NodeUnprepareResources(self, message: dra_v1__pb2.NodeUnprepareResourcesRequest, *, metadata: Metadata | None = None) -> dra_v1__pb2.NodeUnprepareResourcesResponse: ...
