"""A plugin kept after an uninstall removes itself with the last teardown that needs it.

Real parts: the self-contained plugin executable (scripts/build-plugin.sh) in a
scratch CNI bin dir, the real `netclaim-publisher chain-keeper --uninstall`
that retires it, and a libcni-style cache dir (results/<network>-<containerID>-
<ifname>, the JSON document libcni writes at ADD with the conflist in base64)
that plays the runtime: an entry is removed only after its DEL returned, as
libcni does. The DELs are run as CRI-O runs them at teardown, with the cached
config's netclaim entry on stdin.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deploylib import DRIVER, netclaim_publisher_bin, python_env

NETWORK = "k8s-pod-network"
MARKER = ".netclaim-retired"


class RetiredNode:
    """A scratch node: conf dir, bin dir (another plugin and netclaim), the runtime's libcni cache."""

    def __init__(self, root: Path, plugin: Path) -> None:
        self.conf = root / "net.d"
        self.bin = root / "bin"
        self.cache = root / "cni-cache"
        self.socket = str(root / "run" / "publisher.sock")
        for d in (self.conf, self.bin, self.cache / "results"):
            d.mkdir(parents=True)
        (self.bin / "bridge").write_bytes(b"\x7fELF not really a bridge\n")
        self.before = self.files()
        shutil.copyfile(plugin, self.bin / "netclaim")
        os.chmod(self.bin / "netclaim", 0o755)
        self.conflist = {"cniVersion": "1.0.0", "name": NETWORK, "plugins": [
            {"type": "bridge", "bridge": "cni0"},
            {"type": "netclaim", "driverName": DRIVER, "socketPath": self.socket,
             "spoolDir": str(root / "spool")}]}

    def files(self) -> dict[str, bytes]:
        """The bin dir, byte for byte (hidden files included)."""
        return {p.name: p.read_bytes() for p in sorted(self.bin.iterdir())}

    def cache_add(self, container_id: str, ifname: str = "eth0", conflist: dict | None = None) -> Path:
        """What libcni writes at ADD: the config it ran, which CRI-O tears the sandbox down with."""
        doc = {"kind": "cniCacheV1", "containerId": container_id, "ifName": ifname, "networkName": NETWORK,
               "config": base64.b64encode(json.dumps(conflist or self.conflist).encode()).decode(),
               "result": {"cniVersion": "1.0.0", "interfaces": [{"name": ifname, "sandbox": "/run/netns/x"}]}}
        path = self.cache / "results" / f"{NETWORK}-{container_id}-{ifname}"
        path.write_text(json.dumps(doc))
        return path

    def retire(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """The keeper's final pass by hand: unchain, and keep the plugin while the cache still runs it."""
        proc = subprocess.run([str(netclaim_publisher_bin()), "chain-keeper", "--uninstall",
                               f"--driver-name={DRIVER}", f"--cni-conf-dir={self.conf}", f"--cni-bin-dir={self.bin}",
                               f"--plugin-socket={self.socket}", f"--cni-cache-dir={self.cache}",
                               "--log-format=text", *extra], capture_output=True, text=True, env=python_env(),
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc

    def delete(self, container_id: str, ifname: str = "eth0", command: str = "DEL",
               start_only: bool = False) -> subprocess.Popen[bytes] | subprocess.CompletedProcess[bytes]:
        """The cached config's netclaim DEL, then libcni drops the entry (only once DEL returned)."""
        [entry] = [p for p in self.conflist["plugins"] if p["type"] == "netclaim"]
        stdin = json.dumps({**entry, "name": NETWORK, "cniVersion": "1.1.0" if command == "GC" else "1.0.0",
                            **({"cni.dev/valid-attachments": []} if command == "GC" else {})}).encode()
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id if command == "DEL" else "",
               "CNI_NETNS": "", "CNI_IFNAME": ifname if command == "DEL" else "", "CNI_PATH": str(self.bin),
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",
               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        proc = subprocess.Popen([str(self.bin / "netclaim")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        if start_only:
            proc.stdin.write(stdin)  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            return proc  # blocked reading stdin until `wait_del` closes it
        out, err = proc.communicate(stdin, timeout=60)
        if command == "DEL":
            (self.cache / "results" / f"{NETWORK}-{container_id}-{ifname}").unlink(missing_ok=True)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_del(proc: subprocess.Popen[bytes]) -> subprocess.CompletedProcess[bytes]:
    """Let a started DEL go on (end of its stdin) and collect it."""
    if not proc.stdin.closed:  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    out = proc.stdout.read()  # type: ignore[union-attr]
    err = proc.stderr.read()  # type: ignore[union-attr]
    proc.wait(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture()
def node(tmp_root: Path, plugin_binary: Path) -> RetiredNode:
    return RetiredNode(tmp_root, plugin_binary)


def assert_quiet(proc: subprocess.CompletedProcess[bytes]) -> None:
    """A retired DEL/GC: exit 0, nothing on stdout (the runtime reads the result there)."""
    assert (proc.returncode, proc.stdout) == (0, b""), proc.stderr


def test_the_last_cached_sandboxs_del_removes_the_kept_plugin_and_its_marker(node: RetiredNode) -> None:
    node.cache_add("aaa111")
    node.cache_add("bbb222")
    said = node.retire().stderr
    assert "plugin kept" in said, said
    marker = node.bin / MARKER
    assert json.loads(marker.read_bytes()) == {"cacheDir": str(node.cache), "socketPath": node.socket}
    assert marker.stat().st_mode & 0o777 == 0o644

    assert_quiet(node.delete("aaa111"))
    assert (node.bin / "netclaim").is_file() and marker.is_file(), "another sandbox's teardown still runs it"
    assert_quiet(node.delete("bbb222"))
    assert node.files() == node.before  # the bin dir as before the install, byte for byte
    assert not (node.cache / "results").joinpath(f"{NETWORK}-bbb222-eth0").exists()


def test_on_a_runtime_that_tears_down_with_its_loaded_config_the_plugin_goes_at_once(node: RetiredNode) -> None:
    """containerd runs DEL with the config it has loaded: once unchained, no cached config runs netclaim
    again, so nothing would ever come to remove a kept plugin."""
    node.cache_add("aaa111")
    said = node.retire("--runtime-teardown=loaded-config").stderr
    assert "plugin removed" in said, said
    assert node.files() == node.before


def test_two_last_dels_at_once_leave_nothing_behind(node: RetiredNode) -> None:
    """Each sees the other's cache entry (libcni drops it only after the DEL): one of them still removes."""
    node.cache_add("ccc333")
    node.cache_add("ddd444")
    node.retire()
    started = [node.delete(cid, start_only=True) for cid in ("ccc333", "ddd444")]
    for proc in started:
        proc.stdin.close()  # type: ignore[union-attr]  # both go on at once
    for proc in started:
        assert_quiet(wait_del(proc))  # type: ignore[arg-type]
    for cid in ("ccc333", "ddd444"):
        (node.cache / "results" / f"{NETWORK}-{cid}-eth0").unlink()
    assert node.files() == node.before


def test_a_sandbox_without_netclaim_in_its_cached_config_does_not_keep_the_plugin(node: RetiredNode) -> None:
    node.cache_add("eee555")
    node.retire()
    # Created after the uninstall: its cached config no longer chains netclaim.
    node.cache_add("fff666", conflist={**node.conflist, "plugins": node.conflist["plugins"][:1]})
    assert_quiet(node.delete("eee555"))
    assert node.files() == node.before


def test_gc_of_the_retired_plugin_removes_it_once_nothing_is_cached(node: RetiredNode) -> None:
    node.cache_add("ggg777")
    node.retire()
    (node.cache / "results" / f"{NETWORK}-ggg777-eth0").unlink()  # torn down by a runtime that had reloaded
    assert_quiet(node.delete("", command="GC"))
    assert node.files() == node.before


def test_a_reinstall_before_the_del_is_not_removed(node: RetiredNode, plugin_binary: Path) -> None:
    node.cache_add("hhh888")
    node.retire()
    proc = subprocess.run([str(netclaim_publisher_bin()), "chain-keeper", "--once", f"--cni-conf-dir={node.conf}",
                           f"--cni-bin-dir={node.bin}", f"--plugin-binary={plugin_binary}",
                           f"--driver-name={DRIVER}", "--log-format=text"],
                          capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not (node.bin / MARKER).exists()  # installed again: the plugin works again
    node.delete("hhh888")
    assert (node.bin / "netclaim").read_bytes() == plugin_binary.read_bytes()


def test_a_reinstall_while_the_del_runs_is_not_removed(node: RetiredNode, plugin_binary: Path) -> None:
    """The DEL runs the old executable; a new one is renamed into place before the DEL looks (the
    marker not removed yet, as between the keeper's two steps). The new file stays."""
    node.cache_add("iii999")
    node.retire()
    running = node.delete("iii999", start_only=True)  # exec'd: it runs the old inode, blocked on stdin
    fresh = node.bin / ".netclaim.new"
    shutil.copyfile(plugin_binary, fresh)
    os.chmod(fresh, 0o755)
    inode = fresh.stat().st_ino
    os.replace(fresh, node.bin / "netclaim")
    assert_quiet(wait_del(running))  # type: ignore[arg-type]
    assert (node.bin / "netclaim").stat().st_ino == inode, "the freshly installed executable was removed"


@pytest.mark.parametrize("content", [
    b"",  # the marker of an older keeper: it names no cache dir
    b'{"cacheDir": "relative/cache"}',
    b'{"cacheDir": "/tmp/\\u0000/x"}',
    b'{"cacheDir": ["/"]}',
    b'["/var/lib/cni"]',
    b'{"cacheDir": "/nonexistent", "pad": "' + b"x" * 5000 + b'"}',
    b"\xff\xfe not json",
    "symlink",
], ids=["empty", "relative", "nul", "not-a-string", "not-an-object", "oversized", "garbage", "symlink"])
def test_a_hostile_marker_is_ignored_and_the_del_still_succeeds(node: RetiredNode, tmp_root: Path,
                                                                content: bytes | str) -> None:
    """Nothing cached, but the marker does not name a cache dir the plugin may trust: both files stay."""
    marker = node.bin / MARKER
    if content == "symlink":
        target = tmp_root / "elsewhere.json"
        target.write_text(json.dumps({"cacheDir": str(node.cache)}))
        marker.symlink_to(target)
    else:
        marker.write_bytes(content)  # type: ignore[arg-type]
    kept = node.files() if content != "symlink" else None
    assert_quiet(node.delete("jjj000"))
    assert (node.bin / "netclaim").is_file() and os.path.lexists(marker)
    if kept is not None:
        assert node.files() == kept
