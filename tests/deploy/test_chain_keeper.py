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

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deploylib import DRIVER, REPO, netclaim_publisher_bin, python_env, terminate
from publisher import limits

PRIMARY = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [
    {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": True}},
]}


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


@contextlib.contextmanager
def running_keeper(node: Node, plugin: Path, root: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """The real keeper process, its log in ROOT/keeper.log; stopped (SIGTERM, no uninstall) at the end."""
    log = (root / "keeper.log").open("ab")
    proc = subprocess.Popen(keeper_argv(node, plugin, *extra), stdout=log, stderr=subprocess.STDOUT,
                            env=python_env())
    try:
        yield proc
    finally:
        terminate(proc)
        log.close()


@pytest.fixture()
def keeper(node: Node, plugin_binary: Path, tmp_root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A keeper that has chained 10-calico.conflist."""
    node.write("10-calico.conflist", PRIMARY)
    with running_keeper(node, plugin_binary, tmp_root) as proc:
        wait(lambda: node.chained("10-calico.conflist"), "the first chaining", proc, tmp_root)
        yield proc


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


# ---------------------------------------------------------------- fights, races, .conf primaries

METRICS = "--metrics-address=127.0.0.1:0"


def keeper_log(root: Path) -> str:
    return (root / "keeper.log").read_text(errors="replace")


def metrics_port(proc: subprocess.Popen[bytes], root: Path) -> int:
    found: list[int] = []

    def listening() -> bool:
        m = re.search(r"chain keeper metrics .*port=(\d+)", keeper_log(root))
        if m:
            found.append(int(m.group(1)))
        return bool(m)

    wait(listening, "the metrics server", proc, root)
    return found[0]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(port: int, name: str, conflist: str) -> float:
    """One series of the keeper's /metrics (0 when absent)."""
    _code, text = get(port, "/metrics")
    m = re.search(rf'^{name}{{conflist="{re.escape(conflist)}"}} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def dir_state(net_d: Path) -> tuple:
    out = []
    for name in sorted(os.listdir(net_d)):
        try:
            st = os.stat(net_d / name)
        except FileNotFoundError:
            continue
        out.append((name, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class OtherWriter(threading.Thread):
    """Another program that owns (part of) the conf dir: `react` runs on every directory change,
    must be idempotent (it runs once more after its own write) and returns True when it wrote;
    `rewrites` counts those."""

    def __init__(self, node: Node, react: Callable[[Node], bool]) -> None:
        super().__init__(daemon=True)
        self.node, self.react, self.rewrites, self.stop = node, react, 0, threading.Event()

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            # The snapshot is taken before `react` reads: a keeper write landing while `react` runs
            # differs from it and is looked at next time (a snapshot taken after `react` absorbed
            # such a write, and this writer then never undid it). After its own write it looks
            # again; `react` is idempotent, so that second look writes nothing.
            now = dir_state(self.node.net_d)
            if now != last:
                try:
                    wrote = self.react(self.node)
                    self.rewrites += wrote
                except (FileNotFoundError, ValueError):
                    wrote = True  # read while another writer renamed: look again
                last = None if wrote else now
            time.sleep(0.02)

    def __enter__(self) -> "OtherWriter":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()


CILIUM = {"cniVersion": "0.3.1", "name": "cilium", "plugins": [{"type": "cilium-cni", "enable-debug": False}]}


def cilium_exclusive(node: Node) -> bool:
    """Cilium's cni.exclusive: its conflist exactly as it renders it, every other network file moved away."""
    wrote = False
    if (node.net_d / "05-cilium.conflist").read_bytes() != json.dumps(CILIUM, indent=1).encode():
        node.write("05-cilium.conflist", CILIUM)
        wrote = True
    for path in node.net_d.iterdir():
        if path.name != "05-cilium.conflist" and path.name.endswith((".conf", ".conflist", ".json")):
            os.rename(path, path.with_name(path.name + ".cilium_bak"))
            wrote = True
    return wrote


def appends_itself_last(plugin_type: str) -> Callable[[Node], bool]:
    """istio-cni / linkerd-cni: their entry last in the primary conflist, re-done on every change."""

    def react(node: Node) -> bool:
        doc = node.doc("10-calico.conflist")
        if doc["plugins"][-1]["type"] == plugin_type:
            return False
        doc["plugins"] = [p for p in doc["plugins"] if p["type"] != plugin_type] + [{"type": plugin_type}]
        node.write("10-calico.conflist", doc)
        return True

    return react


def side_by_side(seconds: float, keeper: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert keeper.poll() is None, "the keeper exited"
        time.sleep(0.5)


def test_cilium_exclusive_watcher_no_loop_and_the_contest_is_reported(node: Node, plugin_binary,
                                                                                    tmp_root: Path) -> None:
    node.write("05-cilium.conflist", CILIUM)
    with OtherWriter(node, cilium_exclusive) as cilium, \
            running_keeper(node, plugin_binary, tmp_root, METRICS) as keeper:
        port = metrics_port(keeper, tmp_root)
        # However slow the machine, CHAIN_WRITES_MAX + 1 keeper writes make it contested (the old
        # keeper re-chained on every poll and never stopped: well over 100 rewrites in 35 s).
        wait(lambda: sample(port, "netclaim_chain_contested", "05-cilium.conflist") == 1, "the contest",
             keeper, tmp_root, timeout=120)
        writes = sample(port, "netclaim_chain_rewrites_total", "05-cilium.conflist")
        assert 1 <= writes <= limits.CHAIN_WRITES_MAX + 1, f"{writes} writes before the contest"
        undone = cilium.rewrites
        side_by_side(30, keeper)
        # Then only the backed-off retries (after 10 s, then 20 s more): at most 2 keeper writes and
        # the watcher's answer to each.
        assert sample(port, "netclaim_chain_rewrites_total", "05-cilium.conflist") - writes <= 2
        assert cilium.rewrites - undone <= 2, f"{cilium.rewrites - undone} rewrites in 30 s: a loop\n" \
            f"{keeper_log(tmp_root)}"
        assert sample(port, "netclaim_chain_contested", "05-cilium.conflist") == 1
        code, body = get(port, "/readyz")
        assert code == 200 and "contested=05-cilium.conflist" in body, body
        assert "chain contested: backing off" in keeper_log(tmp_root)


@pytest.mark.parametrize("chainer", ["istio-cni", "linkerd-cni"])
def test_a_chainer_that_moves_itself_last_converges(node: Node, plugin_binary, tmp_root: Path,
                                                                  chainer: str) -> None:
    node.write("10-calico.conflist", PRIMARY)
    with OtherWriter(node, appends_itself_last(chainer)) as other, \
            running_keeper(node, plugin_binary, tmp_root, METRICS) as keeper:
        port = metrics_port(keeper, tmp_root)
        side_by_side(30, keeper)
        types = [p["type"] for p in node.doc("10-calico.conflist")["plugins"]]
        assert types == ["bridge", "portmap", "netclaim", chainer], types
        assert other.rewrites <= 2, f"{other.rewrites} rewrites: a loop\n{keeper_log(tmp_root)}"
        assert sample(port, "netclaim_chain_rewrites_total", "10-calico.conflist") <= 2
        assert sample(port, "netclaim_chained", "10-calico.conflist") == 1
        assert sample(port, "netclaim_chain_contested", "10-calico.conflist") == 0
        code, body = get(port, "/readyz")
        assert code == 200 and body.startswith("chained conflist=10-calico.conflist"), body


@pytest.mark.parametrize("primary", ["calico-in-place", "flannel-copy"])
def test_a_primary_that_rewrites_now_and_then_is_rechained_without_a_contest(
        node: Node, plugin_binary, tmp_root: Path, primary: str) -> None:
    """Calico's install-cni rewrites its file in place on restart; flannel's copies its conflist again."""
    name = "10-calico.conflist" if primary.startswith("calico") else "10-flannel.conflist"
    node.write(name, PRIMARY, atomic=False)
    with running_keeper(node, plugin_binary, tmp_root, METRICS) as keeper:
        port = metrics_port(keeper, tmp_root)
        for mtu in (1500, 1450, 1400):
            time.sleep(8)
            node.write(name, dict(PRIMARY, mtu=mtu), atomic=False)
            wait(lambda: node.chained(name) and node.doc(name).get("mtu") == mtu, "re-chaining", keeper, tmp_root)
        # the first chaining and 3 restarts (counted just after each write)
        wait(lambda: sample(port, "netclaim_chain_rewrites_total", name) == 4, "4 rewrites counted", keeper, tmp_root)
        assert sample(port, "netclaim_chain_contested", name) == 0
        # The keeper updates its status after its pass, a moment after the file shows netclaim.
        wait(lambda: get(port, "/readyz")[0] == 200, "ready once chained", keeper, tmp_root)


MULTUS = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus-shim",
          "socketDir": "/run/multus/", "logLevel": "verbose"}


def multus_auto_config(node: Node) -> bool:
    """Multus' auto-generated 00-multus.conf, re-rendered when its master (the next network file) changes."""
    master = node.doc("10-flannel.conflist")
    want = dict(MULTUS, delegates=[master])
    try:
        if node.doc("00-multus.conf") == want:
            return False
    except FileNotFoundError:
        pass
    node.write("00-multus.conf", want)
    return True


def test_multus_conf_is_left_alone_and_its_delegate_chained(node: Node, plugin_binary,
                                                                         tmp_root: Path) -> None:
    node.write("10-flannel.conflist", PRIMARY)
    with OtherWriter(node, multus_auto_config) as multus, \
            running_keeper(node, plugin_binary, tmp_root, METRICS) as keeper:
        port = metrics_port(keeper, tmp_root)
        side_by_side(20, keeper)
        assert node.chained("10-flannel.conflist")
        doc = node.doc("00-multus.conf")
        assert doc["type"] == "multus-shim" and doc["delegates"][0]["plugins"][-1]["type"] == "netclaim"
        assert sorted(os.listdir(node.net_d)) == ["00-multus.conf", "10-flannel.conflist",
                                                   "10-flannel.conflist.netclaim.bak"]
        assert multus.rewrites <= 3
        assert sample(port, "netclaim_chain_rewrites_total", "10-flannel.conflist") == 1


def pauses(root: Path, point: str) -> int:
    return keeper_log(root).count(f"test pause point={point}")


def test_a_rewrite_right_after_the_keepers_write_is_not_taken_for_done(node: Node, plugin_binary,
                                                                                     tmp_root: Path) -> None:
    node.write("10-calico.conflist", PRIMARY)
    with running_keeper(node, plugin_binary, tmp_root, "--test-pause=after-write=2") as keeper:
        wait(lambda: pauses(tmp_root, "after-write") >= 1, "the keeper's first write", keeper, tmp_root)
        assert node.chained("10-calico.conflist")
        # The primary CNI rewrites its file while the keeper is just past its own write.
        node.write("10-calico.conflist", dict(PRIMARY, name="after"))
        wait(lambda: node.chained("10-calico.conflist") and node.doc("10-calico.conflist")["name"] == "after",
             "re-chaining the rewrite that landed right after the keeper's write", keeper, tmp_root, timeout=30)


def test_a_new_primary_written_while_the_keeper_finishes_its_pass_is_chained(node: Node, plugin_binary,
                                                                              tmp_root: Path) -> None:
    """Regression (CI, stop 22): another installer renamed a new primary into place after the keeper had
    picked 10-calico and before it recorded the directory as settled; the keeper took the new file for
    seen and never chained it."""
    node.write("10-calico.conflist", PRIMARY)
    with running_keeper(node, plugin_binary, tmp_root, "--test-pause=after-write=2") as keeper:
        wait(lambda: pauses(tmp_root, "after-write") >= 1, "the keeper's first write", keeper, tmp_root)
        node.write("05-new.conflist", {**PRIMARY, "name": "new"})
        wait(lambda: node.chained("05-new.conflist") and not node.chained("10-calico.conflist"),
             "chaining the primary that appeared mid-pass", keeper, tmp_root, timeout=30)


def test_a_write_mid_edit_is_not_reverted(node: Node, plugin_binary, tmp_root: Path) -> None:
    node.write("10-calico.conflist", dict(PRIMARY, mtu=1500))
    with running_keeper(node, plugin_binary, tmp_root, "--test-pause=before-replace=2") as keeper:
        wait(lambda: pauses(tmp_root, "before-replace") >= 1, "the keeper's first edit", keeper, tmp_root)
        # Mid-edit (read, not yet replaced), the primary CNI changes its MTU.
        node.write("10-calico.conflist", dict(PRIMARY, mtu=1450))
        wait(lambda: node.chained("10-calico.conflist"), "chaining", keeper, tmp_root, timeout=30)
        assert node.doc("10-calico.conflist")["mtu"] == 1450, "the primary's MTU change was reverted"
        assert "changed while being edited" in keeper_log(tmp_root)
        backup = json.loads((node.net_d / "10-calico.conflist.netclaim.bak").read_text())
        assert backup["mtu"] == 1450


SINGLE = b'{\n\t"cniVersion": "0.4.0",\n\t"name": "podnet",\n\t"type": "bridge",\n\t"bridge": "cni0",\n' \
         b'\t"ipam": {"type": "host-local", "subnet": "10.22.0.0/16"}\n}\n'


def test_single_plugin_conf_primary_is_converted_chained_and_restored(node: Node, plugin_binary,
                                                                                    tmp_root: Path) -> None:
    (node.net_d / "10-bridge.conf").write_bytes(SINGLE)
    (node.net_d / "20-other.conflist").write_text(json.dumps(PRIMARY))
    with running_keeper(node, plugin_binary, tmp_root, METRICS) as keeper:
        port = metrics_port(keeper, tmp_root)
        wait(lambda: node.chained("10-bridge.conflist") and not (node.net_d / "10-bridge.conf").exists(),
             "converting and chaining the .conf", keeper, tmp_root)
        doc = node.doc("10-bridge.conflist")
        # libcni's ConfListFromConf: name and cniVersion lifted, the whole conf is plugins[0].
        assert doc["name"] == "podnet" and doc["cniVersion"] == "0.4.0"
        assert doc["plugins"][0] == json.loads(SINGLE) and len(doc["plugins"]) == 2
        # Still the network the runtime picks: the first network file by name.
        networks = sorted(n for n in os.listdir(node.net_d) if n.endswith((".conf", ".conflist", ".json")))
        assert networks[0] == "10-bridge.conflist"
        assert not node.chained("20-other.conflist")
        wait(lambda: get(port, "/readyz")[0] == 200, "ready once chained", keeper, tmp_root)
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(10) == 0
    proc = subprocess.run(keeper_argv(node, plugin_binary, "--uninstall"), capture_output=True, text=True,
                          env=python_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (node.net_d / "10-bridge.conf").read_bytes() == SINGLE
    assert sorted(os.listdir(node.net_d)) == ["10-bridge.conf", "20-other.conflist"]


def test_another_networks_entry_is_left_alone(node: Node, plugin_binary, tmp_root: Path) -> None:
    """containerd's own multi-network: 11-storage.conflist is the pods' eth1 and the operator chained netclaim
    into it with its own request. The keeper keeps its entry in the primary, and when the primary changes it
    moves only its own entry (driver and request as configured): the other network's stays, untouched."""
    node.write("10-calico.conflist", PRIMARY)
    storage = {"cniVersion": "1.0.0", "name": "storage", "plugins": [
        PRIMARY["plugins"][0], {"type": "netclaim", "driverName": DRIVER, "request": "nic1"}]}
    stored = node.write("11-storage.conflist", storage)
    with running_keeper(node, plugin_binary, tmp_root) as keeper:
        wait(lambda: node.chained("10-calico.conflist"), "the first chaining", keeper, tmp_root)
        # A new primary ahead of both: the keeper's entry moves there, out of 10-calico; eth1's stays.
        node.write("05-new.conflist", {**PRIMARY, "name": "new"})
        wait(lambda: node.chained("05-new.conflist") and not node.chained("10-calico.conflist"),
             "the keeper's entry moving to the new primary", keeper, tmp_root)
        time.sleep(1.0)  # five more polls
        assert (node.net_d / "11-storage.conflist").read_bytes() == stored
        assert [(p["type"], p.get("request")) for p in node.doc("05-new.conflist")["plugins"]][-1] == (
            "netclaim", "nic")


def test_uninstall_strips_only_the_keepers_entry_and_leaves_another_networks_conflist(
        node: Node, plugin_binary: Path, tmp_root: Path) -> None:
    """An operator's second network (containerd's multi-network, or a file a NetworkAttachmentDefinition's
    chain is copied from) chains netclaim with its own request: the running keeper never touches it, and
    neither may its uninstall. The keeper's own conflist gets its original bytes back."""
    original = node.write("10-calico.conflist", PRIMARY)
    storage = {"cniVersion": "1.0.0", "name": "storage", "plugins": [
        PRIMARY["plugins"][0], {"type": "netclaim", "driverName": DRIVER, "request": "nic1"}]}
    stored = node.write("11-storage.conflist", storage)
    other_driver = {"cniVersion": "1.0.0", "name": "sriov", "plugins": [
        {"type": "sriov"}, {"type": "netclaim", "driverName": "sriov.example.com", "request": "nic"}]}
    sriov = node.write("12-sriov.conflist", other_driver)
    with running_keeper(node, plugin_binary, tmp_root) as keeper:
        wait(lambda: node.chained("10-calico.conflist"), "the first chaining", keeper, tmp_root)
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(10) == 0
    proc = subprocess.run(keeper_argv(node, plugin_binary, "--uninstall"), capture_output=True, text=True,
                          env=python_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (node.net_d / "10-calico.conflist").read_bytes() == original  # the managed one: stripped
    assert (node.net_d / "11-storage.conflist").read_bytes() == stored, "uninstall stripped another network's entry"
    assert (node.net_d / "12-sriov.conflist").read_bytes() == sriov
    assert sorted(os.listdir(node.net_d)) == ["10-calico.conflist", "11-storage.conflist", "12-sriov.conflist"]


def test_uninstall_by_hand_names_the_entry_it_removes(node: Node, plugin_binary: Path) -> None:
    """Without --driver-name the hand uninstall cannot tell its entry from another network's: it says so."""
    argv = [a for a in keeper_argv(node, plugin_binary, "--uninstall") if not a.startswith("--driver-name")]
    proc = subprocess.run(argv, capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.returncode == 2 and "--uninstall needs --driver-name" in proc.stderr, proc.stderr


def test_uninstall_by_hand_waits_its_turn_on_the_node_lock(node: Node, plugin_binary: Path, tmp_root: Path) -> None:
    """While a keeper holds the node lock (it would chain netclaim back in at once), the hand uninstall
    refuses with the reason and changes nothing; once the keeper stopped it cleans, lock files included."""
    node.write("10-calico.conflist", PRIMARY)
    lock = f"--lock-dir={node.spool.parent}"
    with running_keeper(node, plugin_binary, tmp_root, lock) as keeper:
        wait(lambda: node.chained("10-calico.conflist"), "the first chaining", keeper, tmp_root)
        proc = subprocess.run(keeper_argv(node, plugin_binary, "--uninstall", lock), capture_output=True,
                              text=True, env=python_env(), timeout=60)
        assert proc.returncode == 1 and "a chain keeper runs on this node" in proc.stderr, proc.stderr
        assert node.chained("10-calico.conflist") and (node.bin_d / "netclaim").exists()
    proc = subprocess.run(keeper_argv(node, plugin_binary, "--uninstall", lock), capture_output=True, text=True,
                          env=python_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not node.chained("10-calico.conflist") and not (node.bin_d / "netclaim").exists()
    assert list(node.spool.parent.iterdir()) == []


def test_not_chained_is_not_ready_and_logged_once(node: Node, plugin_binary, tmp_root: Path) -> None:
    (node.net_d / "10-broken.conflist").write_bytes(b'{"plugins": [')
    with running_keeper(node, plugin_binary, tmp_root, METRICS) as keeper:
        port = metrics_port(keeper, tmp_root)
        # Not ready from the start: first while the conf dir is not read yet, then for the broken file.
        assert get(port, "/readyz")[0] == 503
        wait(lambda: get(port, "/readyz")[1].startswith("not chained conflist=10-broken.conflist"), "the reason",
             keeper, tmp_root)
        code, body = get(port, "/readyz")
        assert code == 503 and "not valid JSON" in body, body
        assert sample(port, "netclaim_chained", "10-broken.conflist") == 0
        time.sleep(2)  # ten polls
        assert keeper_log(tmp_root).count("chain status") == 1, keeper_log(tmp_root)
        (node.net_d / "10-broken.conflist").write_text(json.dumps(PRIMARY))
        wait(lambda: get(port, "/readyz")[0] == 200, "ready once chained", keeper, tmp_root)
        assert sample(port, "netclaim_chained", "10-broken.conflist") == 1


@pytest.mark.controlplane
def test_the_contest_is_a_warning_event_on_the_node(node: Node, plugin_binary, tmp_root: Path,
                                                                control_plane, api_client) -> None:
    from kubernetes import client

    node_name = f"node-{os.urandom(3).hex()}"

    def contested() -> list[dict[str, Any]]:
        resp = client.EventsV1Api(api_client).list_namespaced_event("default", _preload_content=False)
        return [e for e in json.loads(resp.data)["items"]
                if e.get("reason") == "ChainContested" and e["regarding"].get("name") == node_name]

    node.write("05-cilium.conflist", CILIUM)
    with OtherWriter(node, cilium_exclusive), \
            running_keeper(node, plugin_binary, tmp_root, f"--node-name={node_name}",
                           f"--kubeconfig={control_plane.kubeconfig}") as keeper:
        wait(lambda: bool(contested()), "the ChainContested Event", keeper, tmp_root, timeout=60)
        event = contested()[0]
        assert event["type"] == "Warning" and event["regarding"]["kind"] == "Node"
        assert event["regarding"]["uid"] == node_name  # as the kubelet's: `kubectl describe node` shows it
        assert "05-cilium.conflist" in event["note"]
        assert event["reportingController"] == "netclaim.dev/publisher" and event["action"] == "ChainPlugin"


def test_the_keeper_logs_at_its_log_level_in_dated_text_or_json_with_msg(node: Node, plugin_binary) -> None:
    node.write("10-calico.conflist", PRIMARY)
    once = subprocess.run(keeper_argv(node, plugin_binary, "--once"), capture_output=True, text=True,
                          env=python_env(), timeout=60)
    assert once.returncode == 0, once.stderr
    lines = once.stderr.splitlines()
    assert any(" INFO " in line and "netclaim chained" in line for line in lines), once.stderr
    # Text lines start with the time in ISO 8601, UTC.
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR|DEBUG) ", line)
               for line in lines), once.stderr
    node.write("10-calico.conflist", PRIMARY)
    quiet = subprocess.run(keeper_argv(node, plugin_binary, "--once", "--log-level=warning"), capture_output=True,
                           text=True, env=python_env(), timeout=60)
    assert quiet.returncode == 0 and node.chained("10-calico.conflist"), quiet.stderr
    assert " INFO " not in quiet.stderr, quiet.stderr
    node.write("10-calico.conflist", PRIMARY)
    json_lines = subprocess.run(keeper_argv(node, plugin_binary, "--once", "--log-format=json"), capture_output=True,
                                text=True, env={**python_env(), "NETCLAIM_LOG_LEVEL": "info"}, timeout=60)
    records = [json.loads(line) for line in json_lines.stderr.splitlines()]
    assert records and all(list(r)[:3] == ["ts", "level", "msg"] and "event" not in r for r in records), records
    assert any(r["msg"] == "netclaim chained" and r["conflist"] == "10-calico.conflist" for r in records), records


# ---------------------------------------------------------------- liveness: the loop turns, waiting is alive


def probes_port(proc: subprocess.Popen[bytes], root: Path) -> int:
    found: list[int] = []

    def listening() -> bool:
        m = re.search(r"chain keeper probes .*port=(\d+)", keeper_log(root))
        if m:
            found.append(int(m.group(1)))
        return bool(m)

    wait(listening, "the probe listener", proc, root)
    return found[0]


def test_heartbeat_fails_a_loop_that_stopped_turning_and_never_a_wait_or_a_stop() -> None:
    from publisher.keeper.heartbeat import KEEPING, STOPPING, WAITING, Heartbeat, stall_after

    clock = [1000.0]
    beat = Heartbeat(stall_after=5.0, now=lambda: clock[0])
    beat.enter(KEEPING)
    for _ in range(10):  # a loop turning every second stays alive
        clock[0] += 1.0
        beat.beat()
        assert beat.live() == (True, "")
    clock[0] += 5.7  # stuck in a pass
    alive, why = beat.live()
    assert not alive and "no turn for 6s" in why and KEEPING in why, why
    beat.beat()  # the pass ended
    assert beat.live()[0]
    beat.enter(WAITING)  # the node lock held by another install's keeper: however long
    clock[0] += 3600.0
    alive, why = beat.live()
    assert alive and why.startswith(WAITING), why
    beat.enter(STOPPING)
    clock[0] += 600.0
    assert beat.live()[0]
    # The default limit: many poll intervals, never less than a minute.
    assert stall_after(1.0) == 60.0 and stall_after(0.2) == 60.0 and stall_after(5.0) == 300.0
    assert stall_after(1.0, given=3.0) == 3.0


def test_a_keeper_stuck_in_a_pass_fails_healthz_and_recovers_when_the_pass_ends(node: Node, plugin_binary,
                                                                               tmp_root: Path) -> None:
    """The real keeper, its pass held inside an edit of the conflist (the test pause stands for a hung write):
    /healthz on the probe listener turns 503 once the loop has not turned for --stall-after, naming why; the
    same pass ending makes it 200 again. Readiness is another matter and is not touched by this."""
    node.write("10-calico.conflist", PRIMARY)
    with running_keeper(node, plugin_binary, tmp_root, "--probe-address=127.0.0.1:0", "--stall-after=1",
                        "--test-pause=before-replace=6") as keeper:
        port = probes_port(keeper, tmp_root)
        wait(lambda: "test pause" in keeper_log(tmp_root), "the pass to stop in its edit", keeper, tmp_root)
        wait(lambda: get(port, "/healthz")[0] == 503, "/healthz to fail while the pass is stuck", keeper, tmp_root,
             timeout=5)
        code, body = get(port, "/healthz")
        assert code == 503 and "no turn for" in body and "keeping the chain" in body, body
        assert not node.chained("10-calico.conflist")
        wait(lambda: node.chained("10-calico.conflist"), "the pass to end", keeper, tmp_root)
        wait(lambda: get(port, "/healthz")[0] == 200, "/healthz to pass once the loop turns", keeper, tmp_root,
             timeout=5)
        for _ in range(10):  # a turning loop stays alive, well past --stall-after
            assert get(port, "/healthz")[0] == 200
            time.sleep(0.2)


def test_a_keeper_waiting_for_the_node_lock_stays_alive_but_not_ready(node: Node, plugin_binary,
                                                                     tmp_root: Path) -> None:
    """Another install's keeper holds the node lock (here the test holds it): the new keeper waits, its
    probe listener already up. /healthz stays 200 for many times --stall-after (waiting is how a new install
    takes turns; a restart would only wait again), /readyz stays 503; once the lock is let go the keeper
    chains the node and turns ready."""
    from publisher.nodelock import NodeLock

    node.write("10-calico.conflist", PRIMARY)
    lock_dir = node.spool.parent
    holder = NodeLock(lock_dir)
    holder.claim()
    assert holder.acquire(wait=False)
    try:
        with running_keeper(node, plugin_binary, tmp_root, "--probe-address=127.0.0.1:0", "--stall-after=1",
                            f"--lock-dir={lock_dir}") as keeper:
            port = probes_port(keeper, tmp_root)
            wait(lambda: "waiting for the node lock" in keeper_log(tmp_root), "the wait for the lock", keeper,
                 tmp_root)
            deadline = time.monotonic() + 4.0  # four times --stall-after
            while time.monotonic() < deadline:
                code, body = get(port, "/healthz")
                assert code == 200 and body.startswith("waiting for the node lock"), (code, body)
                assert get(port, "/readyz")[0] == 503
                time.sleep(0.25)
            assert keeper.poll() is None and not node.chained("10-calico.conflist")
            holder.release()
            wait(lambda: node.chained("10-calico.conflist"), "the chain once the lock is the keeper's", keeper,
                 tmp_root)
            wait(lambda: get(port, "/readyz")[0] == 200, "ready once chained", keeper, tmp_root)
            assert get(port, "/healthz")[0] == 200
    finally:
        holder.release()
