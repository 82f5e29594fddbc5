# mypy: ignore-errors
# Typed stub for the purerpc module generated from pluginregistration_v1.proto; written by
# akri_trio.rpc.generate (purerpc's own plugin emits no types). Do not edit.
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any

import purerpc

from . import pluginregistration_v1_pb2 as pluginregistration_v1__pb2

Metadata = Sequence[tuple[str, str | bytes]]


class RegistrationServicer(purerpc.Servicer):
    async def GetInfo(self, input_message: pluginregistration_v1__pb2.InfoRequest) -> pluginregistration_v1__pb2.PluginInfo: ...
    async def NotifyRegistrationStatus(self, input_message: pluginregistration_v1__pb2.RegistrationStatus) -> pluginregistration_v1__pb2.RegistrationStatusResponse: ...
    @property
    def service(self) -> purerpc.Service: ...


class RegistrationStub:
    # Calls go to /pluginregistration.Registration/<Method>.
    def __init__(self, channel: Any) -> None: ...
    async def GetInfo(self, message: pluginregistration_v1__pb2.InfoRequest, *, metadata: Metadata | None = None) -> pluginregistration_v1__pb2.PluginInfo: ...
    async def NotifyRegistrationStatus(self, message: pluginregistration_v1__pb2.RegistrationStatus, *, metadata: Metadata | None = None) -> pluginregistration_v1__pb2.RegistrationStatusResponse: ...
