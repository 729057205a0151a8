"""Fixtures for the self-contained plugin: the built bundle, a real netns with a veth.

Real parts only: scripts/build-plugin.sh builds the static executable,
scripts/install.sh installs it, `ip netns` makes the sandbox, `unshare` and
`chroot` give the plugin a root file system with nothing but the installed
files. A step that cannot run here fails the test with its reason.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "build-plugin.sh"
DRIVER = "net.example.com"
# The interpreter the bundle embeds (Debian's static libpython3.11): the
# source plugin runs on it for the side-by-side comparisons.
SOURCE_PYTHON = "/usr/bin/python3.11"
# The user-mode emulator the arm64 build runs under (Debian's qemu-user-static).
QEMU = "qemu-aarch64-static"


@pytest.fixture(scope="session")
def bundle() -> Path:
    """The static executable, built (or reused from the cache) from this checkout."""
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-plugin.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def arm64_bundle() -> Path:
    """The aarch64 executable, cross-built (or reused from the cache) from this checkout."""
    proc = subprocess.run(["bash", str(BUILD), "--arch", "arm64"], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-plugin.sh --arch arm64 failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def qemu(arm64_bundle: Path) -> Path:
    """The static user-mode emulator (Debian's qemu-user-static, installed by the arm64 build)."""
    found = shutil.which(QEMU)
    if found is None:
        pytest.fail(f"{QEMU} not found: scripts/build-plugin.sh --arch arm64 installs qemu-user-static")
    return Path(found).resolve()


@pytest.fixture(scope="session")
def source_plugin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The plugin run from the source tree (`#!python -IS` launcher), for comparison."""
    from cni_plugin.launcher import install

    path = tmp_path_factory.mktemp("srcbin") / "netclaim"
    return install(str(path), python=SOURCE_PYTHON, root=str(REPO))


@dataclass
class Sandbox:
    """A netns holding eth0 (one end of a veth pair) with known MAC, MTU and addresses."""

    name: str
    mac: str
    mtu: int

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def prev_result(self, version: str = "1.0.0", with_mtu: bool = False) -> dict:
        iface = {"name": "eth0", "mac": self.mac, "sandbox": self.path}
        if with_mtu:
            iface["mtu"] = self.mtu
        return {"cniVersion": version, "interfaces": [iface],
                "ips": [{"address": "10.99.0.5/24", "interface": 0}, {"address": "fd00:99::5/64", "interface": 0}]}


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def sandbox() -> Sandbox:
    name = f"ncbd-{secrets.token_hex(3)}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "add", "eth0", "mtu", "1432", "type", "veth", "peer", "name", "peer0")
        _ip("-n", name, "link", "set", "eth0", "address", "02:42:0a:63:00:05")
        _ip("-n", name, "addr", "add", "10.99.0.5/24", "dev", "eth0")
        _ip("-n", name, "addr", "add", "fd00:99::5/64", "dev", "eth0", "nodad")
        _ip("-n", name, "link", "set", "peer0", "up")
        _ip("-n", name, "link", "set", "eth0", "up")
        link = json.loads(_ip("-j", "-n", name, "link", "show", "eth0"))[0]
        yield Sandbox(name, link["address"], link["mtu"])
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def cni_env(command: str, netns: str = "", container_id: str = "ctr-bundle", ifname: str = "eth0") -> dict[str, str]:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
            "CNI_PATH": "/opt/cni/bin",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-0;K8S_POD_UID=uid-123"}
