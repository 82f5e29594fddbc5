# mypy: ignore-errors
import purerpc
from . import podresources_v1_pb2 as podresources_v1__pb2


class PodResourcesListerServicer(purerpc.Servicer):
    async def List(self, input_message):
        raise NotImplementedError()

    async def GetAllocatableResources(self, input_message):
        raise NotImplementedError()

    async def Get(self, input_message):
        raise NotImplementedError()

    @property
    def service(self) -> purerpc.Service:
        service_obj = purerpc.Service(
            "v1.PodResourcesLister"
        )
        service_obj.add_method(
            "List",
            self.List,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                podresources_v1__pb2.ListPodResourcesRequest,
                podresources_v1__pb2.ListPodResourcesResponse,
            )
        )
        service_obj.add_method(
            "GetAllocatableResources",
            self.GetAllocatableResources,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                podresources_v1__pb2.AllocatableResourcesRequest,
                podresources_v1__pb2.AllocatableResourcesResponse,
            )
        )
        service_obj.add_method(
            "Get",
            self.Get,
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                podresources_v1__pb2.GetPodResourcesRequest,
                podresources_v1__pb2.GetPodResourcesResponse,
            )
        )
        return service_obj


class PodResourcesListerStub:
    def __init__(self, channel):
        self._client = purerpc.Client(
            "v1.PodResourcesLister",
            channel
        )
        self.List = self._client.get_method_stub(
            "List",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                podresources_v1__pb2.ListPodResourcesRequest,
                podresources_v1__pb2.ListPodResourcesResponse,
            )
        )
        self.GetAllocatableResources = self._client.get_method_stub(
            "GetAllocatableResources",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                podresources_v1__pb2.AllocatableResourcesRequest,
                podresources_v1__pb2.AllocatableResourcesResponse,
            )
        )
        self.Get = self._client.get_method_stub(
            "Get",
            purerpc.RPCSignature(
                purerpc.Cardinality.UNARY_UNARY,
                podresources_v1__pb2.GetPodResourcesRequest,
                podresources_v1__pb2.GetPodResourcesResponse,
            )
        )
