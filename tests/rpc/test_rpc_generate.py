"""The committed stubs match the protos, and the protos match the wire contracts we need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message_factory

from akri_trio.rpc import generate
from akri_trio.rpc.gen import deviceplugin_v1beta1_pb2 as dp
from akri_trio.rpc.gen import discovery_pb2 as disc
from akri_trio.rpc.gen import podresources_v1_pb2 as pr
from akri_trio_dev.cluster.layout import K8S_VERSION, Layout


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    fresh = {p.name: p.read_text() for p in written}
    committed = {
        p.name: p.read_text()
        for p in generate.GEN_DIR.iterdir()
        if p.is_file() and p.suffix in (".py", ".pyi")
    }
    names = fresh.keys() | committed.keys()
    stale = sorted(name for name in names if fresh.get(name) != committed.get(name))
    assert not stale, f"stale stubs {stale}: run `python -m akri_trio.rpc.generate`"


def test_generation_replaces_orphans(tmp_path: Path) -> None:
    (tmp_path / "dropped_pb2.py").write_text("# from a proto that no longer exists\n")
    (tmp_path / "notes.txt").write_text("not generated\n")
    generate.generate(tmp_path)
    assert not (tmp_path / "dropped_pb2.py").exists()
    assert (tmp_path / "notes.txt").exists()


def fields(message: descriptor.Descriptor) -> dict[str, int]:
    return {f.name: f.number for f in message.fields}


def test_discovery_proto_is_upstream_akri_v0() -> None:
    file = disc.DESCRIPTOR
    assert file.package == "v0"
    assert {s.full_name: [m.name for m in s.methods] for s in file.services_by_name.values()} == {
        "v0.Registration": ["RegisterDiscoveryHandler"],
        "v0.DiscoveryHandler": ["Discover"],
    }
    discover = file.services_by_name["DiscoveryHandler"].methods_by_name["Discover"]
    assert discover.server_streaming and not discover.client_streaming
    request = disc.RegisterDiscoveryHandlerRequest.DESCRIPTOR
    assert fields(request) == {"name": 1, "endpoint": 2, "endpoint_type": 3, "shared": 4}
    endpoint_type = request.enum_types_by_name["EndpointType"]
    assert {v.name: v.number for v in endpoint_type.values} == {"UDS": 0, "NETWORK": 1}
    assert disc.RegisterDiscoveryHandlerRequest.UDS == 0
    assert disc.RegisterDiscoveryHandlerRequest.NETWORK == 1
    assert fields(disc.ByteData.DESCRIPTOR) == {"vec": 1}
    assert disc.ByteData.DESCRIPTOR.fields_by_name["vec"].has_presence
    assert fields(disc.DiscoverRequest.DESCRIPTOR) == {
        "discovery_details": 1,
        "discovery_properties": 2,
    }
    # Upstream's field, and our extension (see test_problems_extension_is_upstream_compatible).
    assert fields(disc.DiscoverResponse.DESCRIPTOR) == {"devices": 1, "problems": 100}
    assert fields(disc.Device.DESCRIPTOR) == {
        "id": 1,
        "properties": 2,
        "mounts": 3,
        "device_specs": 4,
    }
    assert fields(disc.Mount.DESCRIPTOR) == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert fields(disc.DeviceSpec.DESCRIPTOR) == {
        "container_path": 1,
        "host_path": 2,
        "permissions": 3,
    }


def _upstream_discover_response() -> type[Any]:
    """DiscoverResponse as upstream's proto has it: our file without the `problems` field."""
    file = descriptor_pb2.FileDescriptorProto()
    disc.DESCRIPTOR.CopyToProto(file)
    file.name = "upstream_discovery.proto"
    response = next(m for m in file.message_type if m.name == "DiscoverResponse")
    kept = [f for f in response.field if f.name != "problems"]
    del response.field[:]
    response.field.extend(kept)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    made: type[Any] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("v0.DiscoverResponse")
    )
    return made


def test_problems_extension_is_upstream_compatible() -> None:
    upstream = _upstream_discover_response()
    ours = disc.DiscoverResponse(devices=[disc.Device(id="cam")], problems=["1 camera refused"])
    # An upstream agent reads our handler's message: the devices, the extension skipped.
    seen = upstream.FromString(ours.SerializeToString())
    assert [d.id for d in seen.devices] == ["cam"]
    # Our agent reads an upstream handler's message: the devices, and no problems.
    theirs = upstream()
    theirs.devices.add(id="cam")
    got = disc.DiscoverResponse.FromString(theirs.SerializeToString())
    assert [d.id for d in got.devices] == ["cam"] and list(got.problems) == []


def test_device_plugin_proto_is_kubelet_v1beta1() -> None:
    file = dp.DESCRIPTOR
    assert file.package == "v1beta1"
    assert [m.name for m in file.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert [m.name for m in file.services_by_name["Registration"].methods] == ["Register"]
    assert fields(dp.RegisterRequest.DESCRIPTOR) == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert fields(dp.Device.DESCRIPTOR) == {"ID": 1, "health": 2, "topology": 3}
    assert fields(dp.ContainerAllocateResponse.DESCRIPTOR) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert fields(dp.ContainerPreferredAllocationRequest.DESCRIPTOR) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }


@pytest.mark.parametrize(
    ("proto", "upstream"),
    [
        ("deviceplugin_v1beta1.proto", "deviceplugin/v1beta1/api.proto"),
        ("podresources_v1.proto", "podresources/v1/api.proto"),
        ("dra_v1.proto", "dra/v1/api.proto"),
        ("dra_v1beta1.proto", "dra/v1beta1/api.proto"),
        ("pluginregistration_v1.proto", "pluginregistration/v1/api.proto"),
    ],
)
def test_kubelet_protos_are_upstream_minus_regenerate_note(
    proto: str, upstream: str, cluster: dict[str, str]
) -> None:
    """Against the k8s.io/kubelet module the cluster build downloaded (`cluster` ensures it)."""
    minor = K8S_VERSION.removeprefix("v1.")
    source = Layout.default().go_cache / "mod" / f"k8s.io/kubelet@v0.{minor}/pkg/apis" / upstream
    assert source.exists(), f"{source} missing after the cluster build"

    def body(text: str) -> list[str]:
        lines = (line.rstrip() for line in text.splitlines())
        return [
            line
            for line in lines
            if line and not line.startswith("//")  # comments: our header differs, fields must not
        ]

    ours = (generate.PROTO_DIR / proto).read_text()
    theirs = source.read_text()
    assert body(ours) == body(theirs)


def test_podresources_proto_is_kubelet_v1() -> None:
    assert pr.DESCRIPTOR.package == "v1"
    assert [m.name for m in pr.DESCRIPTOR.services_by_name["PodResourcesLister"].methods] == [
        "List",
        "GetAllocatableResources",
        "Get",
    ]
    assert fields(pr.ContainerDevices.DESCRIPTOR) == {
        "resource_name": 1,
        "device_ids": 2,
        "topology": 3,
    }
