"""The bounded spool, its overflow marker, the one hand-off deadline and the
no-symlink rule for the plugin's own directories. Real files, real processes,
real unix sockets; the slow publisher is a test server speaking the real wire
format."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import frame as wire_frame
from cni_plugin.wire import spool as wire_spool

from .conftest import POD_ARGS, Dirs, run_plugin

PREV = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 1500,
                                               "sandbox": "/run/netns/x"}], "ips": []}


def _event(op: str = "ADD", cid: str = "c1") -> wire_event.Event:
    return wire_event.Event(op=op, container_id=cid, ifname="eth0", driver="net.example.com")


def _add(exe: str, dirs: Dirs, cid: str = "ctr1", **extra: object) -> tuple[int, str, str]:
    conf = dirs.conf(cniVersion="1.0.0", name="spool-net", prevResult=PREV, **extra)
    return run_plugin(exe, "ADD", conf, netns="/run/netns/ncpl-none", container_id=cid, args=POD_ARGS)


# ------------------------------------------------------------------ caps and the marker


def test_count_cap_drops_into_the_marker(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool")
    for i in range(3):
        wire_spool.write_spool(spool, _event(cid=f"c{i}"), max_files=3)
    with pytest.raises(wire_spool.SpoolFull):
        wire_spool.write_spool(spool, _event("DEL", "c9"), max_files=3)
    with pytest.raises(wire_spool.SpoolFull):
        wire_spool.write_spool(spool, _event("ADD", "c10"), max_files=3)
    assert len(wire_spool.list_spool(spool)) == 3
    marker = wire_spool.read_overflow(spool)
    assert marker["dropped"] == 2 and marker["lastCommand"] == "ADD"
    assert marker["firstDroppedAt"] <= marker["lastDroppedAt"]
    assert set(marker) == {"dropped", "firstDroppedAt", "lastDroppedAt", "lastCommand"}


def test_byte_cap_drops_into_the_marker(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool")
    path = wire_spool.write_spool(spool, _event(), max_bytes=4096)
    size = os.path.getsize(path)
    budget = size * 2 + size // 2  # room for two events, not three
    wire_spool.write_spool(spool, _event(cid="c2"), max_bytes=budget)
    with pytest.raises(wire_spool.SpoolFull):
        wire_spool.write_spool(spool, _event(cid="c3"), max_bytes=budget)
    assert len(wire_spool.list_spool(spool)) == 2 and wire_spool.read_overflow(spool)["dropped"] == 1


def test_listing_ignores_the_marker_and_temp_files(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool")
    wire_spool.write_spool(spool, _event(), max_files=1)
    with pytest.raises(wire_spool.SpoolFull):
        wire_spool.write_spool(spool, _event(cid="c2"), max_files=1)
    Path(spool, "0001-x.event.json.tmp").write_text("{}")
    Path(spool, "overflow.77.tmp").write_text("{}")
    listed = wire_spool.list_spool(spool)
    assert len(listed) == 1 and listed[0].endswith(wire_spool.SPOOL_SUFFIX)
    assert all(not p.endswith("overflow") for p in listed)


def test_take_overflow_renames_it_away(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool")
    assert wire_spool.take_overflow(spool) is None and wire_spool.read_overflow(spool) is None
    wire_spool.write_spool(spool, _event(), max_files=1)
    for _ in range(2):
        with pytest.raises(wire_spool.SpoolFull):
            wire_spool.write_spool(spool, _event(cid="c2"), max_files=1)
    taken = wire_spool.take_overflow(spool)
    assert taken["dropped"] == 2
    assert wire_spool.read_overflow(spool) is None and wire_spool.take_overflow(spool) is None
    assert sorted(os.listdir(spool)) == [os.path.basename(wire_spool.list_spool(spool)[0])], "nothing left behind"
    with pytest.raises(wire_spool.SpoolFull):
        wire_spool.write_spool(spool, _event(cid="c3"), max_files=1)
    assert wire_spool.read_overflow(spool)["dropped"] == 1, "a new marker starts from zero"


def _fill_marker(spool: str, drops: int) -> None:
    """`drops` events refused by a spool at its cap of one file."""
    if not wire_spool.list_spool(spool):
        wire_spool.write_spool(spool, _event(), max_files=1)
    for i in range(drops):
        with pytest.raises(wire_spool.SpoolFull):
            wire_spool.write_spool(spool, _event(cid=f"d{i}"), max_files=1)


def test_a_marker_taken_by_a_publisher_that_died_is_counted_by_the_next_take(tmp_path: Path) -> None:
    """A publisher killed between take_overflow's rename and unlink leaves overflow.taken.<pid>."""
    spool = str(tmp_path / "spool")
    _fill_marker(spool, 3)
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.rename(os.path.join(spool, "overflow"), os.path.join(spool, f"overflow.taken.{dead.pid}"))
    _fill_marker(spool, 2)  # drops after the dead publisher's take start a new marker
    taken = wire_spool.take_overflow(spool)
    assert taken["dropped"] == 5 and taken["lastCommand"] == "ADD"
    assert [n for n in os.listdir(spool) if n.startswith("overflow")] == []
    assert wire_spool.take_overflow(spool) is None, "counted once"


def test_a_marker_still_held_by_a_live_taker_is_left_to_it(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool")
    _fill_marker(spool, 3)
    live = subprocess.Popen(["sleep", "60"])
    try:
        os.rename(os.path.join(spool, "overflow"), os.path.join(spool, f"overflow.taken.{live.pid}"))
        assert wire_spool.take_overflow(spool) is None
        assert os.path.exists(os.path.join(spool, f"overflow.taken.{live.pid}"))
    finally:
        live.kill()
        live.wait()
    assert wire_spool.take_overflow(spool)["dropped"] == 3, "counted once its taker is gone"


def test_corrupt_marker_reads_as_none_and_restarts(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    wire_spool.write_spool(str(spool), _event(), max_files=1)
    (spool / "overflow").write_text('{"dropped": "lots"}')
    assert wire_spool.read_overflow(str(spool)) is None
    with pytest.raises(wire_spool.SpoolFull):
        wire_spool.write_spool(str(spool), _event(cid="c2"), max_files=1)
    assert wire_spool.read_overflow(str(spool))["dropped"] == 1


def test_the_marker_is_updated_in_place_without_fsync_and_never_through_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node without its publisher counts every pod start and stop: no flush, no rename per drop."""
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    spool = tmp_path / "spool"
    wire_spool.write_spool(str(spool), _event(), max_files=1)
    outside = tmp_path / "outside"
    outside.write_text("not the marker")
    (spool / "overflow").symlink_to(outside)
    with pytest.raises(wire_spool.SpoolFull):
        wire_spool.write_spool(str(spool), _event(cid="c2"), max_files=1)
    assert outside.read_text() == "not the marker" and not (spool / "overflow").is_symlink()
    assert wire_spool.read_overflow(str(spool))["dropped"] == 1
    (spool / "overflow").write_text(json.dumps({"dropped": 7, "firstDroppedAt": 1.0, "lastDroppedAt": 2.0,
                                                "lastCommand": "DEL"}) + " " * 2000)  # longer than any update
    inode = (spool / "overflow").stat().st_ino
    for cid in ("c3", "c4"):
        with pytest.raises(wire_spool.SpoolFull):
            wire_spool.write_spool(str(spool), _event(op="CHECK", cid=cid), max_files=1)
    marker = wire_spool.read_overflow(str(spool))
    assert marker["dropped"] == 9 and marker["firstDroppedAt"] == 1.0 and marker["lastCommand"] == "CHECK"
    assert (spool / "overflow").stat().st_ino == inode and (spool / "overflow").stat().st_size < 2000
    assert synced == [], "the count is written like an event file: no fsync"
    assert wire_spool.take_overflow(str(spool))["dropped"] == 9


def test_parallel_plugin_processes_lose_no_count(plugin_exe: str, dirs: Dirs) -> None:
    """Many real plugin processes at once over a full spool: every drop is counted."""
    wire_spool.write_spool(dirs.spool, _event(cid="seed"))
    n = 24
    conf = dirs.conf(cniVersion="1.0.0", name="spool-net", prevResult=PREV, spoolMaxFiles=1)
    data = json.dumps(conf).encode()
    procs = []
    for i in range(n):
        env = {"CNI_COMMAND": "ADD" if i % 2 else "DEL", "CNI_CONTAINERID": f"p{i}", "CNI_NETNS": "/run/netns/x",
               "CNI_IFNAME": "eth0", "CNI_ARGS": POD_ARGS, "CNI_PATH": "/nonexistent"}
        procs.append(subprocess.Popen([plugin_exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env))
    for proc in procs:
        proc.stdin.write(data)
        proc.stdin.close()
    codes = [proc.wait(60) for proc in procs]
    for proc in procs:
        proc.stdout.close()
    assert codes == [0] * n
    marker = wire_spool.read_overflow(dirs.spool)
    assert marker["dropped"] == n
    assert len(wire_spool.list_spool(dirs.spool)) == 1
    assert sorted(os.listdir(dirs.spool)) == sorted([os.path.basename(wire_spool.list_spool(dirs.spool)[0]), "overflow"])


def test_spool_caps_are_validated(plugin_exe: str, dirs: Dirs) -> None:
    for bad in ({"spoolMaxFiles": "10"}, {"spoolMaxFiles": 0}, {"spoolMaxFiles": True}, {"spoolMaxFiles": 1.5},
                {"spoolMaxBytes": 100}, {"spoolMaxBytes": [1]}, {"spoolMaxBytes": 1 << 41}):
        rc, out, _ = _add(plugin_exe, dirs, **bad)
        error = json.loads(out)
        assert rc == 1 and error["code"] == 7 and next(iter(bad)) in error["msg"], (bad, error)


# ------------------------------------------------------------------ no symlink following


def test_symlinked_spool_dir_is_refused_not_followed(plugin_exe: str, dirs: Dirs, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.symlink(target, dirs.spool)
    rc, out, err = _add(plugin_exe, dirs)
    assert rc == 0, out + err  # Ignore: the pod starts; the event is lost, logged
    assert os.listdir(target) == [] and stat.S_IMODE(target.stat().st_mode) == 0o755, "never chmod-ed or written"
    rc, out, _ = _add(plugin_exe, dirs, failurePolicy="Fail")
    assert rc == 1 and json.loads(out)["code"] == 11
    errors = [r.get("spoolError", "") for r in dirs.log_records()]
    # O_DIRECTORY|O_NOFOLLOW on a symlink: ENOTDIR (or ELOOP), never the target.
    assert any("Not a directory" in e or "symbolic links" in e for e in errors), errors


def test_symlinked_state_dir_is_refused_not_followed(chain, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.symlink(target, chain.dirs.state)
    prev = chain.bridge_add()
    rc, out, _ = chain.netclaim("ADD", prev, interface={"mtu": 1400})
    assert rc == 1 and json.loads(out)["code"] == 5, out
    assert os.listdir(target) == [] and stat.S_IMODE(target.stat().st_mode) == 0o755
    assert chain.netns.link("eth0")["mtu"] == 1500, "nothing applied without saved originals"


def test_symlinked_state_file_is_not_read(plugin_exe: str, dirs: Dirs, tmp_path: Path) -> None:
    os.makedirs(dirs.state, mode=0o700)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"original": {"sysctl": {"/proc/sys/net/ipv4/ip_forward": "1"}}}))
    link = Path(dirs.state) / "spool-net:ctr1:eth0.state.json"
    link.symlink_to(secret)
    conf = dirs.conf(cniVersion="1.0.0", name="spool-net")
    rc, out, err = run_plugin(plugin_exe, "DEL", conf, netns="/run/netns/ncpl-none")
    assert (rc, out) == (0, ""), err
    assert secret.exists()


def test_spool_dir_mode_is_fixed_on_the_dir_itself(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o777)
    os.chmod(spool, 0o777)
    wire_spool.write_spool(str(spool), _event())
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in spool.iterdir())


def test_a_spooled_event_is_written_without_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No fsync of the file or the directory: an OS crash that loses the file destroyed its sandbox too.

    os.fsync/os.fdatasync are wrapped to record their callers' arguments (they still sync);
    everything else is the real write path.
    """
    synced: list[int] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real_fdatasync(fd))[1])
    spool = str(tmp_path / "spool")
    event = _event()
    path = wire_spool.write_spool(spool, event)
    assert synced == []
    assert wire_spool.read_spool(path).to_dict() == event.to_dict()
    assert os.listdir(spool) == [os.path.basename(path)], "no temp file left"


def test_a_reader_never_sees_a_half_written_spool_file(tmp_path: Path) -> None:
    """Without fsync the write is still temp file + rename: a listing shows whole events only."""
    spool = str(tmp_path / "spool")
    result = {"cniVersion": "1.1.0", "pad": "x" * (200 << 10)}  # near the event cap
    done = threading.Event()
    problems: list[str] = []
    seen: set[str] = set()

    def read_all() -> None:
        while not done.is_set():
            for path in wire_spool.list_spool(spool):
                try:
                    wire_spool.read_spool(path)
                    seen.add(path)
                except FileNotFoundError:
                    pass
                except wire_event.WireError as exc:
                    problems.append(f"{path}: {exc}")

    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        for i in range(40):
            wire_spool.write_spool(spool, wire_event.Event(op="ADD", container_id=f"c{i}", ifname="eth0",
                                               driver="net.example.com", result=result))
    finally:
        done.set()
        reader.join(30)
    assert problems == [] and seen, (problems, len(seen))


# ------------------------------------------------------------------ one deadline for connect + send + ack


class TricklingPublisher:
    """Accepts, reads the event, then sends a valid ack one byte at a time.

    Each byte arrives well within ackTimeoutMs, so a per-call timeout never
    fires and the plugin would wait for the whole trickle; with one deadline
    for the whole hand-off it gives up and spools the event.
    """

    def __init__(self, path: str, gap: float) -> None:
        self.gap = gap
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        self.done = threading.Event()
        self.sent_all = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            request = wire_frame.read_frame(conn)
            frame = wire_frame.encode_frame({"ok": True, "id": request["event"]["event_id"]})
            try:
                for i in range(len(frame)):
                    conn.sendall(frame[i:i + 1])
                    if self.done.wait(self.gap):
                        break
                else:
                    self.sent_all.append(True)
            except OSError:
                self.sent_all.append(False)  # the plugin hung up mid-trickle
        self.done.set()

    def close(self) -> None:
        self.done.set()
        self.sock.close()
        self.thread.join(10)


def test_ack_timeout_bounds_the_whole_hand_off_not_each_call(plugin_exe: str, dirs: Dirs) -> None:
    pub = TricklingPublisher(dirs.socket, gap=0.15)  # ~40-byte ack: ~6 s in all, 0.15 s per byte
    try:
        rc, out, err = _add(plugin_exe, dirs, ackTimeoutMs=600)
        assert rc == 0, out + err
        pub.thread.join(15)
    finally:
        pub.close()
    assert pub.sent_all == [False], "the plugin hung up before the trickled ack was complete"
    assert [e.op for e in dirs.spooled()] == ["ADD"], "gave up on the socket and spooled"
    spooled = [r for r in dirs.log_records() if r["msg"] == "event spooled"]
    assert spooled and ("Timeout" in spooled[0]["socketError"] or "timed out" in spooled[0]["socketError"])


# ------------------------------------------------------------------ run by hand


def test_version_and_help_by_hand(plugin_exe: str) -> None:
    from cni_plugin import __version__

    env = {"PATH": os.environ.get("PATH", "")}
    got = subprocess.run([plugin_exe, "--version"], env=env, capture_output=True, text=True, timeout=30)
    assert got.returncode == 0 and got.stdout.splitlines()[0] == f"netclaim {__version__}"
    assert "1.1.0" in got.stdout and got.stderr == ""
    got = subprocess.run([plugin_exe, "--help"], env=env, capture_output=True, text=True, timeout=30)
    assert got.returncode == 0 and "usage: netclaim" in got.stdout and __version__ in got.stdout
    # Other arguments are not the plugin's (a wrapper may pass its own): a CNI run as usual.
    got = subprocess.run([plugin_exe, "--frobnicate"], input="{}", env=env, capture_output=True, text=True,
                         timeout=30)
    assert got.returncode == 1 and json.loads(got.stdout)["code"] == 4


def test_run_by_hand_on_a_terminal_prints_usage(plugin_exe: str) -> None:
    """No CNI_COMMAND and a terminal on stdin: what this is, on stderr, exit 0 (like libcni's skel)."""
    import pty

    leader, follower = pty.openpty()
    try:
        got = subprocess.run([plugin_exe], stdin=follower, env={"PATH": os.environ.get("PATH", "")},
                             capture_output=True, text=True, timeout=30)
    finally:
        os.close(leader)
        os.close(follower)
    assert got.returncode == 0 and got.stdout == "" and "usage: netclaim" in got.stderr


def test_without_cni_command_on_a_pipe_is_still_error_4(plugin_exe: str) -> None:
    got = subprocess.run([plugin_exe], input=b"{}", env={}, capture_output=True, timeout=30)
    assert got.returncode == 1 and json.loads(got.stdout)["code"] == 4


def test_version_comes_from_the_package(plugin_exe: str) -> None:
    """One version source: the package's __version__ is what setup.cfg publishes."""
    from cni_plugin import __version__

    cfg = (Path(__file__).resolve().parents[2] / "setup.cfg").read_text()
    assert "version = attr: cni_plugin.wire.version.__version__" in cfg
    assert __version__.count(".") == 2
