"""A node that is neither x86_64 nor aarch64, or a plugin built for the other one, is refused at install.

The mismatch is real here: this host is x86_64 and the arm64 build is an
aarch64 executable, so installing it is the mistake an operator would make
with the wrong image variant. Another machine name can only be faked, through
the variable scripts/install.sh documents for tests (NETCLAIM_NODE_MACHINE).
What is checked is what an operator sees: a non-zero exit, one error line that
names both machines, and a node left exactly as it was (no plugin written, the
conflist unchanged). The chain keeper (the DaemonSet's installer) refuses the
same way.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import DRIVER, REPO

INSTALL_SH = REPO / "scripts" / "install.sh"
CONFLIST = "/etc/cni/net.d/10-podnet.conflist"
BASE = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "bridge", "bridge": "cni0"}]}
PUBLISHER = REPO / ".venv" / "bin" / "netclaim-publisher"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    (root / "etc" / "cni" / "net.d").mkdir(parents=True)
    (root / CONFLIST.lstrip("/")).write_text(json.dumps(BASE))
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def install(root: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL_SH), "--host-root", str(root), "--conflist", CONFLIST,
                           "--driver-name", DRIVER, *extra], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_host_is_x86_64() -> None:
    # The real mismatch below relies on it; on another build host these tests mean nothing.
    assert os.uname().machine == "x86_64"


def test_the_arm64_plugin_is_refused_on_this_x86_64_node(node: Path, arm64_bundle: Path) -> None:
    before = snapshot(node)
    proc = install(node, "--bundle", str(arm64_bundle))
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        f"[install] error: {arm64_bundle} is built for aarch64, but this node is x86_64: install the x86_64 build "
        "(scripts/build-plugin.sh or the image's linux/amd64)"]
    assert snapshot(node) == before, "the node was changed by a refused install"


def test_a_node_that_is_neither_is_refused_before_anything_is_built_or_written(node: Path) -> None:
    before = snapshot(node)
    proc = install(node, env={"NETCLAIM_NODE_MACHINE": "riscv64"})
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        "[install] error: this node is riscv64; the netclaim plugin is built for x86_64 and aarch64 nodes only"]
    assert snapshot(node) == before


def test_the_x86_64_plugin_is_refused_on_an_aarch64_node(node: Path, bundle: Path) -> None:
    before = snapshot(node)
    proc = install(node, "--bundle", str(bundle), env={"NETCLAIM_NODE_MACHINE": "aarch64"})
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        f"[install] error: {bundle} is built for x86_64, but this node is aarch64: install the aarch64 build "
        "(scripts/build-plugin.sh --arch arm64 or the image's linux/arm64)"]
    assert snapshot(node) == before


def test_the_matching_plugin_still_installs(node: Path, bundle: Path) -> None:
    proc = install(node, "--bundle", str(bundle))
    assert proc.returncode == 0, proc.stderr
    assert (node / "opt" / "cni" / "bin" / "netclaim").read_bytes() == bundle.read_bytes()


def test_the_chain_keeper_refuses_the_arm64_plugin_on_this_x86_64_node(node: Path,
                                                                        arm64_bundle: Path) -> None:
    assert PUBLISHER.exists(), f"{PUBLISHER} missing: run scripts/setup.sh"
    before = snapshot(node)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(PUBLISHER), "chain-keeper", f"--cni-conf-dir={node / 'etc/cni/net.d'}",
                           f"--cni-bin-dir={node / 'opt/cni/bin'}", f"--plugin-binary={arm64_bundle}",
                           f"--driver-name={DRIVER}", "--once", "--log-format=text"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert error_lines(proc.stderr)[-1] == (
        f"netclaim: {arm64_bundle} is built for aarch64, but this node is x86_64: install the x86_64 build "
        "(the image's linux/amd64)")
    assert snapshot(node) == before
    assert not (node / "opt" / "cni" / "bin" / "netclaim").exists()


def test_the_chain_keepers_check_names_a_node_that_is_neither(bundle: Path, arm64_bundle: Path) -> None:
    from publisher.keeper.nodefiles import plugin_platform_problem

    assert plugin_platform_problem(bundle) is None  # this x86_64 node, its own build
    assert plugin_platform_problem(arm64_bundle, machine="aarch64") is None
    assert plugin_platform_problem(bundle, machine="riscv64") == (
        "this node is riscv64; the netclaim plugin is built for x86_64 and aarch64 nodes only")
    assert plugin_platform_problem(bundle, machine="aarch64") == (
        f"{bundle} is built for x86_64, but this node is aarch64: install the aarch64 build (the image's linux/arm64)")
