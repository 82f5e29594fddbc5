# mypy: ignore-errors
import purerpc
from . import discovery_pb2 as discovery__pb2


class RegistrationServicer(purerpc.Servicer):
    async def RegisterDiscoveryHandler(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "v0.Registration"
        )
        service_obj.add_method(
            "RegisterDiscoveryHandler",
            self.RegisterDiscoveryHandler,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                discovery__pb2.RegisterDiscoveryHandlerRequest,
                discovery__pb2.Empty,
            )
        )
        return service_obj


class RegistrationStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "v0.Registration",
            channel
        )
        self.RegisterDiscoveryHandler = self._client.get_method_stub(
            "RegisterDiscoveryHandler",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                discovery__pb2.RegisterDiscoveryHandlerRequest,
                discovery__pb2.Empty,
            )
        )


class DiscoveryHandlerServicer(purerpc.Servicer):
    async def Discover(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "v0.DiscoveryHandler"
        )
        service_obj.add_method(
            "Discover",
            self.Discover,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_STREAM,
                discovery__pb2.DiscoverRequest,
                discovery__pb2.DiscoverResponse,
            )
        )
        return service_obj


class DiscoveryHandlerStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "v0.DiscoveryHandler",
            channel
        )
        self.Discover = self._client.get_method_stub(
            "Discover",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_STREAM,
                discovery__pb2.DiscoverRequest,
                discovery__pb2.DiscoverResponse,
            )
        )
