"""The installed plugin runs in a chroot that holds nothing but the installed files.

scripts/install.sh installs the plugin the way the DaemonSet's init container
does (--host-root): into <root>/opt/cni/bin, chained into <root>/etc/cni/net.d.
Then every CNI verb runs inside `chroot <root>` (private mount namespace, a
fresh /proc and the sandbox's netns file bind-mounted; nothing else): no
Python, no shared library, no dynamic loader. What a node operator would check:
the answers are right (MAC/MTU read back from the real veth), events reach the
publisher's socket or the spool inside the root, and nothing else was needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import spool as wire_spool

from .conftest import DRIVER, REPO, Sandbox, cni_env

INSTALL_SH = REPO / "scripts" / "install.sh"
CHROOTRUN = Path(__file__).with_name("chrootrun.py")
CONFLIST = "/etc/cni/net.d/10-podnet.conflist"
NODE_PATHS = {"socket": "/run/netclaim/publisher.sock", "spool": "/var/lib/netclaim/spool",
              "state": "/var/lib/netclaim/publisher", "log": "/var/log/netclaim/plugin.log"}
BASE = {"cniVersion": "1.1.0", "name": "podnet",
        "plugins": [{"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.99.0.0/24"}}]}


@dataclass
class Jail:
    root: Path

    def host(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def netclaim_conf(self, version: str = "1.1.0", **extra: object) -> dict:
        doc = json.loads(self.host(CONFLIST).read_text())
        entry = [p for p in doc["plugins"] if p["type"] == "netclaim"][0]
        return {"cniVersion": version, "name": doc["name"], **entry, **extra}

    def run(self, command: str, conf: dict | bytes, netns: str = "") -> tuple[int, str, str]:
        """One plugin run inside the chroot, as the runtime starts it."""
        env = cni_env(command, netns=netns)
        env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # for unshare/mount outside; empty inside
        argv = ["/usr/bin/unshare", "--mount", "--propagation", "private", "--",
                sys.executable, "-I", str(CHROOTRUN), str(self.root), *([netns] if netns else []),
                "--", "/opt/cni/bin/netclaim"]
        proc = subprocess.run(argv, input=conf if isinstance(conf, bytes) else json.dumps(conf).encode(), env=env, capture_output=True, timeout=60)
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()

    def spooled(self) -> list[wire_event.Event]:
        spool = str(self.host(NODE_PATHS["spool"]))
        return [wire_spool.read_spool(p) for p in wire_spool.list_spool(spool)]

    def files(self) -> set[str]:
        found = set()
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                found.add(os.path.relpath(os.path.join(dirpath, name), self.root))
        return found


@pytest.fixture
def jail() -> Jail:
    root = Path(tempfile.mkdtemp(prefix="ncbd-"))
    try:
        (root / "etc" / "cni" / "net.d").mkdir(parents=True)
        (root / CONFLIST.lstrip("/")).write_text(json.dumps(BASE))
        proc = subprocess.run(
            ["bash", str(INSTALL_SH), "--host-root", str(root), "--cni-bin-dir", "/opt/cni/bin",
             "--conflist", CONFLIST, "--driver-name", DRIVER, "--socket", NODE_PATHS["socket"],
             "--spool-dir", NODE_PATHS["spool"], "--state-dir", NODE_PATHS["state"],
             "--log-file", NODE_PATHS["log"]],
            capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, f"install.sh failed: {proc.stderr}"
        (root / "proc").mkdir()
        yield Jail(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_root_holds_only_the_installed_files(jail: Jail) -> None:
    assert jail.files() == {"opt/cni/bin/netclaim", "etc/cni/net.d/10-podnet.conflist",
                            "etc/cni/net.d/10-podnet.conflist.netclaim.bak",
                            "etc/netclaim/drivers"}  # the conflist's driver, for the publisher
    exe = jail.host("/opt/cni/bin/netclaim")
    assert oct(exe.stat().st_mode & 0o777) == "0o755"
    header = exe.read_bytes()[:4]
    assert header == b"\x7fELF", "the installed plugin is not an executable (a script would need an interpreter)"
    segments = subprocess.run(["readelf", "-lW", str(exe)], capture_output=True, text=True, check=True).stdout
    assert "INTERP" not in segments, "the plugin needs a dynamic loader"
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True)
    assert "not a dynamic executable" in (ldd.stdout + ldd.stderr)


def test_version_in_the_chroot(jail: Jail) -> None:
    rc, out, err = jail.run("VERSION", {"cniVersion": "1.1.0"})
    assert rc == 0, err
    assert json.loads(out)["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def test_every_verb_in_the_chroot_with_the_publisher_absent(jail: Jail, sandbox: Sandbox) -> None:
    conf = jail.netclaim_conf(prevResult=sandbox.prev_result())

    rc, out, err = jail.run("ADD", conf, sandbox.path)
    assert rc == 0, out + err
    result = json.loads(out)
    eth0 = result["interfaces"][0]
    assert (eth0["mac"], eth0["mtu"]) == (sandbox.mac, 1432), "MAC/MTU not read back from the real veth"
    assert [ip["address"] for ip in result["ips"]] == ["10.99.0.5/24", "fd00:99::5/64"]
    events = jail.spooled()
    assert [(e.op, e.container_id, e.driver) for e in events] == [("ADD", "ctr-bundle", DRIVER)]
    assert events[0].pod is not None and events[0].pod.name == "web-0"

    rc, out, err = jail.run("CHECK", jail.netclaim_conf(prevResult=result), sandbox.path)
    assert (rc, out) == (0, ""), out + err
    rc, out, err = jail.run("STATUS", jail.netclaim_conf())
    assert (rc, out) == (0, ""), out + err
    rc, out, err = jail.run("DEL", jail.netclaim_conf(prevResult=result), sandbox.path)
    assert (rc, out) == (0, ""), out + err
    gc = jail.netclaim_conf(**{"cni.dev/valid-attachments": []})
    rc, out, err = jail.run("GC", gc)
    assert (rc, out) == (0, ""), out + err
    assert sorted(e.op for e in jail.spooled()) == ["ADD", "CHECK", "DEL", "GC"]

    # The log went to the file the installer configured, inside the root.
    records = [json.loads(line) for line in jail.host(NODE_PATHS["log"]).read_text().splitlines()]
    assert {r.get("command") for r in records} >= {"ADD", "DEL"}


def test_events_reach_a_publisher_socket_inside_the_root(jail: Jail, sandbox: Sandbox) -> None:
    from plugin.conftest import PublisherDouble  # the wire-speaking test double of netclaim-publisher

    publisher = PublisherDouble(str(jail.host(NODE_PATHS["socket"])))
    try:
        rc, out, err = jail.run("ADD", jail.netclaim_conf(prevResult=sandbox.prev_result(with_mtu=True)), sandbox.path)
        assert rc == 0, out + err
        rc, out, err = jail.run("DEL", jail.netclaim_conf(), sandbox.path)
        assert rc == 0, out + err
    finally:
        publisher.close()
    assert [(e.op, e.netns) for e in publisher.events] == [("ADD", sandbox.path), ("DEL", sandbox.path)]
    assert jail.spooled() == [], "acked events must not be spooled as well"


def test_errors_in_the_chroot_are_cni_errors(jail: Jail, sandbox: Sandbox) -> None:
    rc, out, _ = jail.run("ADD", b'{"cniVersion": "1.1.0", "name": ', sandbox.path)
    assert rc == 1 and json.loads(out)["code"] == 6
    rc, out, _ = jail.run("STATUS", jail.netclaim_conf(version="1.0.0"))
    assert rc == 1 and json.loads(out)["code"] == 1  # STATUS needs cniVersion >= 1.1.0
