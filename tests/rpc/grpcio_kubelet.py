"""A grpcio (C-core) stand-in for the kubelet's device-plugin Registration service.

Run as a separate process by the tests (`python grpcio_kubelet.py SOCKET`), so the purerpc
client under test talks to a real, independent gRPC implementation over a Unix socket, and so
the test process's fd table holds only the client's descriptors. Prints "ready", then one JSON
line per accepted RegisterRequest. Rejects resource name "akri.sh/bad" with INVALID_ARGUMENT,
as the kubelet rejects invalid names.
"""

from __future__ import annotations

import json
import sys
from concurrent import futures
from typing import Any

import grpc

from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2_grpc

dp_grpcio: Any = deviceplugin_v1beta1_pb2_grpc  # grpcio stubs are untyped


class Registration(dp_grpcio.RegistrationServicer):  # type: ignore[misc]
    def Register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
        if request.resource_name == "akri.sh/bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad resource name")
        record = {
            "version": request.version,
            "endpoint": request.endpoint,
            "resource_name": request.resource_name,
            "pre_start_required": request.options.pre_start_required,
            "get_preferred_allocation_available": (
                request.options.get_preferred_allocation_available
            ),
        }
        print(json.dumps(record), flush=True)
        return dp.Empty()


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dp_grpcio.add_RegistrationServicer_to_server(Registration(), server)
    server.add_insecure_port(f"unix://{sys.argv[1]}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
