"""The plugin's logFile in a sticky directory: a name another user planted first gets nothing.

`logFile` may sit in a directory where others may add names (mode 1777, like
/tmp): safefs trusts such a directory, so the file itself must be checked. A
real unprivileged user, made with useradd for this module, plants the name
before the root plugin runs: a file of theirs, a FIFO (with and without a
reader), a symlink, or a hard link to a file of root's. Each case runs the real
plugin executable the way a runtime does and asserts that the ADD still
succeeds and prints its result, that nothing reached the planted name, and that
stderr says the log file was refused and why, without the pod's details.
Positive controls: a root-owned 0600 log file in the same directory is appended
to, and the FIFO's reader does receive what is written into it.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import POD_ARGS, Dirs, run_plugin
from .test_plugin_input_and_handoff_limits import prev_result

NETWORK = "logfile-net"
POD_DETAILS = ("web-0", "team-a", "uid-123")  # from POD_ARGS: must never reach a refused name or stderr
REFUSED = "logFile refused"
# Where the intruder finds an interpreter: the test runner's own may sit in root's home, out of their reach.
SYSTEM_PATH = "/usr/bin:/bin"


@dataclass
class Intruder:
    """A real unprivileged local user (useradd), and the means to run commands as them."""

    name: str
    uid: int

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), user=self.name, group=self.name, extra_groups=[], check=True,
                              capture_output=True, text=True, timeout=60)

    def popen(self, *argv: str) -> subprocess.Popen:
        return subprocess.Popen(list(argv), user=self.name, group=self.name, extra_groups=[], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def intruder() -> Iterator[Intruder]:
    name = f"nclog{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=60)
    try:
        uid = int(subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout)
        yield Intruder(name, uid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=60)


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A fresh root-owned directory of mode 1777: anyone may add names, only owners remove theirs."""
    path = Path(tempfile.mkdtemp(prefix="ncsticky-"))
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", "--", str(path)], check=False)


def add_logging_to(exe: str, dirs: Dirs, log: Path) -> tuple[int, str, str]:
    """One ADD with logFile at `log` (run_plugin's subprocess deadline is generous: 60 s)."""
    conf = dirs.conf(cniVersion="1.0.0", name=NETWORK, prevResult=prev_result(), logFile=str(log))
    return run_plugin(exe, "ADD", conf, netns="/run/netns/ncpl-none", args=POD_ARGS)


def assert_add_succeeded(rc: int, out: str, err: str) -> None:
    assert rc == 0, out + err
    assert json.loads(out)["interfaces"], "the ADD passes its result on"


def refusals(err: str) -> list[dict]:
    """The stderr lines that say the log file was refused (there must be exactly one per run)."""
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [r for r in records if r["msg"].startswith(REFUSED)]


def assert_refused_once(err: str, *why: str) -> None:
    """Exactly one refusal line, naming one of the reasons `why`, and no pod details on stderr."""
    found = refusals(err)
    assert len(found) == 1, f"stderr must say once that the log file was refused: {err!r}"
    assert any(reason in found[0]["logFileError"] for reason in why), found[0]
    line = json.dumps(found[0])
    assert not any(detail in line for detail in POD_DETAILS), f"the refusal line carries pod details: {line}"
    assert "containerID" not in found[0] and "ADD done" not in err, err


def test_a_root_owned_private_log_file_in_a_sticky_dir_is_appended_to(plugin_exe: str, dirs: Dirs,
                                                                       sticky: Path) -> None:
    """Positive control: the checks let root's own file through, so a refusal below is the check's doing."""
    log = sticky / "p.log"
    log.write_bytes(b"")
    os.chmod(log, 0o600)
    rc, out, err = add_logging_to(plugin_exe, dirs, log)
    assert_add_succeeded(rc, out, err)
    assert refusals(err) == [], err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(r["msg"] == "ADD done" and r["pod"] == "team-a/web-0" for r in records), records


def test_a_log_file_the_plugin_creates_in_a_sticky_dir_is_root_only(plugin_exe: str, dirs: Dirs,
                                                                     sticky: Path) -> None:
    log = sticky / "p.log"
    rc, out, err = add_logging_to(plugin_exe, dirs, log)
    assert_add_succeeded(rc, out, err)
    st = log.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode), st.st_nlink) == (0, 0o600, 1)
    assert "ADD done" in log.read_text()


def test_a_log_file_planted_by_another_user_is_not_written(plugin_exe: str, dirs: Dirs, sticky: Path,
                                                           intruder: Intruder) -> None:
    log = sticky / "p.log"
    intruder.run("sh", "-c", 'umask 022 && : > "$1"', "sh", str(log))
    assert log.stat().st_uid == intruder.uid
    rc, out, err = add_logging_to(plugin_exe, dirs, log)
    assert_add_succeeded(rc, out, err)
    assert log.read_bytes() == b"", "root appended pod details to a file another user owns and reads"
    assert_refused_once(err, f"owned by uid {intruder.uid}")


def test_a_planted_fifo_nobody_reads_does_not_hang_the_add(plugin_exe: str, dirs: Dirs, sticky: Path,
                                                           intruder: Intruder) -> None:
    log = sticky / "p.log"
    intruder.run("mkfifo", "-m", "0622", str(log))
    try:
        rc, out, err = add_logging_to(plugin_exe, dirs, log)
    except subprocess.TimeoutExpired:
        pytest.fail("the ADD never completed: opening the planted FIFO for writing blocked it")
    assert_add_succeeded(rc, out, err)
    assert_refused_once(err, "FIFO")


# Runs as the intruder: holds the FIFO open for reading, says "ready", then on a
# line from stdin prints (as JSON) everything the FIFO holds so far.
_FIFO_READER = r"""
import json, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
sys.stdin.readline()
chunks = []
while True:
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        break
    if not chunk:
        break
    chunks.append(chunk)
print(json.dumps(b"".join(chunks).decode(errors="replace")), flush=True)
"""


def test_a_planted_fifo_with_a_reader_receives_nothing(plugin_exe: str, dirs: Dirs, sticky: Path,
                                                       intruder: Intruder) -> None:
    log = sticky / "p.log"
    intruder.run("mkfifo", "-m", "0622", str(log))
    python = shutil.which("python3", path=SYSTEM_PATH)
    assert python, f"no python3 on {SYSTEM_PATH} for the intruder to run"
    reader = intruder.popen(python, "-c", _FIFO_READER, str(log))
    try:
        assert reader.stdout.readline().strip() == "ready", reader.stderr.read()
        rc, out, err = add_logging_to(plugin_exe, dirs, log)
        # Positive control: what is written into the FIFO does reach the reader.
        fd = os.open(log, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"control\n")
        finally:
            os.close(fd)
        received, _ = reader.communicate("drain\n", timeout=60)
    finally:
        reader.kill()
        reader.wait(timeout=60)
    assert_add_succeeded(rc, out, err)
    assert json.loads(received) == "control\n", f"the reader got more than the control line: {received!r}"
    assert_refused_once(err, "FIFO")


def test_a_planted_symlink_is_not_followed(plugin_exe: str, dirs: Dirs, sticky: Path, intruder: Intruder,
                                           tmp_path: Path) -> None:
    target = tmp_path / "roots-file"
    target.write_bytes(b"root's own\n")
    os.chmod(target, 0o600)
    log = sticky / "p.log"
    intruder.run("ln", "-s", str(target), str(log))
    rc, out, err = add_logging_to(plugin_exe, dirs, log)
    assert_add_succeeded(rc, out, err)
    assert target.read_bytes() == b"root's own\n", "root appended through the planted symlink"
    assert log.is_symlink()
    # O_NOFOLLOW makes it ELOOP; recent kernels already deny (EACCES) root's O_CREAT open of another
    # user's symlink in a sticky directory. Either way the plugin says so and does not follow it.
    assert_refused_once(err, "symbolic link", "Permission denied")


def test_a_hard_link_to_another_file_is_refused(plugin_exe: str, dirs: Dirs, sticky: Path, tmp_path: Path) -> None:
    """A second name for a file of root's (say /etc/shadow) must not become a place root appends to.

    The link is made by root here: with fs.protected_hardlinks=1 the kernel stops
    a user from linking a file they do not own, but a node may have it off, and
    the plugin does not rely on that setting.
    """
    target = tmp_path / "roots-secret"
    target.write_bytes(b"secret\n")
    os.chmod(target, 0o600)
    log = sticky / "p.log"
    os.link(target, log)
    assert log.stat().st_nlink == 2
    rc, out, err = add_logging_to(plugin_exe, dirs, log)
    assert_add_succeeded(rc, out, err)
    assert target.read_bytes() == b"secret\n", "root appended pod details to another file through a hard link"
    assert_refused_once(err, "2 hard links")


def test_a_group_writable_log_file_is_refused(plugin_exe: str, dirs: Dirs, sticky: Path) -> None:
    log = sticky / "p.log"
    log.write_bytes(b"")
    os.chmod(log, 0o620)
    rc, out, err = add_logging_to(plugin_exe, dirs, log)
    assert_add_succeeded(rc, out, err)
    assert log.read_bytes() == b""
    assert_refused_once(err, "writable by group or others (mode 620)")
