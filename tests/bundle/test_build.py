"""scripts/build-plugin.sh: cached by its inputs, rebuilt when the plugin changes, reproducible (both arches),
and a cache entry is reused only as its build left it.

The build runs on a copy of exactly what the image's `plugin` stage copies
(cni_plugin/, scripts/build-plugin.sh, scripts/build/, scripts/build/bundle/) with its own cache dir;
the CPython source it needs (Modules/_json.c) is seeded from this machine's
cache when there is one, else fetched as a fresh machine would.

The cache is the user's to write (another job as the same user, a CI cache restored from another
branch): an entry whose executable or SBOM input (modules.txt, build-info.txt) no longer matches what
its build recorded is refused, naming the file, and nothing is copied out; an entry without a
record is built again. Those run on a copy of this machine's entry, in a cache dir of the test's own.
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

    changed = kit / "cni_plugin" / "lean" / "errors.py"
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


def _entry_copy(bundle: Path, cache: Path) -> Path:
    """A copy of the bundle's cache entry (the executable, modules.txt, build-info.txt, the record)
    under the same key in CACHE: what the script finds there is what it would find in the real one."""
    entry = cache / "netclaim" / "plugin" / bundle.parent.name
    shutil.copytree(bundle.parent, entry)
    return entry


def _run(cache: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "build-plugin.sh"), "--out", str(out)], check=False,
                          capture_output=True, text=True, env=dict(os.environ, XDG_CACHE_HOME=str(cache)), timeout=1800)


def _flip_last_byte(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("changed", ["netclaim", "modules.txt", "build-info.txt"])
def test_a_cache_entry_changed_after_its_build_is_refused_and_not_copied_out(tmp_path: Path, bundle: Path,
                                                                              cache: Path, changed: str) -> None:
    entry = _entry_copy(bundle, cache)
    # Control: the copy as built is reused, not built again, and gives the same bytes.
    reused = _run(cache, tmp_path / "control")
    assert reused.returncode == 0, reused.stderr[-3000:]
    assert "building the static plugin" not in reused.stderr, "the copied entry was built again"
    assert Path(reused.stdout.strip().splitlines()[-1]) == entry / "netclaim"
    assert (tmp_path / "control").read_bytes() == bundle.read_bytes()

    changed_bytes = _flip_last_byte(entry / changed)
    refused = _run(cache, tmp_path / "out")
    assert refused.returncode != 0, f"a changed {changed} was reused:\n{refused.stderr[-3000:]}"
    assert f"{entry / changed} does not match the digest recorded when it was built" in refused.stderr, refused.stderr
    assert f"remove {entry} to rebuild" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists(), "the changed entry was copied out"
    assert (entry / changed).read_bytes() == changed_bytes, "the changed entry was replaced without a word"


def test_a_cache_entry_without_a_digest_record_is_built_again(tmp_path: Path, bundle: Path, cache: Path) -> None:
    """What an older build-plugin.sh left (or an executable planted with no record): built again,
    once, so a warm cache from before the records costs one build, not one per run."""
    entry = _entry_copy(bundle, cache)
    (entry / "SHA256SUMS").unlink()
    _flip_last_byte(entry / "netclaim")
    rebuilt = _run(cache, tmp_path / "out")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert "no digest record" in rebuilt.stderr and "building the static plugin" in rebuilt.stderr, rebuilt.stderr
    assert (entry / "netclaim").read_bytes() == bundle.read_bytes() == (tmp_path / "out").read_bytes()
    assert (entry / "SHA256SUMS").read_text() == (bundle.parent / "SHA256SUMS").read_text()
    again = _run(cache, tmp_path / "again")
    assert again.returncode == 0 and "building the static plugin" not in again.stderr, again.stderr[-3000:]
