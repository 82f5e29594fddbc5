"""Regenerate the protobuf / purerpc / grpcio stubs in `akri_trio/rpc/gen/` from `protos/`.

Why this module exists rather than a one-line protoc call in the justfile:

* purerpc 0.8.0's protoc plugin does not declare proto3 `optional` support, so protoc refuses
  upstream Akri's `discovery.proto` (`ByteData.vec` is `optional bytes`). We run purerpc's own
  code generator behind a small plugin shim that declares the feature (it only emits service
  code; field presence never reaches it).
* purerpc's stubs are untyped; the shim also writes a `*_grpc.pyi` next to each, so code using
  the servicers and client stubs is checked by `mypy --strict`.
* protoc emits absolute imports (`import discovery_pb2`); the stubs live in a package, so the
  imports are rewritten to package-relative ones.
* mypy reports errors in modules it follows even when `exclude` skips them, and generated code
  is not strict-clean (messages subclass protobuf's untyped `Message`). Each generated file gets
  a `# mypy: ignore-errors` first line: its types are still used, its own errors are not ours.
* A test regenerates into a temporary directory and compares with the committed stubs, which
  needs generation into an arbitrary directory (`generate(out_dir)`).

grpcio-tools is a dev dependency and is imported only when generating. The grpcio stubs
(`*_pb2_grpc.py`) are for tests and benchmarks (grpcio plays the kubelet); runtime code imports
only the `*_pb2` and purerpc `*_grpc` modules.

Run: `python -m akri_trio.rpc.generate [--out DIR]`.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
GEN_DIR = PACKAGE_DIR / "gen"
PROTO_DIR = PACKAGE_DIR.parent.parent / "protos"
PROTOS = (
    "discovery.proto",
    "deviceplugin_v1beta1.proto",
    "podresources_v1.proto",
    "dra_v1.proto",
    "dra_v1beta1.proto",
    "dra_health_v1.proto",
    "dra_health_v1alpha1.proto",
    "pluginregistration_v1.proto",
)

# Every file name the generator may produce; anything else in the output dir is left alone.
_GENERATED = re.compile(r"^(__init__\.py|\w+_pb2\.pyi?|\w+_pb2_grpc\.py|\w+_grpc\.pyi?)$")
_ABSOLUTE_PB2_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)
_MYPY_HEADER = "# mypy: ignore-errors\n"

INIT_TEXT = '''"""Generated from protos/ by `python -m akri_trio.rpc.generate`; do not edit.

Modules per proto: `<name>_pb2` (messages, protobuf), `<name>_grpc` (purerpc servicers and
stubs, used at runtime), `<name>_pb2_grpc` (grpcio; tests and benchmarks only).
"""
'''

_PLUGIN_SCRIPT = """#!{python}
import sys
sys.path.insert(0, {root!r})
from akri_trio.rpc.generate import run_purerpc_plugin
run_purerpc_plugin()
"""


class GenerationError(RuntimeError):
    """protoc failed; the message carries its exit code."""


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Generate all stubs into `out_dir` (created if needed); return the files written, sorted.

    Earlier generated files in `out_dir` are removed first, so a dropped proto leaves no orphans.
    """
    from grpc_tools import protoc  # dev dependency: imported only when generating

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():
        if old.is_file() and _GENERATED.match(old.name):
            old.unlink()

    with tempfile.TemporaryDirectory(prefix="akri-trio-protoc-") as tmp:
        plugin = Path(tmp) / "protoc-gen-purerpc"
        plugin.write_text(
            _PLUGIN_SCRIPT.format(python=sys.executable, root=str(PACKAGE_DIR.parent.parent))
        )
        plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
        # grpc_tools ships the well-known types (google/protobuf/*.proto) next to its module.
        well_known = Path(protoc.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{well_known}",
            f"--plugin=protoc-gen-purerpc={plugin}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--purerpc_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *PROTOS,
        ]
        code = protoc.main(args)
        if code != 0:
            raise GenerationError(f"protoc exited with {code}")

    (out_dir / "__init__.py").write_text(INIT_TEXT)
    written = sorted(p for p in out_dir.iterdir() if p.is_file() and _GENERATED.match(p.name))
    for path in written:
        text = path.read_text()
        fixed = _ABSOLUTE_PB2_IMPORT.sub(r"from . import \1 as \2", text)
        if path.name != "__init__.py":
            fixed = _MYPY_HEADER + fixed
        path.write_text(fixed)
    return written


# ---- the purerpc plugin shim (runs inside protoc's child process) ----------------------------

_STREAM_TYPES = "from collections.abc import AsyncIterable, AsyncIterator, Sequence"


def _module_of(proto_name: str) -> str:
    return proto_name.removesuffix(".proto").replace("-", "_").replace("/", ".") + "_pb2"


def _alias_of(proto_name: str) -> str:
    # Same alias scheme as purerpc's generated .py, so the .pyi reads like its implementation.
    return proto_name.removesuffix(".proto").replace("/", "_dot_").replace("-", "_") + "__pb2"


def purerpc_pyi(file: object, proto_for_type: dict[str, str]) -> str:
    """A typed stub for the purerpc module that purerpc's plugin generates for `file`.

    `file` is a `FileDescriptorProto`; `proto_for_type` maps a fully qualified message name
    (".pkg.Msg") to the proto file that defines it.
    """
    from google.protobuf import descriptor_pb2

    assert isinstance(file, descriptor_pb2.FileDescriptorProto)
    used: set[str] = set()

    def py_type(type_name: str) -> str:
        proto = proto_for_type[type_name]
        used.add(proto)
        return f"{_alias_of(proto)}.{type_name.rsplit('.', 1)[-1]}"

    body: list[str] = []
    prefix = f"{file.package}." if file.package else ""
    for service in file.service:
        body += ["", "", f"class {service.name}Servicer(purerpc.Servicer):"]
        for m in service.method:
            req, resp = py_type(m.input_type), py_type(m.output_type)
            arg = (
                f"input_messages: AsyncIterator[{req}]"
                if m.client_streaming
                else (f"input_message: {req}")
            )
            if m.server_streaming:
                body.append(f"    def {m.name}(self, {arg}) -> AsyncIterator[{resp}]: ...")
            else:
                body.append(f"    async def {m.name}(self, {arg}) -> {resp}: ...")
        body += ["    @property", "    def service(self) -> purerpc.Service: ..."]
        body += ["", "", f"class {service.name}Stub:"]
        body.append(f"    # Calls go to /{prefix}{service.name}/<Method>.")
        body.append("    def __init__(self, channel: Any) -> None: ...")
        for m in service.method:
            req, resp = py_type(m.input_type), py_type(m.output_type)
            arg = (
                f"message_aiter: AsyncIterable[{req}]"
                if m.client_streaming
                else (f"message: {req}")
            )
            kw = "*, metadata: Metadata | None = None"
            if m.server_streaming:
                body.append(f"    def {m.name}(self, {arg}, {kw}) -> AsyncIterator[{resp}]: ...")
            else:
                body.append(f"    async def {m.name}(self, {arg}, {kw}) -> {resp}: ...")

    head = [
        f"# Typed stub for the purerpc module generated from {file.name}; written by",
        "# akri_trio.rpc.generate (purerpc's own plugin emits no types). Do not edit.",
        _STREAM_TYPES,
        "from typing import Any",
        "",
        "import purerpc",
        "",
    ]
    head += [f"from . import {_module_of(p)} as {_alias_of(p)}" for p in sorted(used)]
    head += ["", "Metadata = Sequence[tuple[str, str | bytes]]"]
    return "\n".join(head + body) + "\n"


def run_purerpc_plugin() -> None:
    """protoc plugin entry point: purerpc's generator plus proto3-optional support and .pyi."""
    from google.protobuf.compiler import plugin_pb2
    from purerpc.protoc_plugin.plugin import generate_single_proto

    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse()
    response.supported_features = plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL

    proto_for_type: dict[str, str] = {}
    for proto in request.proto_file:
        prefix = f".{proto.package}." if proto.package else "."
        for message in proto.message_type:
            proto_for_type[prefix + message.name] = proto.name

    wanted = set(request.file_to_generate)
    for proto in request.proto_file:
        if proto.name not in wanted or not proto.service:
            continue
        stem = proto.name.replace("-", "_").removesuffix(".proto")
        out = response.file.add()
        out.name = f"{stem}_grpc.py"
        out.content = generate_single_proto(proto, proto_for_type) + "\n"
        pyi = response.file.add()
        pyi.name = f"{stem}_grpc.pyi"
        pyi.content = purerpc_pyi(proto, proto_for_type)
    sys.stdout.buffer.write(response.SerializeToString())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m akri_trio.rpc.generate", description=__doc__)
    parser.add_argument("--out", type=Path, default=GEN_DIR, help="output directory")
    parser.add_argument("--protos", type=Path, default=PROTO_DIR, help="directory of .proto files")
    args = parser.parse_args(argv)
    for path in generate(args.out, args.protos):
        print(os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
