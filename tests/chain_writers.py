"""Other programs that write a node's CNI conf dir, played the way the real ones behave.

Shared by the tests that run them side by side with netclaim's chain keeper in
a real node's conf dir (tests/cluster/test_chain_coexistence.py). Every
behaviour works on a directory and file names it is given, so it fits the
node it runs on:

- `cilium_exclusive`: Cilium's `cni.exclusive` (its default). On every
  directory event it renders its own conflist again if the file differs from
  what it renders, and moves every other network file away (`.cilium_bak`).
- `appends_itself_last`: istio-cni / linkerd-cni in chained mode. On every
  directory event it puts its own entry last in the primary conflist.
- `multus_auto_config`: Multus' auto-generated `00-multus.conf`, rendered
  again whenever its master (the next network file) changes, the master's
  whole conflist inlined as the cluster-network delegate.
- `write_in_place` / `copy_in_place`: Calico's install-cni (renders its
  conflist and writes it over the old one in place) and flannel's
  (`cp -f` of its template over its conflist), both when their pod restarts.

`Watcher` runs a reacting behaviour on every change of the directory (its own
writes excluded) and counts the writes it made. The two small CNI plugins at
the end stand in for binaries the behaviours name but that are not installed
on a test node, so a pod created meanwhile still gets a working network.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NETWORK_EXTENSIONS = (".conf", ".conflist", ".json")
React = Callable[[Path], int]  # given the conf dir: how many writes (files written, renamed) it made


def render(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file + rename (a new inode), the way Cilium, istio-cni and Multus write."""
    tmp = path.with_name(f".{path.name}.writer-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_in_place(path: Path, data: bytes) -> None:
    """open(O_TRUNC) + write on the same inode, the way Calico's install-cni writes its conflist."""
    with open(path, "r+b" if path.exists() else "wb") as fh:
        fh.truncate(0)
        fh.write(data)


def copy_in_place(template: Path, path: Path) -> None:
    """`cp -f TEMPLATE PATH` onto an existing file: truncated and rewritten in place (flannel's install-cni)."""
    shutil.copyfile(template, path)


def network_files(conf_dir: Path) -> list[Path]:
    """What libcni loads, in its order (sorted by name); the first is the runtime's network."""
    return [conf_dir / n for n in sorted(os.listdir(conf_dir))
            if not n.startswith(".") and n.endswith(NETWORK_EXTENSIONS) and (conf_dir / n).is_file()]


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_bytes())


def dir_state(conf_dir: Path) -> tuple:
    """(name, inode, mtime, size, bytes of network files): any write, rename or removal changes it."""
    out = []
    for name in sorted(os.listdir(conf_dir)):
        try:
            path = conf_dir / name
            st = os.stat(path)
            data = path.read_bytes() if name.endswith(NETWORK_EXTENSIONS) else b""
        except (FileNotFoundError, IsADirectoryError):
            continue
        out.append((name, st.st_ino, st.st_mtime_ns, st.st_size, data))
    return tuple(out)


def describe(state: tuple) -> str:
    """A directory state in a log line: each network file's chain (plugin types) or its size."""
    out = []
    for name, _ino, _mtime, size, data in state:
        try:
            doc = json.loads(data)
            out.append(f"{name}={[p.get('type') for p in doc['plugins']] if 'plugins' in doc else doc.get('type')}")
        except (ValueError, TypeError, AttributeError):
            out.append(f"{name}({size} bytes)")
    return " ".join(out)


class Watcher(threading.Thread):
    """Runs `react` on every change of the directory, like an fsnotify watch; counts its writes.

    Every react compares what it would write with what is there, the way the real
    watchers ignore their own writes, so a pass that wrote is followed by one more
    look: a change another writer made between this one's write and that look is
    an event too (taking the state again after a write would swallow it, and end a
    contest the real writer would go on with).
    """

    def __init__(self, conf_dir: Path, react: React, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.conf_dir, self.react = conf_dir, react
        self.writes = 0
        self.log: list[str] = []  # one line per reaction that wrote: when, and the directory it saw
        self.errors: list[str] = []
        self.halt = threading.Event()
        self.lock = threading.Lock()  # held while reacting: a test's own edits wait for it

    def run(self) -> None:
        last = None
        while not self.halt.is_set():
            with self.lock:
                now = dir_state(self.conf_dir)
                if now != last:
                    try:
                        wrote = self.react(self.conf_dir)
                        if wrote:
                            self.writes += wrote
                            self.log.append(f"{time.strftime('%H:%M:%S')} {self.name}: {wrote} write(s) after "
                                            f"{describe(now)}")
                        last = None if wrote else now
                    except (FileNotFoundError, ValueError, KeyError, IndexError) as exc:
                        # Read while another writer renamed or was halfway through: look again.
                        if len(self.errors) < 100:
                            self.errors.append(repr(exc))
            time.sleep(0.02)

    def __enter__(self) -> "Watcher":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(timeout=30)


# ---------------------------------------------------------------- the behaviours


def cilium_exclusive(own_name: str, rendered: bytes) -> React:
    """Cilium with cni.exclusive: its conflist exactly as it renders it; every other network file moved away."""

    def react(conf_dir: Path) -> int:
        writes = 0
        own = conf_dir / own_name
        try:
            current = own.read_bytes()
        except FileNotFoundError:
            current = b""
        if current != rendered:
            write_atomic(own, rendered)
            writes += 1
        for path in network_files(conf_dir):
            if path.name != own_name:
                os.rename(path, path.with_name(path.name + ".cilium_bak"))
                writes += 1
        return writes

    return react


def appends_itself_last(entry: dict[str, Any]) -> React:
    """istio-cni / linkerd-cni: their entry last in the runtime's conflist, put back there on every change."""

    def react(conf_dir: Path) -> int:
        primary = network_files(conf_dir)[0]
        doc = load(primary)
        plugins = doc["plugins"]
        if plugins[-1]["type"] == entry["type"] and sum(p["type"] == entry["type"] for p in plugins) == 1:
            return 0
        doc["plugins"] = [p for p in plugins if p["type"] != entry["type"]] + [entry]
        write_atomic(primary, render(doc))
        return 1

    return react


def without_plugin(path: Path, plugin_type: str) -> None:
    """The chainer's uninstall (its pod stops): its entry taken out of the conflist."""
    doc = load(path)
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] != plugin_type]
    write_atomic(path, render(doc))


def multus_auto_config(master_name: str, own_name: str = "00-multus.conf") -> React:
    """Multus' auto-generated config: rendered from its master conflist, whole, as the cluster network
    delegate, and rendered again whenever the master changes (thin plugin, `--multus-conf-file=auto`)."""

    def react(conf_dir: Path) -> int:
        master = load(conf_dir / master_name)
        want = render({"cniVersion": master["cniVersion"], "name": "multus-cni-network", "type": "multus",
                       "logLevel": "verbose", "delegates": [master]})
        own = conf_dir / own_name
        try:
            if own.read_bytes() == want:
                return 0
        except FileNotFoundError:
            pass
        write_atomic(own, want)
        return 1

    return react


# ---------------------------------------------------------------- stand-in plugins

# A chained plugin that hands its prevResult on unchanged, the way istio-cni and
# linkerd-cni do for a pod they do not redirect.
PASSTHROUGH = '''
import json, os, sys
conf = json.load(sys.stdin)
cmd = os.environ.get("CNI_COMMAND", "")
if cmd == "VERSION":
    print(json.dumps({"cniVersion": conf.get("cniVersion", "1.1.0"),
                      "supportedVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]}))
elif cmd == "ADD":
    result = conf.get("prevResult") or {"cniVersion": conf["cniVersion"]}
    result["cniVersion"] = conf["cniVersion"]
    print(json.dumps(result))
'''

# Multus' thin plugin, reduced to its cluster network: the first delegate's
# conflist run as libcni runs a chain (ADD in order, each plugin given the
# previous one's result; DEL in reverse), with the runtime's environment.
MULTUS = '''
import json, os, subprocess, sys
conf = json.load(sys.stdin)
cmd = os.environ.get("CNI_COMMAND", "")
if cmd == "VERSION":
    print(json.dumps({"cniVersion": conf.get("cniVersion", "1.1.0"),
                      "supportedVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]}))
    sys.exit(0)
if cmd not in ("ADD", "DEL"):
    sys.exit(0)
net = conf["delegates"][0]
plugins = net["plugins"] if cmd == "ADD" else list(reversed(net["plugins"]))
paths = os.environ.get("CNI_PATH", "").split(os.pathsep)
result = None
for plugin in plugins:
    exe = next((os.path.join(d, plugin["type"]) for d in paths if os.path.isfile(os.path.join(d, plugin["type"]))),
               None)
    if exe is None:
        print(json.dumps({"cniVersion": conf["cniVersion"], "code": 1, "msg": "no plugin " + plugin["type"]}))
        sys.exit(1)
    stdin = dict(plugin, name=net["name"], cniVersion=net["cniVersion"])
    if cmd == "ADD" and result is not None:
        stdin["prevResult"] = result
    proc = subprocess.run([exe], input=json.dumps(stdin).encode(), capture_output=True)
    if proc.returncode != 0:
        sys.stdout.buffer.write(proc.stdout)
        sys.exit(proc.returncode)
    if cmd == "ADD":
        result = json.loads(proc.stdout)
if cmd == "ADD":
    result["cniVersion"] = conf["cniVersion"]
    print(json.dumps(result))
'''


def install_plugin(bin_dir: Path, name: str, source: str, python: str) -> Path:
    """Write a stand-in plugin executable into the CNI bin dir (temp + rename)."""
    path = bin_dir / name
    tmp = bin_dir / f".{name}.tmp"
    tmp.write_text(f"#!{python} -I\n{source}")
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path
