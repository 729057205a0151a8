"""The image is made of what its locks name, and a cold build with no network makes the same bytes;
a cold build of either plugin executable makes the same bytes too.

conf/image/debian.lock and conf/image/wheels.lock pin every Debian package and wheel of the
image by version and sha256; scripts/build-image.sh takes them from the package store
(scripts/build/pkgstore.py) and dates everything in the image by the lock. What an operator or
a distributor relies on:
- a second build, from a cold image cache, in a network namespace of its own (no route to any
  mirror or index) and with --offline, writes the same archive, byte for byte, as the ordinary
  build of the same sources: the digest a release publishes can be rebuilt and checked;
- the image holds exactly the locked Debian packages (its dpkg status, per platform) and the
  locked wheels' versions (its venv), so the locks say what is inside;
- an offline build whose store lacks a locked file fails before building, naming the file and
  how to go on, instead of fetching or building something else;
- scripts/build-plugin.sh [--arch arm64] with an empty cache (the CPython source and the arm64
  static library fetched again) writes the executable the release ships, byte for byte: the
  plugin's bytes depend on the Debian packages its build-info.txt names, not on when it was built.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from cni_plugin import __version__

from .conftest import REPO

BUILD = REPO / "scripts" / "build-image.sh"
PKGSTORE = REPO / "scripts" / "build" / "pkgstore.py"
DEBIAN_LOCK = REPO / "conf" / "image" / "debian.lock"
WHEELS_LOCK = REPO / "conf" / "image" / "wheels.lock"


def build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD), "--multi-arch", *args], capture_output=True, text=True,
                          timeout=3600, env=env)


@pytest.fixture(scope="module")
def archive() -> Path:
    proc = build()
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-image.sh --multi-arch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def images(archive: Path) -> dict[str, list[bytes]]:
    """Each platform's layers (uncompressed tar bytes), read through the archive's one image index."""
    with tarfile.open(archive) as tar:
        def blob(digest: str) -> bytes:
            return tar.extractfile("./blobs/sha256/" + digest.split(":", 1)[1]).read()  # type: ignore[union-attr]

        [top] = json.loads(tar.extractfile("./index.json").read())["manifests"]  # type: ignore[union-attr]
        out = {}
        for m in json.loads(blob(top["digest"]))["manifests"]:
            manifest = json.loads(blob(m["digest"]))
            out[m["platform"]["architecture"]] = [blob(layer["digest"]) for layer in manifest["layers"]]
        return out


@pytest.fixture(scope="module")
def platform_layers(archive: Path) -> dict[str, list[bytes]]:
    return images(archive)


def files_named(layers: list[bytes], pattern: str) -> dict[str, bytes]:
    found = {}
    for layer in layers:
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("./")
                if member.isfile() and re.fullmatch(pattern, name):
                    found[name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    return found


def test_a_cold_offline_build_with_no_network_writes_the_same_image(archive: Path, tmp_path: Path) -> None:
    env = dict(os.environ, NETCLAIM_IMAGE_CACHE=str(tmp_path / "image-cache"))
    # A network namespace of its own: only a loopback, which is down; nothing can be fetched.
    proc = subprocess.run(["unshare", "--net", "bash", str(BUILD), "--multi-arch", "--offline"], capture_output=True,
                          text=True, timeout=3600, env=env)
    assert proc.returncode == 0, f"the offline build failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    assert "making the base root file system" in proc.stderr and "making the arm64 base" in proc.stderr, \
        "the bases were not built again: the cache was not cold"
    rebuilt = Path(proc.stdout.strip().splitlines()[-1])
    assert rebuilt.parent == tmp_path / "image-cache"
    assert rebuilt.read_bytes() == archive.read_bytes(), \
        f"a cold offline build of the same sources and locks wrote other bytes than {archive.name}"


def locked_debs(arch: str) -> set[tuple[str, str]]:
    return {(line.split()[1], line.split()[2]) for line in DEBIAN_LOCK.read_text().splitlines()
            if line.startswith(f"{arch} ")}


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_the_image_holds_exactly_the_locked_debian_packages(platform_layers: dict[str, list[bytes]],
                                                            arch: str) -> None:
    [status] = files_named(platform_layers[arch], r"var/lib/dpkg/status").values()
    held = set()
    for stanza in status.decode().split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if fields:
            held.add((fields["Package"], fields["Version"]))
    assert held == locked_debs(arch), f"not locked: {sorted(held - locked_debs(arch))[:5]}; " \
                                      f"locked, not held: {sorted(locked_debs(arch) - held)[:5]}"


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_the_publishers_venv_holds_the_locked_wheel_versions(platform_layers: dict[str, list[bytes]],
                                                             arch: str) -> None:
    locked = dict(re.findall(r"^([a-z0-9-]+)==(\S+)", WHEELS_LOCK.read_text(), re.M))
    metadata = files_named(platform_layers[arch], r"opt/netclaim/venv/lib/python3\.11/site-packages/[^/]+\.dist-info/METADATA")
    installed = {}
    for text in metadata.values():
        fields = dict(re.findall(r"^(Name|Version): (.*)$", text.decode(), re.M))
        installed[re.sub(r"[-_.]+", "-", fields["Name"]).lower()] = fields["Version"]
    assert installed.pop("netclaim") == __version__
    assert installed, "no dependency in the venv"
    for name, version in installed.items():
        assert locked.get(name) == version, f"{name} {version} in the {arch} venv; the lock says {locked.get(name)}"


def test_an_offline_build_names_what_the_package_store_lacks(tmp_path: Path) -> None:
    env = dict(os.environ, NETCLAIM_PACKAGE_STORE=str(tmp_path / "empty-store"))
    first = next(line for line in DEBIAN_LOCK.read_text().splitlines() if line.startswith("amd64 "))
    proc = subprocess.run(["python3", str(PKGSTORE), "debs", "amd64", "--out", str(tmp_path / "repo"), "--offline"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1
    assert f"{first.split()[1]}:{first.split()[3]}={first.split()[2]}" in proc.stderr or \
        f"{first.split()[1]}={first.split()[2]}" in proc.stderr, proc.stderr
    assert "--offline" in proc.stderr and "scripts/build/image-lock.sh" in proc.stderr, proc.stderr
    assert not (tmp_path / "empty-store" / "debs").exists(), "something was fetched offline"
    proc = subprocess.run(["python3", str(PKGSTORE), "wheels", "arm64", "--out", str(tmp_path / "wh"), "--offline"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1 and "pyyaml==" in proc.stderr, proc.stderr


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_a_cold_plugin_build_writes_the_same_executable(arch: str, tmp_path: Path) -> None:
    script = REPO / "scripts" / "build-plugin.sh"
    args = ["--arch", "arm64"] if arch == "arm64" else []
    ordinary = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=3600)
    assert ordinary.returncode == 0, ordinary.stderr[-3000:]
    cold = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert "building the static plugin" in cold.stderr, "the cold build reused a cache"
    built, again = Path(ordinary.stdout.strip().splitlines()[-1]), Path(cold.stdout.strip().splitlines()[-1])
    assert again.is_relative_to(tmp_path)
    assert again.read_bytes() == built.read_bytes(), f"a cold {arch} plugin build wrote other bytes"
    assert (again.parent / "build-info.txt").read_text() == (built.parent / "build-info.txt").read_text()
