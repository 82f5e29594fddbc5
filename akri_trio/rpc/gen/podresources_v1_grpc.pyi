# mypy: ignore-errors
# Typed stub for the purerpc module generated from podresources_v1.proto; written by
# akri_trio.rpc.generate (purerpc's own plugin emits no types). Do not edit.
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any

import purerpc

from . import podresources_v1_pb2 as podresources_v1__pb2

Metadata = Sequence[tuple[str, str | bytes]]


class PodResourcesListerServicer(purerpc.Servicer):
    async def List(self, input_message: podresources_v1__pb2.ListPodResourcesRequest) -> podresources_v1__pb2.ListPodResourcesResponse: ...
    async def GetAllocatableResources(self, input_message: podresources_v1__pb2.AllocatableResourcesRequest) -> podresources_v1__pb2.AllocatableResourcesResponse: ...
    async def Get(self, input_message: podresources_v1__pb2.GetPodResourcesRequest) -> podresources_v1__pb2.GetPodResourcesResponse: ...
    @property
    def service(self) -> purerpc.Service: ...


class PodResourcesListerStub:
    # Calls go to /v1.PodResourcesLister/<Method>.
    def __init__(self, channel: Any) -> None: ...
    async def List(self, message: podresources_v1__pb2.ListPodResourcesRequest, *, metadata: Metadata | None = None) -> podresources_v1__pb2.ListPodResourcesResponse: ...
    async def GetAllocatableResources(self, message: podresources_v1__pb2.AllocatableResourcesRequest, *, metadata: Metadata | None = None) -> podresources_v1__pb2.AllocatableResourcesResponse: ...
    async def Get(self, message: podresources_v1__pb2.GetPodResourcesRequest, *, metadata: Metadata | None = None) -> podresources_v1__pb2.GetPodResourcesResponse: ...
