"""`scripts/build-image.sh --multi-arch`: one OCI image index with linux/amd64 and linux/arm64.

What a registry or `ctr images import` relies on is checked on the archive
itself: the layout's index.json names one image index; the index has one
manifest per platform; every blob (index, manifests, configs, layers) is
present with the digest and size its descriptor claims; each config says the
platform its descriptor says. Then what a node would run: each platform's
layers hold the plugin built for that machine (the bytes of
scripts/build-plugin.sh [--arch arm64]) and a Python of that machine, and the
arm64 image's publisher answers `--version` when its root file system is run
under qemu-user (chroot, the emulator copied in; nothing of the host). And
what a node does with the archive: a private containerd imports it (as
`scripts/cluster.sh import-image` does) and lists one image index for both
platforms, complete and unpacked for this host's.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from cni_plugin import __version__

from .conftest import QEMU, REPO

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
MACHINES = {"amd64": 62, "arm64": 183}


@pytest.fixture(scope="module")
def archive() -> Path:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "--multi-arch"], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-image.sh --multi-arch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class Layout:
    """The OCI layout inside the archive, every blob checked against its descriptor when read."""

    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path)
        self.names = {m.name.removeprefix("./") for m in self.tar.getmembers() if m.isfile()}

    def file(self, name: str) -> bytes:
        member = self.tar.extractfile("./" + name)
        assert member is not None, f"{name} missing from the archive"
        return member.read()

    def blob(self, descriptor: dict) -> bytes:
        algo, _, hexdigest = descriptor["digest"].partition(":")
        assert algo == "sha256"
        name = f"blobs/sha256/{hexdigest}"
        assert name in self.names, f"blob {descriptor['digest']} ({descriptor.get('mediaType')}) missing"
        data = self.file(name)
        assert hashlib.sha256(data).hexdigest() == hexdigest, f"blob {name} does not match its digest"
        assert len(data) == descriptor["size"], f"blob {name}: {len(data)} bytes, descriptor says {descriptor['size']}"
        return data


@pytest.fixture(scope="module")
def layout(archive: Path) -> Layout:
    return Layout(archive)


def platforms(layout: Layout) -> dict[str, dict]:
    index = json.loads(layout.file("index.json"))
    [top] = index["manifests"]
    image_index = json.loads(layout.blob(top))
    return {m["platform"]["architecture"]: json.loads(layout.blob(m)) for m in image_index["manifests"]}


def layer_files(layout: Layout, manifest: dict, wanted: set[str]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(layout.blob(layer))) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("./")
                if name in wanted and member.isfile():
                    found[name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    return found


def test_the_layout_names_one_image_index_of_both_platforms(layout: Layout) -> None:
    assert json.loads(layout.file("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(layout.file("index.json"))
    assert index["schemaVersion"] == 2
    [top] = index["manifests"]
    assert top["mediaType"] == INDEX
    assert top["annotations"] == {"org.opencontainers.image.ref.name": __version__,
                                  "io.containerd.image.name": f"docker.io/library/netclaim:{__version__}"}
    image_index = json.loads(layout.blob(top))
    assert (image_index["schemaVersion"], image_index["mediaType"]) == (2, INDEX)
    assert sorted((m["mediaType"], m["platform"]["os"], m["platform"]["architecture"])
                  for m in image_index["manifests"]) == [(MANIFEST, "linux", "amd64"), (MANIFEST, "linux", "arm64")]


def test_every_blob_matches_its_digest_and_each_config_its_platform(layout: Layout) -> None:
    [top] = json.loads(layout.file("index.json"))["manifests"]
    referenced = {top["digest"]}
    referenced |= {m["digest"] for m in json.loads(layout.blob(top))["manifests"]}
    layers = set()
    for arch, manifest in platforms(layout).items():
        assert manifest["schemaVersion"] == 2 and manifest.get("mediaType", MANIFEST) == MANIFEST
        assert manifest["config"]["mediaType"] == CONFIG
        config = json.loads(layout.blob(manifest["config"]))
        assert (config["os"], config["architecture"]) == ("linux", arch)
        assert config["config"]["Entrypoint"] == ["/opt/netclaim/venv/bin/netclaim-publisher"]
        assert len(config["rootfs"]["diff_ids"]) == len(manifest["layers"]) == 2
        referenced.add(manifest["config"]["digest"])
        for layer in manifest["layers"]:
            layout.blob(layer)
            layers.add(layer["digest"])
    assert len(layers) == 4, "the two platforms share a layer (the base or the app layer is not per platform)"
    # Nothing else in the layout: every blob is reachable from the index.
    blobs = {"sha256:" + name.rsplit("/", 1)[1] for name in layout.names if name.startswith("blobs/")}
    assert blobs == referenced | layers


def test_each_platform_carries_its_own_plugin_and_python(layout: Layout, bundle: Path, arm64_bundle: Path) -> None:
    plugins = {"amd64": bundle, "arm64": arm64_bundle}
    for arch, manifest in platforms(layout).items():
        files = layer_files(layout, manifest, {"opt/netclaim/bin/netclaim", "usr/bin/python3.11"})
        assert files["opt/netclaim/bin/netclaim"] == plugins[arch].read_bytes(), f"{arch}: not the built plugin"
        python = files["usr/bin/python3.11"]
        assert int.from_bytes(python[18:20], "little") == MACHINES[arch], f"{arch}: python3.11 of another machine"


def test_the_arm64_image_runs_its_publisher_under_qemu(layout: Layout, qemu: Path, tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    root.mkdir()
    manifest = platforms(layout)["arm64"]
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(layout.blob(layer))) as tar:
            tar.extractall(root, filter="tar")
    assert not (root / QEMU).exists()
    shutil.copy2(qemu, root / QEMU)
    chroot = shutil.which("chroot")
    assert chroot is not None
    proc = subprocess.run([chroot, str(root), f"/{QEMU}", "/opt/netclaim/venv/bin/python",
                           "/opt/netclaim/venv/bin/netclaim-publisher", "--version"],
                          capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[:2] == ["netclaim-publisher", __version__]


def test_containerd_imports_the_index_for_both_platforms(archive: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts" / "harness"))
    from runtime.containerd import Containerd, ContainerdPaths

    base = Path(tempfile.mkdtemp(prefix="ncimg-"))  # short: containerd's socket path must fit AF_UNIX
    runtime = Containerd(ContainerdPaths(base), "netclaim-test/pause:none")
    try:
        runtime.start()
        runtime.import_image(archive)
        rows = [line.split() for line in runtime.ctr("images", "ls").stdout.splitlines()[1:]]
        checks = [line.split() for line in runtime.ctr("images", "check").stdout.splitlines()[1:]]
    finally:
        runtime.stop()
        shutil.rmtree(base, ignore_errors=True)
    name = f"docker.io/library/netclaim:{__version__}"
    [row] = [r for r in rows if r[0] == name]
    assert row[1] == INDEX and "linux/amd64,linux/arm64" in row, row
    [check] = [c for c in checks if c[0] == name]
    assert "complete" in check and check[-1] == "true", check  # every blob of this host's platform, unpacked
