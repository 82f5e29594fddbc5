# mypy: ignore-errors
import purerpc
from . import podresources_v1_pb2 as podresources_v1__pb2


class PodResourcesListerServicer(purerpc.Servicer):
    async def List(self, input_message):
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
