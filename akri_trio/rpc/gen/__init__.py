"""Generated from protos/ by `python -m akri_trio.rpc.generate`; do not edit.

Modules per proto: `<name>_pb2` (messages, protobuf), `<name>_grpc` (purerpc servicers and
stubs, used at runtime), `<name>_pb2_grpc` (grpcio; tests and benchmarks only).
"""
