"""Every CNI verb through libcni itself (v1.3.1, the library containerd and CRI-O use).

Hand-made stdin tests only prove what the plugin does with what the test
author thinks a runtime sends. Here libcni builds the plugin's input: its own
runner `cnitool` (built and cached by scripts/build/components.sh) for ADD,
CHECK, DEL, GC and STATUS, and a 60-line driver of the same library
(tests/plugin/libcni_driver) for the two calls cnitool cannot make: GC with a
list of valid attachments, and VERSION. The chain is bridge + host-local (the
reference plugins built at the same pinned version, which speak 1.1.0) and
netclaim last, in a real netns. No publisher runs: what a user sees is the exit
code, the result JSON and the spool's content, which the publisher replays.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event

from .conftest import Dirs, Netns

REPO = Path(__file__).resolve().parents[2]
DRIVER_SOURCE = Path(__file__).resolve().parent / "libcni_driver" / "main.go"
POD = {"K8S_POD_NAMESPACE": "team-a", "K8S_POD_NAME": "web-0", "K8S_POD_UID": "uid-9"}


def _build(*targets: str) -> list[str]:
    proc = subprocess.run([str(REPO / "scripts" / "build" / "components.sh"), *targets], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(targets)} could not be built: {proc.stderr[-2000:]}", pytrace=False)
    return proc.stdout.split()


@pytest.fixture(scope="module")
def libcni_tools() -> tuple[str, str, list[str]]:
    """(cnitool, libcni-driver, [bridge, host-local, loopback]) - Go binaries cached by version / source hash."""
    (cnitool,) = _build("cnitool")
    plugins = _build("cni-plugins")
    cache = Path(cnitool).parent
    version = Path(cnitool).name.rsplit("-", 1)[1]
    module = cache.parent / "build" / f"cni-{version}"  # the cnitool wrapper module: go.mod + go.sum
    digest = hashlib.sha256(DRIVER_SOURCE.read_bytes() + (module / "go.sum").read_bytes()).hexdigest()[:12]
    driver = cache / f"libcni-driver-{version}-{digest}"
    if not driver.exists():
        work = Path(os.environ.get("TMPDIR", "/tmp")) / f"libcni-driver-{secrets.token_hex(4)}"
        work.mkdir()
        try:
            for name in ("go.mod", "go.sum"):
                shutil.copy(module / name, work / name)
            shutil.copy(DRIVER_SOURCE, work / "main.go")
            go = shutil.which("go") or "/usr/local/go/bin/go"
            env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "CGO_ENABLED": "0"}
            done = subprocess.run([go, "build", "-trimpath", "-o", str(driver) + ".tmp", "."], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                pytest.fail(f"libcni driver build failed: {done.stderr[-2000:]}", pytrace=False)
            os.replace(str(driver) + ".tmp", driver)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return cnitool, str(driver), plugins


@dataclass
class Libcni:
    """One network (conflist ending in netclaim) and the libcni runners for it."""

    cnitool: str
    driver: str
    netns: Netns
    dirs: Dirs
    conf_dir: Path
    bin_dir: Path
    network: str
    bridge: str

    @property
    def container_id(self) -> str:
        """cnitool names the container after its netns path (as a runtime uses its sandbox id)."""
        return "cnitool-" + hashlib.sha512(os.path.abspath(self.netns.path).encode()).hexdigest()[:20]

    def env(self) -> dict[str, str]:
        args = ";".join(["IgnoreUnknown=1", *(f"{k}={v}" for k, v in POD.items())])
        return {"PATH": os.environ.get("PATH", ""), "CNI_PATH": str(self.bin_dir), "NETCONFPATH": str(self.conf_dir),
                "CNI_ARGS": args, "CNI_IFNAME": "eth0"}

    def write_conflist(self, **netclaim: object) -> None:
        conflist = {"cniVersion": "1.1.0", "name": self.network, "plugins": [
            {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "dataDir": str(self.dirs.root / "ipam"),
                      "ranges": [[{"subnet": f"10.{secrets.randbelow(60) + 180}.{secrets.randbelow(250)}.0/24"}]]}},
            self.dirs.conf(driverName="net.example.com", **netclaim)]}
        (self.conf_dir / "10-libcni.conflist").write_text(json.dumps(conflist))

    def cnitool_run(self, verb: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.cnitool, verb, self.network, self.netns.path], env=self.env(),
                              capture_output=True, text=True, timeout=120)

    def driver_run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.driver, *argv], env=self.env(), capture_output=True, text=True, timeout=120)

    def spooled(self) -> list[wire_event.Event]:
        return self.dirs.spooled()


@pytest.fixture
def libcni(libcni_tools, plugin_exe: str, netns: Netns, dirs: Dirs) -> Libcni:
    cnitool, driver, plugins = libcni_tools
    bin_dir, conf_dir = dirs.root / "bin", dirs.root / "net.d"
    bin_dir.mkdir()
    conf_dir.mkdir()
    for path in plugins:  # cni-bridge-v1.9.1 -> bridge
        (bin_dir / Path(path).name.split("-", 1)[1].rsplit("-", 1)[0]).symlink_to(path)
    (bin_dir / "netclaim").symlink_to(plugin_exe)
    suffix = secrets.token_hex(3)
    lc = Libcni(cnitool, driver, netns, dirs, conf_dir, bin_dir, f"nclibcni-{suffix}", f"nclc{suffix}")
    lc.write_conflist()
    try:
        yield lc
    finally:
        lc.cnitool_run("del")
        subprocess.run(["ip", "link", "del", lc.bridge], check=False, capture_output=True)


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}{done.stdout}"
    return done.stdout


def test_gc_with_no_valid_attachments_through_libcni(libcni: Libcni) -> None:
    """A runtime with no sandbox left: libcni sends `"cni.dev/valid-attachments": null`."""
    _ok(libcni.cnitool_run("add"))
    _ok(libcni.driver_run("gc", libcni.network))  # nil list -> null on the wire
    events = libcni.spooled()
    # libcni first DELs every cached attachment it was not told to keep, then GCs each plugin.
    assert [e.op for e in events] == ["ADD", "DEL", "GC"], events
    assert events[1].container_id == libcni.container_id
    assert events[2].valid_attachments == [] and events[2].network == libcni.network
    # cnitool's own GC passes no GC arguments at all (both keys absent): the same empty set.
    _ok(libcni.cnitool_run("gc"))
    assert [e.op for e in libcni.spooled()] == ["ADD", "DEL", "GC", "GC"]
    assert libcni.spooled()[-1].valid_attachments == []


def test_every_verb_through_libcni(libcni: Libcni) -> None:
    # ADD: the chain's result, printed by libcni, and the event the publisher will replay.
    result = json.loads(_ok(libcni.cnitool_run("add")))
    assert result["cniVersion"] == "1.1.0"
    (eth0,) = [i for i in result["interfaces"] if i.get("sandbox")]
    assert eth0["name"] == "eth0" and eth0["sandbox"] == libcni.netns.path and eth0["mtu"] > 0
    assert libcni.netns.link("eth0")["mac"] == eth0["mac"]
    (add,) = libcni.spooled()
    assert (add.op, add.container_id, add.ifname, add.network) == ("ADD", libcni.container_id, "eth0", libcni.network)
    assert add.pod == wire_event.PodRef("team-a", "web-0", "uid-9")
    assert [ip["address"] for ip in add.result["ips"]] == [ip["address"] for ip in result["ips"]]

    # CHECK through the whole chain (libcni passes the cached result as prevResult).
    _ok(libcni.cnitool_run("check"))
    check = libcni.spooled()[-1]
    assert (check.op, check.check_error, check.container_id) == ("CHECK", "", libcni.container_id)

    # STATUS: ready, also under failurePolicy Fail with a usable spool; not ready when neither works.
    _ok(libcni.cnitool_run("status"))
    libcni.write_conflist(failurePolicy="Fail")
    _ok(libcni.cnitool_run("status"))
    blocker = libcni.dirs.root / "blocker"
    blocker.write_text("")
    libcni.write_conflist(failurePolicy="Fail", spoolDir=str(blocker / "spool"))
    done = libcni.cnitool_run("status")
    assert done.returncode == 1 and "netclaim is not ready" in done.stderr, done.stderr
    libcni.write_conflist()

    # GC keeping our attachment: nothing is DELed, the list reaches netclaim intact.
    _ok(libcni.driver_run("gc", libcni.network, f"{libcni.container_id}/eth0"))
    gc = libcni.spooled()[-1]
    assert gc.op == "GC" and gc.valid_attachments == [{"containerID": libcni.container_id, "ifname": "eth0"}]
    assert libcni.netns.link("eth0"), "the kept attachment is untouched"

    # DEL, then DEL again (a runtime retry, no cached result left): both succeed.
    _ok(libcni.cnitool_run("del"))
    _ok(libcni.cnitool_run("del"))
    dels = [e for e in libcni.spooled() if e.op == "DEL"]
    assert len(dels) == 2 and dels[0].result is not None and dels[1].result is None
    assert not libcni.netns.link("eth0")

    # GC with no valid attachment left.
    _ok(libcni.cnitool_run("gc"))
    assert libcni.spooled()[-1].op == "GC" and libcni.spooled()[-1].valid_attachments == []

    # VERSION, asked the way libcni asks it.
    versions = json.loads(_ok(libcni.driver_run("version", "netclaim")))["supportedVersions"]
    assert versions == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
    assert [e.op for e in libcni.spooled()] == ["ADD", "CHECK", "GC", "DEL", "DEL", "GC"]
