# mypy: ignore-errors
import purerpc
from . import pluginregistration_v1_pb2 as pluginregistration_v1__pb2


class RegistrationServicer(purerpc.Servicer):
    async def GetInfo(self, input_message):
        raise NotImplementedError()

    async def NotifyRegistrationStatus(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "pluginregistration.Registration"
        )
        service_obj.add_method(
            "GetInfo",
            self.GetInfo,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                pluginregistration_v1__pb2.InfoRequest,
                pluginregistration_v1__pb2.PluginInfo,
            )
        )
        service_obj.add_method(
            "NotifyRegistrationStatus",
            self.NotifyRegistrationStatus,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                pluginregistration_v1__pb2.RegistrationStatus,
                pluginregistration_v1__pb2.RegistrationStatusResponse,
            )
        )
        return service_obj


class RegistrationStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "pluginregistration.Registration",
            channel
        )
        self.GetInfo = self._client.get_method_stub(
            "GetInfo",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                pluginregistration_v1__pb2.InfoRequest,
                pluginregistration_v1__pb2.PluginInfo,
            )
        )
        self.NotifyRegistrationStatus = self._client.get_method_stub(
            "NotifyRegistrationStatus",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                pluginregistration_v1__pb2.RegistrationStatus,
                pluginregistration_v1__pb2.RegistrationStatusResponse,
            )
        )
