# mypy: ignore-errors
import purerpc
from . import dra_v1_pb2 as dra_v1__pb2


class DRAPluginServicer(purerpc.Servicer):
    async def NodePrepareResources(self, input_message):
        raise NotImplementedError()

    async def NodeUnprepareResources(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        )
        service_obj.add_method(
            "NodePrepareResources",
            self.NodePrepareResources,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                dra_v1__pb2.NodePrepareResourcesRequest,
                dra_v1__pb2.NodePrepareResourcesResponse,
            )
        )
        service_obj.add_method(
            "NodeUnprepareResources",
            self.NodeUnprepareResources,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                dra_v1__pb2.NodeUnprepareResourcesRequest,
                dra_v1__pb2.NodeUnprepareResourcesResponse,
            )
        )
        return service_obj


class DRAPluginStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            channel
        )
        self.NodePrepareResources = self._client.get_method_stub(
            "NodePrepareResources",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                dra_v1__pb2.NodePrepareResourcesRequest,
                dra_v1__pb2.NodePrepareResourcesResponse,
            )
        )
        self.NodeUnprepareResources = self._client.get_method_stub(
            "NodeUnprepareResources",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                dra_v1__pb2.NodeUnprepareResourcesRequest,
                dra_v1__pb2.NodeUnprepareResourcesResponse,
            )
        )
