"""Build the sandbox ("pause") image locally and pack it as an OCI image archive.

No registry is reachable from the machines this runs on, so the image that
containerd uses for every pod sandbox is built here: a static C binary
(pause.c) in a single uncompressed layer, written as an OCI image layout
(oci-layout, index.json, blobs/sha256/...) inside a tar that
`ctr images import` accepts. Everything is deterministic (fixed mtimes and
ownership), so the same source gives the same image digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

PAUSE_SOURCE = Path(__file__).resolve().parent / "pause.c"
DEFAULT_IMAGE_REF = "netclaim.local/pause:e2e"
_EPOCH = 0  # fixed mtime: reproducible layer and digests

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


@dataclass(frozen=True)
class Blob:
    """A content-addressed blob of the image layout."""

    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: object) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data), **extra}


def compile_pause(out: Path, source: Path = PAUSE_SOURCE) -> Path:
    """gcc -static: the image has no libc, so the binary must carry its own."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc is needed to build the sandbox image (Debian package gcc + libc6-dev)")
    subprocess.run([gcc, "-static", "-O2", "-s", "-o", str(out), str(source)], check=True, capture_output=True)
    return out


def _layer(binary: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("dev", "proc", "sys", "etc"):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, _EPOCH
            tar.addfile(info)
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = len(binary), 0o755, _EPOCH
        tar.addfile(info, io.BytesIO(binary))
    return buf.getvalue()


def _json_blob(media_type: str, obj: object) -> Blob:
    return Blob(media_type, json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())


def image_blobs(binary: bytes, ref: str) -> tuple[dict[str, object], list[Blob]]:
    """Return (index.json, blobs) of a one-layer image whose entrypoint is /pause."""
    arch = _ARCH.get(platform.machine(), platform.machine())
    layer = Blob("application/vnd.oci.image.layer.v1.tar", _layer(binary))
    config = _json_blob(
        "application/vnd.oci.image.config.v1+json",
        {
            "architecture": arch,
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "0:0"},
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
            "history": [{"created_by": "netclaim scripts/harness/runtime/pause_image.py"}],
        },
    )
    manifest = _json_blob(
        "application/vnd.oci.image.manifest.v1+json",
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config.descriptor(),
            "layers": [layer.descriptor()],
        },
    )
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            manifest.descriptor(
                platform={"architecture": arch, "os": "linux"},
                annotations={
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                },
            )
        ],
    }
    return index, [layer, config, manifest]


def write_archive(binary: Path, out: Path, ref: str = DEFAULT_IMAGE_REF) -> Path:
    """Write the OCI image layout as a tar archive at `out`."""
    index, blobs = image_blobs(binary.read_bytes(), ref)
    with tarfile.open(out, mode="w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, _EPOCH
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        for blob in blobs:
            add("blobs/sha256/" + blob.digest.split(":", 1)[1], blob.data)
    return out


def build(workdir: Path, ref: str = DEFAULT_IMAGE_REF) -> Path:
    """Compile pause.c and pack it; returns the archive path."""
    binary = compile_pause(workdir / "pause")
    return write_archive(binary, workdir / "pause-image.tar", ref)
