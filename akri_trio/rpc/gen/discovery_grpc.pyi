# mypy: ignore-errors
# Typed stub for the purerpc module generated from discovery.proto; written by
# akri_trio.rpc.generate (purerpc's own plugin emits no types). Do not edit.
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any

import purerpc

from . import discovery_pb2 as discovery__pb2

Metadata = Sequence[tuple[str, str | bytes]]


class RegistrationServicer(purerpc.Servicer):
    async def RegisterDiscoveryHandler(self, input_message: discovery__pb2.RegisterDiscoveryHandlerRequest) -> discovery__pb2.Empty: ...
    @property
    def service(self) -> purerpc.Service: ...


class RegistrationStub:
    # Calls go to /v0.Registration/<Method>.
    def __init__(self, channel: Any) -> None: ...
    async def RegisterDiscoveryHandler(self, message: discovery__pb2.RegisterDiscoveryHandlerRequest, *, metadata: Metadata | None = None) -> discovery__pb2.Empty: ...


class DiscoveryHandlerServicer(purerpc.Servicer):
    def Discover(self, input_message: discovery__pb2.DiscoverRequest) -> AsyncIterator[discovery__pb2.DiscoverResponse]: ...
    @property
    def service(self) -> purerpc.Service: ...


class DiscoveryHandlerStub:
    # Calls go to /v0.DiscoveryHandler/<Method>.
    def __init__(self, channel: Any) -> None: ...
    def Discover(self, message: discovery__pb2.DiscoverRequest, *, metadata: Metadata | None = None) -> AsyncIterator[discovery__pb2.DiscoverResponse]: ...
