"""Fixtures for the netclaim CNI plugin tests.

Real parts: network namespaces made with `ip netns`, the reference plugins
`bridge` + `host-local` from the CNI bin dir, the plugin's source started
through cni_plugin/launcher.py (python -I -S); the installed static plugin
is held to the same outputs by tests/bundle. The one double is `PublisherDouble`, a
test stand-in for netclaim-publisher that speaks the real wire format.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import frame as wire_frame
from cni_plugin.wire import spool as wire_spool
from cni_plugin.launcher import install

REPO = Path(__file__).resolve().parents[2]
CNI_BIN = Path(os.environ.get("NETCLAIM_TEST_CNI_BIN", "/usr/lib/cni"))


@pytest.fixture(scope="session")
def plugin_exe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The netclaim executable as a runtime runs it (launcher: python -IS)."""
    path = tmp_path_factory.mktemp("cnibin") / "netclaim"
    return install(str(path), python=sys.executable, root=str(REPO))


@dataclass
class Dirs:
    root: Path
    socket: str
    spool: str
    state: str
    log: str

    def conf(self, **extra: object) -> dict:
        base = {"type": "netclaim", "driverName": "net.example.com", "socketPath": self.socket,
                "spoolDir": self.spool, "stateDir": self.state, "logFile": self.log, "ackTimeoutMs": 500,
                "handoffWaitMs": 0}  # tests of the wait set it (None: the default)
        base.update(extra)
        return base

    def spooled(self) -> list[wire_event.Event]:
        return [wire_spool.read_spool(p) for p in wire_spool.list_spool(self.spool)]

    def log_records(self) -> list[dict]:
        try:
            return [json.loads(line) for line in Path(self.log).read_text().splitlines()]
        except FileNotFoundError:
            return []


@pytest.fixture
def dirs() -> Dirs:
    # Short path: unix socket paths are limited to 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="ncpl-"))
    try:
        yield Dirs(root, str(root / "pub.sock"), str(root / "spool"), str(root / "state"), str(root / "log" / "p.log"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Netns:
    name: str
    path: str

    def ip(self, *args: str) -> str:
        return subprocess.run(["ip", "-n", self.name, *args], check=True, capture_output=True, text=True).stdout

    def read(self, path: str) -> str:
        return subprocess.run(["ip", "netns", "exec", self.name, "cat", path], check=True,
                              capture_output=True, text=True).stdout.strip()

    def link(self, ifname: str) -> dict:
        """The interface as pyroute2 sees it: an oracle independent of the plugin's netlink code."""
        from pyroute2 import NetNS

        with NetNS(self.name) as ns:
            found = ns.link_lookup(ifname=ifname)
            if not found:
                return {}
            msg = ns.get_links(found[0])[0]
            addrs = [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ns.get_addr(index=found[0])]
            return {"mac": msg.get_attr("IFLA_ADDRESS"), "mtu": msg.get_attr("IFLA_MTU"),
                    "txqlen": msg.get_attr("IFLA_TXQLEN"), "up": bool(msg["flags"] & 1),
                    "altnames": _altnames(msg), "addrs": addrs}


def _altnames(msg) -> list[str]:
    props = msg.get_attr("IFLA_PROP_LIST")
    if not props:
        return []
    return [v for k, v in props["attrs"] if k == "IFLA_ALT_IFNAME"]


@pytest.fixture
def netns() -> Netns:
    name = f"ncpl-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield Netns(name, f"/run/netns/{name}")
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def run_plugin(exe: str, command: str, conf: dict, *, netns: str = "", ifname: str = "eth0",
               container_id: str = "ctr1", args: str = "", stdin: bytes | None = None) -> tuple[int, str, str]:
    """Run a CNI plugin exactly as a runtime does: env + config on stdin, result on stdout."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
           "CNI_IFNAME": ifname, "CNI_PATH": str(CNI_BIN), "CNI_ARGS": args, "PATH": os.environ.get("PATH", "")}
    proc = subprocess.run([exe], input=json.dumps(conf).encode() if stdin is None else stdin, env=env,
                          capture_output=True, timeout=60)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


POD_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=ctr1;K8S_POD_UID=uid-123"


@dataclass
class Chain:
    """bridge + host-local (IPv4 and IPv6) then netclaim, for one sandbox."""

    exe: str
    netns: Netns
    dirs: Dirs
    version: str = "1.0.0"
    bridge: str = field(default_factory=lambda: f"ncb{secrets.token_hex(3)}")
    container_id: str = field(default_factory=lambda: f"ctr{secrets.token_hex(6)}")
    ifname: str = "eth0"
    network: str = "ncpl-net"

    def __post_init__(self) -> None:
        octet = 100 + secrets.randbelow(150)
        self.subnet4 = f"10.{octet}.{secrets.randbelow(250)}.0/24"
        self.subnet6 = f"fd00:{secrets.token_hex(2)}:{secrets.token_hex(2)}::/64"
        self.ipam_dir = str(self.dirs.root / "ipam")

    def bridge_conf(self) -> dict:
        # Debian's reference plugins (1.1.x) stop at 1.0.0, whose result shape 1.1.0 shares.
        bridge_version = "1.0.0" if self.version == "1.1.0" else self.version
        return {"cniVersion": bridge_version, "name": self.network, "type": "bridge", "bridge": self.bridge,
                "isGateway": False, "ipMasq": False,
                "ipam": {"type": "host-local", "dataDir": self.ipam_dir,
                         "ranges": [[{"subnet": self.subnet4}], [{"subnet": self.subnet6}]]}}

    def netclaim_conf(self, prev: dict | None, **extra: object) -> dict:
        conf = self.dirs.conf(cniVersion=self.version, name=self.network, **extra)
        if prev is not None:
            conf["prevResult"] = prev
        return conf

    def bridge_add(self) -> dict:
        rc, out, err = run_plugin(str(CNI_BIN / "bridge"), "ADD", self.bridge_conf(), netns=self.netns.path,
                                  ifname=self.ifname, container_id=self.container_id, args=POD_ARGS)
        assert rc == 0, f"bridge ADD failed: {out} {err}"
        return json.loads(out)

    def netclaim(self, command: str, prev: dict | None, netns: str | None = None, **extra: object):
        return run_plugin(self.exe, command, self.netclaim_conf(prev, **extra),
                          netns=self.netns.path if netns is None else netns, ifname=self.ifname,
                          container_id=self.container_id, args=POD_ARGS)

    def teardown(self) -> None:
        run_plugin(str(CNI_BIN / "bridge"), "DEL", self.bridge_conf(), netns=self.netns.path,
                   ifname=self.ifname, container_id=self.container_id, args=POD_ARGS)
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)


@pytest.fixture
def chain(plugin_exe: str, netns: Netns, dirs: Dirs) -> Chain:
    c = Chain(plugin_exe, netns, dirs)
    try:
        yield c
    finally:
        c.teardown()


class PublisherDouble:
    """Test double of netclaim-publisher: accepts wire frames, records events, acks.

    `reply` can be switched to a rejection, or `hang` set to never answer, to
    exercise the plugin's spool fallback.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.events: list[wire_event.Event] = []
        self.sent: list[dict] = []  # each accepted event's JSON as the plugin sent it (which keys it left out)
        self.reply_ok = True
        self.hang = False
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    request = wire_frame.read_frame(conn)
                    event = wire_event.Event.from_dict(request["event"])
                except (EOFError, OSError, wire_event.WireError, KeyError) as exc:
                    conn.sendall(wire_frame.encode_frame({"ok": False, "error": str(exc)}))
                    continue
                if self.hang:
                    self._stop.wait(3)
                    continue
                if self.reply_ok:
                    self.events.append(event)
                    self.sent.append(request["event"])
                    conn.sendall(wire_frame.encode_frame({"ok": True, "id": event.event_id}))
                else:
                    conn.sendall(wire_frame.encode_frame({"ok": False, "error": "journal full (test)"}))

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def publisher(dirs: Dirs) -> PublisherDouble:
    pub = PublisherDouble(dirs.socket)
    try:
        yield pub
    finally:
        pub.close()


# ------------------------------------------------------------------ real file systems and a real unprivileged uid


@dataclass
class Tmpfs:
    """A real tmpfs of a few KiB mounted for one test (ENOSPC, read-only remounts)."""

    path: Path

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Write a filler file until only `leave` bytes (whole pages) are free."""
        with open(self.path / "filler", "ab") as fh:
            size = self.free() - leave
            if size > 0:
                fh.write(b"\0" * size)
        assert self.free() == leave, (self.free(), leave)

    def remount_read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


@pytest.fixture
def tmpfs_factory():
    """mount(8) a tmpfs of `size` on a fresh root-owned directory; unmounted at teardown."""
    mounted: list[Path] = []

    def make(size: str = "64k") -> Tmpfs:
        path = Path(tempfile.mkdtemp(prefix="ncfs-"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "netclaim-test", str(path)],
                       check=True)
        mounted.append(path)
        return Tmpfs(path)

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


def as_nobody(*argv: str, **kwargs: object) -> subprocess.CompletedProcess:
    """Run a command as the real unprivileged user `nobody` (not a mock: setuid by the kernel)."""
    return subprocess.run(list(argv), user="nobody", group="nogroup", extra_groups=[], check=True,
                          capture_output=True, text=True, timeout=60, **kwargs)
