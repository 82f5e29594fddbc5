"""Offline container images: OCI image-layout tarballs written in Python.

The node must run pods without a registry, so `up --node` makes two images from Debian's static
busybox and imports them with `ctr images import`: the sandbox image containerd insists on
(``registry.k8s.io/pause:3.6``) and the busybox image tests run with `command:`
(``docker.io/library/busybox:latest``). One layer: /bin/busybox plus a symlink per applet.

Pure: bytes in, bytes out. Every tar member has mtime 0 and uid/gid 0, so the same busybox gives
the same digests and a re-import is a no-op.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Sequence
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if data is None:
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def busybox_layer(busybox: bytes, applets: Iterable[str]) -> bytes:
    """An uncompressed layer tar: bin/busybox, bin/<applet> -> busybox, and an empty tmp/."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d, mode in (("bin", 0o755), ("tmp", 0o1777), ("etc", 0o755)):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            _add(tar, info)
        exe = tarfile.TarInfo("bin/busybox")
        exe.mode = 0o755
        _add(tar, exe, busybox)
        for applet in sorted(set(applets) - {"busybox"}):
            if not applet or "/" in applet:
                continue
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            link.mode = 0o777
            _add(tar, link)
    return buf.getvalue()


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def image_tar(
    *,
    ref: str,
    layer: bytes,
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] | None = None,
) -> bytes:
    """An OCI image-layout tarball holding one image named `ref` (e.g. docker.io/library/x:tag).

    `io.containerd.image.name` carries the full name for `ctr images import`;
    `org.opencontainers.image.ref.name` carries the tag, as the OCI spec asks.
    """
    container_cfg: dict[str, Any] = {"Env": [DEFAULT_PATH], "WorkingDir": "/"}
    if entrypoint is not None:
        container_cfg["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        container_cfg["Cmd"] = list(cmd)
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": container_cfg,
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "akri-trio oci.py"}],
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": _digest(layer), "size": len(layer)}],
        }
    )
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": tag,
                    },
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        blobs = tarfile.TarInfo("blobs")
        blobs.type = tarfile.DIRTYPE
        blobs.mode = 0o755
        _add(tar, blobs)
        sha = tarfile.TarInfo("blobs/sha256")
        sha.type = tarfile.DIRTYPE
        sha.mode = 0o755
        _add(tar, sha)
        for blob in (layer, config, manifest):
            info = tarfile.TarInfo(f"blobs/sha256/{_digest(blob).split(':', 1)[1]}")
            info.mode = 0o644
            _add(tar, info, blob)
        for name, data in (
            ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
            ("index.json", index),
        ):
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            _add(tar, info, data)
    return buf.getvalue()


def pause_and_busybox(
    busybox: bytes, applets: Iterable[str], *, pause_ref: str, busybox_ref: str
) -> dict[str, bytes]:
    """Both node images by reference. The pause image sleeps forever as the sandbox's PID 1;
    the busybox image starts `sh` like Docker Hub's (tests always pass `command:`)."""
    layer = busybox_layer(busybox, applets)
    return {
        pause_ref: image_tar(ref=pause_ref, layer=layer, entrypoint=["/bin/sleep", "2147483647"]),
        busybox_ref: image_tar(ref=busybox_ref, layer=layer, cmd=["sh"]),
    }
