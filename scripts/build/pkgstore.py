#!/usr/bin/env python3
"""The image's inputs, pinned and kept: Debian packages and Python wheels by their sha256.

    pkgstore.py debs ARCH --out DIR [--offline]    an apt repository of the locked .debs of ARCH
    pkgstore.py wheels ARCH --out DIR [--offline]  a wheelhouse of the locked wheels for ARCH
    pkgstore.py epoch                              the lock's SOURCE_DATE_EPOCH
    pkgstore.py lock-debs ARCH DEB...              lock lines for these .debs (scripts/build/image-lock.sh)
    pkgstore.py lock-wheels WHEEL...               wheels.lock for these wheels (the same)
    pkgstore.py download ARCH SPEC... --dest DIR   pip download of ARCH's wheels of SPEC (the same)

Why a store and not the mirror: a Debian mirror serves one version of each package, and a
package index serves whatever was uploaded last, so "build again" meant "build something else"
every time either moved, and every build needed both to answer. conf/image/debian.lock and
conf/image/wheels.lock name each file by version and sha256; the store
(${NETCLAIM_PACKAGE_STORE:-${XDG_CACHE_HOME:-~/.cache}/netclaim/packages}) keeps each file
under its hash once it has been fetched and checked. A build takes its inputs from the store
only, so a warm store builds with no network at all (--offline refuses to fetch) and the same
locks give the same bytes. A file the store lacks is fetched once: .debs with apt, from the
mirrors of this machine's apt sources (private lists, so the system's apt state is untouched;
apt checks the archive's signature, the lock the file's hash), wheels with pip from its index.
A mirror that no longer serves a locked version is an error that says how to go on.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_LOCK = ROOT / "conf" / "image" / "debian.lock"
WHEELS_LOCK = ROOT / "conf" / "image" / "wheels.lock"
APT_SOURCES = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
               *sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
# The wheel platform tags pip is asked for, per image architecture (the image's glibc is 2.36).
PIP_PLATFORMS = {
    "amd64": ["manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"],
    "arm64": ["manylinux_2_36_aarch64", "manylinux_2_28_aarch64", "manylinux_2_17_aarch64",
              "manylinux2014_aarch64"],
}
WHEEL_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}
LISTS_MAX_AGE = 24 * 3600
SUITE = "bookworm"


class Refused(Exception):
    """A build input that cannot be had as locked: the message says what to do."""


def log(msg: str) -> None:
    print(f"[pkgstore] {msg}", file=sys.stderr)


def store_dir() -> Path:
    base = os.environ.get("NETCLAIM_PACKAGE_STORE")
    if base:
        return Path(base)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "netclaim" / "packages"


def sha256_of(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def keep(src: Path, dest: Path) -> None:
    """Copy a checked file into the store atomically (two builds may fetch the same file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)


def link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


# ------------------------------------------------------------------ Debian packages


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    arch: str  # the package's own architecture: amd64, arm64 or all
    sha256: str

    @property
    def pin(self) -> str:
        return f"{self.package}:{self.arch}={self.version}" if self.arch != "all" else f"{self.package}={self.version}"


def lock_epoch() -> int:
    m = re.search(r"^# SOURCE_DATE_EPOCH=(\d+)$", DEBIAN_LOCK.read_text(), re.M)
    if not m:
        raise Refused(f"{DEBIAN_LOCK.relative_to(ROOT)} has no '# SOURCE_DATE_EPOCH=' line")
    return int(m.group(1))


def locked_debs(image_arch: str) -> list[Deb]:
    """The lock's packages for one image architecture (its lines start with that architecture)."""
    debs = []
    for line in DEBIAN_LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        image, package, version, arch, digest = line.split()
        if image == image_arch:
            debs.append(Deb(package, version, arch, digest))
    if not debs:
        raise Refused(f"{DEBIAN_LOCK.relative_to(ROOT)} locks no package for {image_arch}")
    return debs


def private_apt(state: Path, arch: str) -> list[str]:
    """apt options for a private state (lists, cache) over this machine's sources, for `arch`."""
    parts = state / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    for src in APT_SOURCES:
        if src.is_file() and src.stat().st_size:
            shutil.copyfile(src, parts / (src.name if src.name != "sources.list" else "system.list"))
    return ["-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={parts}",
            "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::Cache={state / 'cache'}",
            "-o", "APT::Sandbox::User=root", "-o", f"APT::Architecture={arch}",
            "-o", f"APT::Architectures={arch}"]


def apt_fetch(missing: list[Deb], image_arch: str, store: Path) -> None:
    """Fetch the missing .debs with apt and keep those whose hash is the locked one."""
    state = store / f"apt-{image_arch}"
    opts = private_apt(state, image_arch)
    lists = state / "lists"
    fresh = any(p.name.endswith("_Packages") and time.time() - p.stat().st_mtime < LISTS_MAX_AGE
                for p in lists.iterdir())
    if not fresh:
        run = subprocess.run(["apt-get", "-q", *opts, "update"], capture_output=True, text=True)
        if run.returncode:
            log(f"apt-get update ({image_arch}) reported errors:\n{run.stderr.strip()}")
    with tempfile.TemporaryDirectory(dir=store) as tmp:
        run = subprocess.run(["apt-get", "-q", *opts, "download", *(d.pin for d in missing)],
                             cwd=tmp, capture_output=True, text=True)
        if run.returncode:
            log(run.stderr.strip())
        got = {sha256_of(p): p for p in Path(tmp).glob("*.deb")}
        for deb in missing:
            if deb.sha256 in got:
                keep(got[deb.sha256], store / "debs" / f"{deb.sha256}.deb")


def ensure_debs(image_arch: str, offline: bool) -> list[Path]:
    """Every locked .deb of `image_arch` from the store, fetched first when online."""
    store = store_dir()
    debs = locked_debs(image_arch)
    missing = [d for d in debs if not (store / "debs" / f"{d.sha256}.deb").is_file()]
    if missing and not offline:
        store.mkdir(parents=True, exist_ok=True)
        with open(store / f".lock-apt-{image_arch}", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two builds share one private apt state: one at a time
            missing = [d for d in debs if not (store / "debs" / f"{d.sha256}.deb").is_file()]
            if missing:
                log(f"fetching {len(missing)} Debian package(s) for {image_arch} into the package store")
                apt_fetch(missing, image_arch, store)
        missing = [d for d in debs if not (store / "debs" / f"{d.sha256}.deb").is_file()]
    if missing:
        names = ", ".join(d.pin for d in missing[:8]) + (" ..." if len(missing) > 8 else "")
        why = ("--offline: nothing is fetched" if offline else
               "the mirror no longer serves these versions (or serves other bytes)")
        raise Refused(f"not in the package store ({why}): {names}. Either copy a store that has them "
                      f"(NETCLAIM_PACKAGE_STORE), or point apt at a snapshot of the lock's day, or take "
                      f"today's packages with scripts/build/image-lock.sh (a new lock: a new image digest)")
    return [store / "debs" / f"{d.sha256}.deb" for d in debs]


def make_repo(image_arch: str, out: Path, offline: bool) -> None:
    """A repository (`deb [trusted=yes] copy://OUT bookworm main`) holding exactly the locked .debs:
    apt resolves the image's package set from it and from nothing else. It has a Release file
    naming the suite because mmdebstrap picks the Essential set by suite."""
    pool = out / "pool"
    index = out / "dists" / SUITE / "main" / f"binary-{image_arch}"
    pool.mkdir(parents=True, exist_ok=True)
    index.mkdir(parents=True, exist_ok=True)
    for path in ensure_debs(image_arch, offline):
        link_or_copy(path, pool / path.name)
    packages = subprocess.run(["dpkg-scanpackages", "--multiversion", "pool"], cwd=out, check=True,
                              capture_output=True, text=True).stdout
    (index / "Packages").write_text(packages)
    data = (index / "Packages").read_bytes()
    release = (f"Suite: {SUITE}\nCodename: {SUITE}\nArchitectures: {image_arch}\nComponents: main\n"
               f"Description: the packages locked for the netclaim image\nSHA256:\n"
               f" {hashlib.sha256(data).hexdigest()} {len(data)} main/binary-{image_arch}/Packages\n")
    (out / "dists" / SUITE / "Release").write_text(release)


def deb_fields(path: Path) -> dict[str, str]:
    out = subprocess.run(["dpkg-deb", "-f", str(path), "Package", "Version", "Architecture"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def lock_debs(image_arch: str, paths: list[Path]) -> list[str]:
    lines = []
    for path in paths:
        f = deb_fields(path)
        digest = sha256_of(path)
        lines.append(f"{image_arch} {f['Package']} {f['Version']} {f['Architecture']} {digest}")
        keep(path, store_dir() / "debs" / f"{digest}.deb")
    return sorted(lines)


# ------------------------------------------------------------------ wheels


@dataclass(frozen=True)
class Requirement:
    name: str
    version: str
    hashes: frozenset[str]


def locked_wheels() -> list[Requirement]:
    """wheels.lock is a pip requirements file with hashes (`pip install --require-hashes` reads it)."""
    text = re.sub(r"\\\n\s*", " ", WHEELS_LOCK.read_text())
    reqs = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)$", line)
        if not m:
            raise Refused(f"{WHEELS_LOCK.relative_to(ROOT)}: not NAME==VERSION --hash=sha256:...: {line!r}")
        reqs.append(Requirement(m.group(1), m.group(2), frozenset(re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))))
    return reqs


def fits(filename: str, image_arch: str) -> bool:
    """A wheel for this image: pure, or built for its machine."""
    return filename.endswith("-none-any.whl") or WHEEL_MACHINE[image_arch] in filename


def stored_wheel(req: Requirement, image_arch: str, store: Path) -> Path | None:
    for digest in sorted(req.hashes):
        for path in (store / "wheels" / digest).glob("*.whl"):
            if fits(path.name, image_arch):
                return path
    return None


def pip_download(specs: list[str], image_arch: str, dest: Path) -> bool:
    """pip download of binary wheels for the image's Python and machine (not this host's), no deps."""
    platforms = [a for p in PIP_PLATFORMS[image_arch] for a in ("--platform", p)]
    return subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                           "--abi", "cp311", *platforms, "--dest", str(dest), *specs],
                          check=False, stdout=sys.stderr).returncode == 0


def pip_fetch(req: Requirement, image_arch: str, store: Path) -> None:
    with tempfile.TemporaryDirectory(dir=store) as tmp:
        pip_download([f"{req.name}=={req.version}"], image_arch, Path(tmp))
        for path in Path(tmp).glob("*.whl"):
            digest = sha256_of(path)
            if digest in req.hashes:
                keep(path, store / "wheels" / digest / path.name)
            else:
                log(f"{path.name}: sha256 {digest} is not locked for {req.name}=={req.version}")


def make_wheelhouse(image_arch: str, out: Path, offline: bool) -> None:
    """The locked wheels that fit `image_arch`, one per requirement."""
    store = store_dir()
    out.mkdir(parents=True, exist_ok=True)
    missing = []
    for req in locked_wheels():
        path = stored_wheel(req, image_arch, store)
        if path is None and not offline:
            log(f"fetching {req.name}=={req.version} for {image_arch} into the package store")
            pip_fetch(req, image_arch, store)
            path = stored_wheel(req, image_arch, store)
        if path is None:
            missing.append(f"{req.name}=={req.version}")
            continue
        link_or_copy(path, out / path.name)
    if missing:
        why = "--offline: nothing is fetched" if offline else "the index has no wheel with a locked hash"
        raise Refused(f"not in the package store for {image_arch} ({why}): {', '.join(missing)}. Copy a store "
                      f"that has them (NETCLAIM_PACKAGE_STORE) or take new ones with scripts/build/image-lock.sh")


def lock_wheels(paths: list[Path]) -> str:
    """wheels.lock's body: every version's hashes (one per platform build), sorted."""
    by_req: dict[tuple[str, str], set[str]] = {}
    for path in paths:
        name, version = path.name.split("-")[:2]
        digest = sha256_of(path)
        by_req.setdefault((name.lower().replace("_", "-"), version), set()).add(digest)
        keep(path, store_dir() / "wheels" / digest / path.name)
    lines = []
    for (name, version), digests in sorted(by_req.items()):
        hashes = " \\\n    ".join(f"--hash=sha256:{d}" for d in sorted(digests))
        lines.append(f"{name}=={version} \\\n    {hashes}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ command line


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pkgstore.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("debs", "wheels"):
        p = sub.add_parser(name)
        p.add_argument("arch", choices=sorted(WHEEL_MACHINE))
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--offline", action="store_true", default=bool(os.environ.get("NETCLAIM_OFFLINE")))
    sub.add_parser("epoch")
    p = sub.add_parser("lock-debs")
    p.add_argument("arch", choices=sorted(WHEEL_MACHINE))
    p.add_argument("files", type=Path, nargs="+")
    p = sub.add_parser("lock-wheels")
    p.add_argument("files", type=Path, nargs="+")
    p = sub.add_parser("download")
    p.add_argument("arch", choices=sorted(WHEEL_MACHINE))
    p.add_argument("specs", nargs="+")
    p.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "debs":
            make_repo(args.arch, args.out, args.offline)
        elif args.cmd == "wheels":
            make_wheelhouse(args.arch, args.out, args.offline)
        elif args.cmd == "epoch":
            print(lock_epoch())
        elif args.cmd == "download":
            if not pip_download(args.specs, args.arch, args.dest):
                raise Refused(f"pip could not download {' '.join(args.specs)} for {args.arch}")
        elif args.cmd == "lock-debs":
            print("\n".join(lock_debs(args.arch, args.files)))
        else:
            sys.stdout.write(lock_wheels(args.files))
    except Refused as exc:
        print(f"[pkgstore] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
