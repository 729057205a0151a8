"""scripts/build-plugin.sh: cached by its inputs, rebuilt when the plugin changes, reproducible (both arches).

The build runs on a copy of exactly what the image's `plugin` stage copies
(cni_plugin/, scripts/build-plugin.sh, scripts/build/, scripts/build/bundle/) with its own cache dir;
the CPython source it needs (Modules/_json.c) is seeded from this machine's
cache when there is one, else fetched as a fresh machine would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO


def _kit(dest: Path) -> Path:
    shutil.copytree(REPO / "cni_plugin", dest / "cni_plugin", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "build-plugin.sh", dest / "scripts" / "build-plugin.sh")
    shutil.copytree(REPO / "scripts" / "build" / "bundle", dest / "scripts" / "build" / "bundle")
    shutil.copy2(REPO / "scripts" / "build" / "apt.sh", dest / "scripts" / "build" / "apt.sh")
    return dest


def _build(kit: Path, cache: Path, *args: str) -> Path:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    proc = subprocess.run(["bash", str(kit / "scripts" / "build-plugin.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    seed = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "netclaim" / "cpython-src"
    if seed.is_dir():
        shutil.copytree(seed, cache / "netclaim" / "cpython-src", ignore=shutil.ignore_patterns("apt"))
    return cache


def test_cached_rebuilt_on_change_and_reproducible(tmp_path: Path, bundle: Path, cache: Path) -> None:
    kit = _kit(tmp_path / "a")
    first = _build(kit, cache)
    assert first.read_bytes() == bundle.read_bytes(), "same sources elsewhere gave different bytes"
    assert first.is_relative_to(cache / "netclaim" / "plugin")
    stamp = first.stat().st_mtime_ns

    assert _build(kit, cache) == first and first.stat().st_mtime_ns == stamp, "unchanged sources rebuilt"

    changed = kit / "cni_plugin" / "errors.py"
    changed.write_text(changed.read_text() + "\n_A_CHANGE_TO_THE_SOURCES = 1\n")
    second = _build(kit, cache)
    assert second != first and second.read_bytes() != first.read_bytes()
    modules = (second.parent / "modules.txt").read_text().split()
    assert "cni_plugin.main" in modules and "traceback" in modules and "json.decoder" in modules
    proc = subprocess.run([str(second)], input=b"{}", env={"CNI_COMMAND": "VERSION"}, capture_output=True, timeout=30)
    assert proc.returncode == 0 and b"supportedVersions" in proc.stdout


def test_arm64_cross_build_is_reproducible_and_cached_apart(tmp_path: Path, bundle: Path, arm64_bundle: Path,
                                                            cache: Path) -> None:
    """A fresh cache (Debian's arm64 libpython fetched again) gives the same bytes, and the
    x86_64 build in the same cache is not replaced by it."""
    kit = _kit(tmp_path / "a")
    arm = _build(kit, cache, "--arch", "arm64")
    assert arm.read_bytes() == arm64_bundle.read_bytes(), "same sources elsewhere gave different arm64 bytes"
    assert arm.is_relative_to(cache / "netclaim" / "plugin-arm64")
    x86 = _build(kit, cache)
    assert x86.read_bytes() == bundle.read_bytes() and x86 != arm
    assert _build(kit, cache, "--arch", "arm64") == arm and arm.read_bytes() == arm64_bundle.read_bytes()
