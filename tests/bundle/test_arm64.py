"""The arm64 plugin answers exactly as the x86_64 one, run under qemu-user in an empty chroot.

`scripts/build-plugin.sh --arch arm64` cross-builds the static executable.
This host is x86_64 and has no binfmt_misc registration (no loadable kernel
modules), so the emulator is started explicitly: an otherwise empty directory
holds `/netclaim` and `/qemu-aarch64-static` (a static binary too), and the run
is `chroot DIR /qemu-aarch64-static /netclaim`. The x86_64 build runs in an
equally empty directory as `chroot DIR /netclaim`. Both get the same stdin, the
same CNI_* environment and the same in-root paths (spool, log, publisher
socket), under `unshare --mount` with a fresh /proc and the sandbox's netns
file bind-mounted (tests/bundle/chrootrun.py), as in test_chroot.py.

All six verbs run under the emulator, none skipped: ADD and CHECK enter the
sandbox's netns (setns(2) from the plugin's builtin) and read MAC and MTU back
over rtnetlink, which qemu-user passes through to the host kernel. What a user
would notice is compared: stdout (byte for byte), the exit code, the events
that reached the spool or the publisher's socket.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from cni_plugin.wire import spool as wire_spool

from .conftest import DRIVER, QEMU, Sandbox, cni_env

CHROOTRUN = Path(__file__).with_name("chrootrun.py")
EM_X86_64, EM_AARCH64 = 62, 183
PT_INTERP = 3
SOCKET = "/run/netclaim/publisher.sock"
SPOOL = "/var/lib/netclaim/spool"
LOG = "/var/log/netclaim/plugin.log"


def elf_header(path: Path) -> tuple[int, bool, bool]:
    """(e_machine, has a PT_INTERP segment, has a PT_DYNAMIC segment) of a 64-bit little-endian ELF."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF", f"{path} is not an ELF file"
    assert (data[4], data[5]) == (2, 1), f"{path} is not a 64-bit little-endian ELF"
    (machine,) = struct.unpack_from("<H", data, 18)
    (phoff,) = struct.unpack_from("<Q", data, 32)
    entsize, count = struct.unpack_from("<HH", data, 54)
    types = [struct.unpack_from("<I", data, phoff + i * entsize)[0] for i in range(count)]
    return machine, PT_INTERP in types, 2 in types


@dataclass
class Root:
    """An otherwise empty root: the plugin (and for arm64 the emulator) and a /proc mount point."""

    path: Path
    argv: list[str]

    def host(self, node_path: str) -> Path:
        return self.path / node_path.lstrip("/")

    def run(self, command: str, stdin: bytes, netns: str = "", args: tuple[str, ...] = ()) -> tuple[int, str]:
        env = cni_env(command, netns=netns)
        if not command:
            del env["CNI_COMMAND"]
        env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # for unshare/mount outside; nothing inside
        argv = ["/usr/bin/unshare", "--mount", "--propagation", "private", "--",
                sys.executable, "-I", str(CHROOTRUN), str(self.path), *([netns] if netns else []),
                "--", *self.argv, *args]
        proc = subprocess.run(argv, input=stdin, env=env, capture_output=True, timeout=60)
        return proc.returncode, proc.stdout.decode()

    def spooled(self) -> list[tuple[str, str, str]]:
        return [(e.op, e.container_id, e.driver) for e in
                (wire_spool.read_spool(p) for p in wire_spool.list_spool(str(self.host(SPOOL))))]

    def log_events(self) -> list[str]:
        log = self.host(LOG)
        return [json.loads(line).get("msg") for line in log.read_text().splitlines()] if log.exists() else []

    def files(self) -> list[str]:
        """Every file in the root, spooled events by kind (their names are unique per event)."""
        spool = self.host(SPOOL)
        return sorted(f"{SPOOL.lstrip('/')}/EVENT" if p.parent == spool else str(p.relative_to(self.path))
                      for p in self.path.rglob("*") if p.is_file())


def make_root(parent: Path, plugin: Path, qemu: Path | None) -> Root:
    root = Path(tempfile.mkdtemp(prefix="ncarch-", dir=parent))
    root.chmod(0o755)
    shutil.copy2(plugin, root / "netclaim")
    (root / "netclaim").chmod(0o755)
    argv = ["/netclaim"]
    if qemu is not None:
        shutil.copy2(qemu, root / QEMU)
        (root / QEMU).chmod(0o755)
        argv = [f"/{QEMU}", "/netclaim"]
    (root / "proc").mkdir()
    (root / "run" / "netclaim").mkdir(parents=True, mode=0o700)
    return Root(root, argv)


@pytest.fixture
def roots(tmp_path: Path, bundle: Path, arm64_bundle: Path, qemu: Path) -> tuple[Root, Root]:
    return make_root(tmp_path, bundle, None), make_root(tmp_path, arm64_bundle, qemu)


def _conf(version: str = "1.1.0", **extra: object) -> dict:
    return {"cniVersion": version, "name": "podnet", "type": "netclaim", "driverName": DRIVER,
            "socketPath": SOCKET, "spoolDir": SPOOL, "logFile": LOG, **extra}


def steps(sandbox: Sandbox) -> list[tuple[str, str, bytes, bool, tuple[str, ...]]]:
    """(name, CNI_COMMAND, stdin, needs the netns, argv) in the order a runtime would call them."""
    enc = lambda doc: json.dumps(doc).encode()  # noqa: E731
    prev = sandbox.prev_result()
    full = sandbox.prev_result(with_mtu=True)
    return [
        ("VERSION", "VERSION", enc({"cniVersion": "1.1.0"}), False, ()),
        ("ADD (MAC/MTU read back in the netns)", "ADD", enc(_conf(prevResult=prev)), True, ()),
        ("ADD 0.4.0", "ADD", enc(_conf("0.4.0", prevResult=dict(prev, cniVersion="0.4.0"))), True, ()),
        ("CHECK", "CHECK", enc(_conf(prevResult=full)), True, ()),
        ("STATUS", "STATUS", enc(_conf()), False, ()),
        ("DEL", "DEL", enc(_conf(prevResult=full)), True, ()),
        ("GC", "GC", enc(_conf(**{"cni.dev/valid-attachments": []})), False, ()),
        ("STATUS below 1.1.0 (error)", "STATUS", enc(_conf("1.0.0")), False, ()),
        ("garbage stdin (error)", "ADD", b"not json at all", True, ()),
        ("unknown command (error)", "FROB", enc(_conf()), False, ()),
        ("ADD without a netns (error)", "ADD", enc(_conf(prevResult=prev)), False, ()),
        ("--version", "", b"", False, ("--version",)),
    ]


def test_the_arm64_build_is_a_static_aarch64_executable(bundle: Path, arm64_bundle: Path) -> None:
    machine, interp, dynamic = elf_header(arm64_bundle)
    assert machine == EM_AARCH64, f"e_machine {machine}, not aarch64 ({EM_AARCH64})"
    assert not interp, "the arm64 plugin has a program interpreter (needs a dynamic loader on the node)"
    assert not dynamic, "the arm64 plugin has a dynamic section"
    assert elf_header(bundle)[:2] == (EM_X86_64, False), "the default build is no longer static x86_64"
    assert arm64_bundle.parent.parent != bundle.parent.parent, "both arches share one cache dir"


def test_every_verb_under_qemu_equals_x86_64(roots: tuple[Root, Root], sandbox: Sandbox) -> None:
    x86, arm = roots
    differences = []
    answers = {}
    for name, command, stdin, netns, args in steps(sandbox):
        want = x86.run(command, stdin, sandbox.path if netns else "", args)
        got = arm.run(command, stdin, sandbox.path if netns else "", args)
        answers[name] = got
        if got != want:
            differences.append(f"{name}: x86_64 {want!r}\n  arm64 {got!r}")
    assert not differences, "arm64 under qemu differs from x86_64:\n" + "\n".join(differences)

    # Equal, and right: the answers are what a runtime expects, not two equal failures.
    rc, out = answers["VERSION"]
    assert rc == 0 and json.loads(out)["supportedVersions"][-1] == "1.1.0"
    rc, out = answers["ADD (MAC/MTU read back in the netns)"]
    assert rc == 0, out
    eth0 = json.loads(out)["interfaces"][0]
    assert (eth0["mac"], eth0["mtu"]) == (sandbox.mac, sandbox.mtu), "MAC/MTU not read back under qemu"
    for verb in ("CHECK", "STATUS", "DEL", "GC"):
        assert answers[verb] == (0, ""), f"{verb}: {answers[verb]!r}"
    assert json.loads(answers["garbage stdin (error)"][1])["code"] == 6
    assert answers["ADD without a netns (error)"][0] == 1

    # The same events were spooled (publisher absent) and the same log records written.
    assert arm.spooled() == x86.spooled()
    assert sorted(op for op, _, _ in arm.spooled()) == ["ADD", "ADD", "CHECK", "DEL", "GC"]
    assert arm.log_events() == x86.log_events() and arm.log_events()
    # Nothing else was needed or written in the root.
    assert arm.files() == sorted(x86.files() + [QEMU])
    assert "netclaim" in x86.files() and "var/log/netclaim/plugin.log" in x86.files()


def test_events_reach_a_publisher_socket_inside_the_root_under_qemu(roots: tuple[Root, Root],
                                                                    sandbox: Sandbox) -> None:
    from plugin.conftest import PublisherDouble  # the wire-speaking test double of netclaim-publisher

    seen = []
    for root in roots:
        publisher = PublisherDouble(str(root.host(SOCKET)))
        try:
            add = root.run("ADD", json.dumps(_conf(prevResult=sandbox.prev_result(with_mtu=True))).encode(),
                           sandbox.path)
            dele = root.run("DEL", json.dumps(_conf()).encode(), sandbox.path)
        finally:
            publisher.close()
        seen.append((add, dele, [(e.op, e.container_id, e.netns, e.driver) for e in publisher.events], root.spooled()))
    x86, arm = seen
    assert arm == x86
    (add_rc, _), (del_rc, _), events, spooled = arm
    assert (add_rc, del_rc) == (0, 0)
    assert events == [("ADD", "ctr-bundle", sandbox.path, DRIVER), ("DEL", "ctr-bundle", sandbox.path, DRIVER)]
    assert spooled == [], "acked events must not be spooled as well"
