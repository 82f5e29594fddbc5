# mypy: ignore-errors
import purerpc
from . import deviceplugin_v1beta1_pb2 as deviceplugin_v1beta1__pb2


class RegistrationServicer(purerpc.Servicer):
    async def Register(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "v1beta1.Registration"
        )
        service_obj.add_method(
            "Register",
            self.Register,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.RegisterRequest,
                deviceplugin_v1beta1__pb2.Empty,
            )
        )
        return service_obj


class RegistrationStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "v1beta1.Registration",
            channel
        )
        self.Register = self._client.get_method_stub(
            "Register",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.RegisterRequest,
                deviceplugin_v1beta1__pb2.Empty,
            )
        )


class DevicePluginServicer(purerpc.Servicer):
    async def GetDevicePluginOptions(self, input_message):
        raise NotImplementedError()

    async def ListAndWatch(self, input_message):
        raise NotImplementedError()

    async def GetPreferredAllocation(self, input_message):
        raise NotImplementedError()

    async def Allocate(self, input_message):
        raise NotImplementedError()

    async def PreStartContainer(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "v1beta1.DevicePlugin"
        )
        service_obj.add_method(
            "GetDevicePluginOptions",
            self.GetDevicePluginOptions,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.Empty,
                deviceplugin_v1beta1__pb2.DevicePluginOptions,
            )
        )
        service_obj.add_method(
            "ListAndWatch",
            self.ListAndWatch,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_STREAM,
                deviceplugin_v1beta1__pb2.Empty,
                deviceplugin_v1beta1__pb2.ListAndWatchResponse,
            )
        )
        service_obj.add_method(
            "GetPreferredAllocation",
            self.GetPreferredAllocation,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.PreferredAllocationRequest,
                deviceplugin_v1beta1__pb2.PreferredAllocationResponse,
            )
        )
        service_obj.add_method(
            "Allocate",
            self.Allocate,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.AllocateRequest,
                deviceplugin_v1beta1__pb2.AllocateResponse,
            )
        )
        service_obj.add_method(
            "PreStartContainer",
            self.PreStartContainer,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.PreStartContainerRequest,
                deviceplugin_v1beta1__pb2.PreStartContainerResponse,
            )
        )
        return service_obj


class DevicePluginStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "v1beta1.DevicePlugin",
            channel
        )
        self.GetDevicePluginOptions = self._client.get_method_stub(
            "GetDevicePluginOptions",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.Empty,
                deviceplugin_v1beta1__pb2.DevicePluginOptions,
            )
        )
        self.ListAndWatch = self._client.get_method_stub(
            "ListAndWatch",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_STREAM,
                deviceplugin_v1beta1__pb2.Empty,
                deviceplugin_v1beta1__pb2.ListAndWatchResponse,
            )
        )
        self.GetPreferredAllocation = self._client.get_method_stub(
            "GetPreferredAllocation",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.PreferredAllocationRequest,
                deviceplugin_v1beta1__pb2.PreferredAllocationResponse,
            )
        )
        self.Allocate = self._client.get_method_stub(
            "Allocate",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.AllocateRequest,
                deviceplugin_v1beta1__pb2.AllocateResponse,
            )
        )
        self.PreStartContainer = self._client.get_method_stub(
            "PreStartContainer",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                deviceplugin_v1beta1__pb2.PreStartContainerRequest,
                deviceplugin_v1beta1__pb2.PreStartContainerResponse,
            )
        )
