"""A claim's CDI spec gives a container what device-plugin mode's Allocate gives it."""

from __future__ import annotations

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.service import container_response
from akri_trio.agent.view import NodeView
from akri_trio.dra import cdi_device_id, cdi_spec, spec_file_name
from akri_trio.model.convert import unstructure
from akri_trio.model.device import Device, DeviceSpec, Mount
from akri_trio.model.edits import instance_edits
from tests.dra.support import instance

UID = "0f3c9a4e-0000-4000-8000-000000000001"


def test_spec_carries_the_allocate_responses_env_mounts_and_device_nodes() -> None:
    inst = instance(properties={"UDEV_DEVNODE": "/dev/video0", "RES": "640"})
    device = Device(
        "/devices/x",
        mounts=(Mount("/data", "/srv/data", read_only=True),),
        device_specs=(DeviceSpec("/dev/video0", "", "rw"),),
    )
    view = NodeView("n1")
    view.put_instance({**unstructure(inst), "metadata": {"name": "cam-abc123", "namespace": "ns"}})
    view.set_devices(ObjectKey("ns", "cam"), {ObjectKey("ns", "cam-abc123"): device})
    allocate = container_response([inst], view)

    spec = cdi_spec(UID, [(0, instance_edits(inst, device))])
    assert spec["kind"] == "akri.sh/claim" and spec["cdiVersion"] == "0.6.0"
    (cdi,) = spec["devices"]
    assert f"akri.sh/claim={cdi['name']}" == cdi_device_id(UID, 0)
    edits = cdi["containerEdits"]
    assert dict(e.split("=", 1) for e in edits["env"]) == dict(allocate.envs)
    assert [(n["path"], n["hostPath"], n["permissions"]) for n in edits["deviceNodes"]] == [
        (d.container_path, d.host_path, d.permissions) for d in allocate.devices
    ]
    (mount,) = edits["mounts"]
    assert (mount["containerPath"], mount["hostPath"]) == ("/data", "/srv/data")
    assert "ro" in mount["options"] and allocate.mounts[0].read_only


def test_one_cdi_device_per_result_named_by_its_index() -> None:
    a = instance("cam-aaaaaa", properties={"D": "zero"})
    b = instance("cam-bbbbbb", properties={"D": "one"})
    spec = cdi_spec(UID, [(0, instance_edits(a, None)), (2, instance_edits(b, None))])
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-0", f"{UID}-2"]
    assert spec["devices"][1]["containerEdits"] == {"env": ["D=one", "D_BBBBBB=one"]}
    assert spec_file_name(UID) == f"akri.sh-claim-{UID}.json"
