# mypy: ignore-errors
import purerpc
from . import dra_health_v1alpha1_pb2 as dra_health_v1alpha1__pb2


class DRAResourceHealthServicer(purerpc.Servicer):
    async def NodeWatchResources(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "v1alpha1.DRAResourceHealth"
        )
        service_obj.add_method(
            "NodeWatchResources",
            self.NodeWatchResources,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_STREAM,
                dra_health_v1alpha1__pb2.NodeWatchResourcesRequest,
                dra_health_v1alpha1__pb2.NodeWatchResourcesResponse,
            )
        )
        return service_obj


class DRAResourceHealthStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "v1alpha1.DRAResourceHealth",
            channel
        )
        self.NodeWatchResources = self._client.get_method_stub(
            "NodeWatchResources",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_STREAM,
                dra_health_v1alpha1__pb2.NodeWatchResourcesRequest,
                dra_health_v1alpha1__pb2.NodeWatchResourcesResponse,
            )
        )
