"""The chain keeper without a cluster: the real keeper process on a scratch CNI conf dir.

The primary CNI is played the way the real ones behave: Calico's install-cni
rewrites its conflist in place (without netclaim) when calico-node restarts;
Cilium (exclusive mode) writes its own conflist and moves every other one
away. After each, netclaim must be back in the chain (last) of the file the
runtime uses, and every read of a conflist meanwhile must see a complete JSON
document whenever the keeper wrote it (temp file + rename). A conflist caught
half-written by its owner is left alone until it parses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploylib import DRIVER, REPO, netclaim_publisher_bin, python_env, terminate

PRIMARY = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [
    {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": True}},
]}


@pytest.fixture(scope="module")
def plugin_binary() -> Path:
    """The real self-contained plugin (scripts/build-plugin.sh, cached)."""
    proc = subprocess.run([str(REPO / "scripts" / "build-plugin.sh")], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"scripts/build-plugin.sh failed: {proc.stderr[-2000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


class Node:
    def __init__(self, root: Path) -> None:
        self.net_d = root / "etc" / "cni" / "net.d"
        self.bin_d = root / "opt" / "cni" / "bin"
        self.spool = root / "var" / "lib" / "netclaim" / "spool"
        self.journal = root / "var" / "lib" / "netclaim" / "publisher"
        for d in (self.net_d, self.bin_d, self.spool, self.journal):
            d.mkdir(parents=True)

    def write(self, name: str, doc: dict[str, Any], atomic: bool = True) -> bytes:
        data = json.dumps(doc, indent=1).encode()
        path = self.net_d / name
        if atomic:
            tmp = self.net_d / f".{name}.primary-tmp"
            tmp.write_bytes(data)
            os.replace(tmp, path)
        else:  # open(O_TRUNC) + write, the way a shell `cat > file` does
            path.write_bytes(data)
        return data

    def doc(self, name: str) -> dict[str, Any]:
        return json.loads((self.net_d / name).read_text())

    def chained(self, name: str) -> bool:
        try:
            plugins = self.doc(name)["plugins"]
        except (FileNotFoundError, ValueError):
            return False
        return plugins[-1]["type"] == "netclaim" and sum(p["type"] == "netclaim" for p in plugins) == 1


@pytest.fixture()
def node(tmp_root: Path) -> Node:
    return Node(tmp_root)


def keeper_argv(node: Node, plugin: Path, *extra: str) -> list[str]:
    return [str(netclaim_publisher_bin()), "chain-keeper", f"--cni-conf-dir={node.net_d}",
            f"--cni-bin-dir={node.bin_d}", f"--plugin-binary={plugin}", f"--driver-name={DRIVER}",
            "--request=nic", "--poll-interval=0.2", f"--cleanup-dir={node.spool.parent}", "--log-format=text", *extra]


@pytest.fixture()
def keeper(node: Node, plugin_binary: Path, tmp_root: Path) -> Iterator[subprocess.Popen[bytes]]:
    node.write("10-calico.conflist", PRIMARY)
    log = (tmp_root / "keeper.log").open("wb")
    proc = subprocess.Popen(keeper_argv(node, plugin_binary), stdout=log, stderr=subprocess.STDOUT, env=python_env())
    try:
        wait(lambda: node.chained("10-calico.conflist"), "the first chaining", proc, tmp_root)
        yield proc
    finally:
        terminate(proc)
        log.close()


def wait(check, what: str, proc: subprocess.Popen[bytes] | None = None, root: Path | None = None,
         timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    log = (root / "keeper.log").read_text() if root else ""
    pytest.fail(f"timed out waiting for {what}\n{log}")


class Reader(threading.Thread):
    """Reads every conflist in a loop; collects any read that is not a complete document."""

    def __init__(self, net_d: Path) -> None:
        super().__init__(daemon=True)
        self.net_d, self.bad, self.reads, self.stop = net_d, [], 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for path in self.net_d.glob("*.conflist"):
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                self.reads += 1
                try:
                    json.loads(data)
                except ValueError:
                    self.bad.append(data)


def test_plugin_installed_and_chained_last_with_a_backup_of_the_original(node: Node, keeper, plugin_binary) -> None:
    assert (node.bin_d / "netclaim").read_bytes() == plugin_binary.read_bytes()
    assert os.stat(node.bin_d / "netclaim").st_mode & 0o777 == 0o755
    assert [p["type"] for p in node.doc("10-calico.conflist")["plugins"]] == ["bridge", "portmap", "netclaim"]
    backup = json.loads((node.net_d / "10-calico.conflist.netclaim.bak").read_text())
    assert backup == PRIMARY


def test_calico_style_rewrite_in_place_is_rechained(node: Node, keeper, tmp_root: Path) -> None:
    reader = Reader(node.net_d)
    reader.start()
    try:
        for round_ in range(3):
            rewritten = dict(PRIMARY, name=f"k8s-pod-network-{round_}")
            node.write("10-calico.conflist", rewritten, atomic=True)
            wait(lambda: node.chained("10-calico.conflist") and
                 node.doc("10-calico.conflist")["name"] == rewritten["name"], "re-chaining", keeper, tmp_root)
            # The backup follows the primary's latest own version (what uninstall gives back).
            assert json.loads((node.net_d / "10-calico.conflist.netclaim.bak").read_text()) == rewritten
    finally:
        reader.stop.set()
        reader.join()
    assert reader.reads > 0 and reader.bad == []


def test_half_written_conflist_is_left_alone_until_it_parses(node: Node, keeper, tmp_root: Path) -> None:
    full = json.dumps(dict(PRIMARY, name="later"), indent=1).encode()
    (node.net_d / "10-calico.conflist").write_bytes(full[: len(full) // 2])
    time.sleep(1.0)  # five polls
    assert (node.net_d / "10-calico.conflist").read_bytes() == full[: len(full) // 2]
    assert keeper.poll() is None
    (node.net_d / "10-calico.conflist").write_bytes(full)  # the owner finishes, in place
    wait(lambda: node.chained("10-calico.conflist") and node.doc("10-calico.conflist")["name"] == "later",
         "chaining once the file parses", keeper, tmp_root)


def test_cilium_style_exclusive_rewrite_is_rechained_into_the_new_primary(node: Node, keeper, tmp_root) -> None:
    cilium = {"cniVersion": "0.3.1", "name": "cilium", "plugins": [{"type": "cilium-cni", "enable-debug": False}]}
    node.write("05-cilium.conflist", cilium)
    original = (node.net_d / "10-calico.conflist.netclaim.bak").read_bytes()
    os.rename(node.net_d / "10-calico.conflist", node.net_d / "10-calico.conflist.cilium_bak")
    wait(lambda: node.chained("05-cilium.conflist"), "chaining into the new primary", keeper, tmp_root)
    assert [p["type"] for p in node.doc("05-cilium.conflist")["plugins"]] == ["cilium-cni", "netclaim"]
    # Cilium restarts and writes its file again, without netclaim.
    node.write("05-cilium.conflist", cilium)
    wait(lambda: node.chained("05-cilium.conflist"), "re-chaining after Cilium's rewrite", keeper, tmp_root)
    # Cilium goes away (its file with it): the original is back, still chained, and primary again.
    os.rename(node.net_d / "10-calico.conflist.cilium_bak", node.net_d / "10-calico.conflist")
    (node.net_d / "05-cilium.conflist").unlink()
    wait(lambda: node.chained("10-calico.conflist") and not node.chained("05-cilium.conflist"),
         "chaining back into the original", keeper, tmp_root)
    # Its backup still holds the operator's original bytes (kept while the file was away), so
    # uninstall gives back exactly those, not a re-rendered copy; never a backup that chains netclaim.
    assert (node.net_d / "10-calico.conflist.netclaim.bak").read_bytes() == original
    assert json.loads(original) == PRIMARY


def test_sigterm_without_uninstall_keeps_the_node_chained(node: Node, keeper) -> None:
    (node.spool / "1-x.event.json").write_text("{}")
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(10) == 0
    assert node.chained("10-calico.conflist")
    assert (node.bin_d / "netclaim").exists() and (node.spool / "1-x.event.json").exists()


def test_uninstall_puts_the_node_back_byte_for_byte(node: Node, keeper, plugin_binary) -> None:
    original = (node.net_d / "10-calico.conflist.netclaim.bak").read_bytes()
    (node.spool / "1-x.event.json").write_text("{}")
    (node.journal / "journal.sqlite").write_text("x")
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(10) == 0
    proc = subprocess.run(keeper_argv(node, plugin_binary, "--uninstall"), capture_output=True, text=True,
                          env=python_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (node.net_d / "10-calico.conflist").read_bytes() == original
    assert sorted(os.listdir(node.net_d)) == ["10-calico.conflist"]
    assert not (node.bin_d / "netclaim").exists()
    assert list(node.spool.parent.iterdir()) == []  # spool and journal gone
