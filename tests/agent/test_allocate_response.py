"""What a container gets from Allocate: every broker property twice (KEY, KEY_<HASH>), the
handler's mounts and device nodes — for one Instance or several (configuration level)."""

from __future__ import annotations

from akri_trio.address import ObjectKey
from akri_trio.agent.plugins.service import container_response
from akri_trio.agent.view import NodeView
from akri_trio.model.device import Device, DeviceSpec, Mount


def _instance(view: NodeView, name: str, digest: str, props: dict[str, str]) -> None:
    view.put_instance(
        {
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
            "spec": {
                "configurationName": "cam",
                "cdiName": f"akri.sh/cam={digest}",
                "capacity": 1,
                "brokerProperties": props,
            },
        }
    )


def test_env_mounts_and_device_nodes_of_one_instance() -> None:
    view = NodeView("n")
    _instance(view, "cam-abc123", "abc123", {"UDEV_DEVNODE": "/dev/video0", "RES": "640"})
    device = Device(
        "/devices/x",
        mounts=(Mount("/data", "/srv/data", read_only=True),),
        device_specs=(DeviceSpec("/dev/video0", "", "rw"),),
    )
    view.set_devices(ObjectKey("ns", "cam"), {ObjectKey("ns", "cam-abc123"): device})
    inst = view.instance(ObjectKey("ns", "cam-abc123"))
    assert inst is not None
    response = container_response([inst], view)
    assert dict(response.envs) == {
        "UDEV_DEVNODE": "/dev/video0",
        "UDEV_DEVNODE_ABC123": "/dev/video0",
        "RES": "640",
        "RES_ABC123": "640",
    }
    (mount,) = response.mounts
    assert (mount.container_path, mount.host_path, mount.read_only) == ("/data", "/srv/data", True)
    (node,) = response.devices
    # An empty host path means "the same as in the container", as upstream.
    assert (node.container_path, node.host_path, node.permissions) == (
        "/dev/video0",
        "/dev/video0",
        "rw",
    )


def test_two_instances_keep_their_hashed_names_apart() -> None:
    view = NodeView("n")
    _instance(view, "cam-aaaaaa", "aaaaaa", {"D": "zero"})
    _instance(view, "cam-bbbbbb", "bbbbbb", {"D": "one"})
    insts = [
        view.instance(ObjectKey("ns", "cam-aaaaaa")),
        view.instance(ObjectKey("ns", "cam-bbbbbb")),
    ]
    response = container_response([i for i in insts if i is not None], view)
    assert response.envs["D_AAAAAA"] == "zero" and response.envs["D_BBBBBB"] == "one"
    assert response.envs["D"] in ("zero", "one")  # the plain name is ambiguous: use the hashed
