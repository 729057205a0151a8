"""the plugin's input and hand-off: each test drives the real plugin executable
through the path a node takes, on real parts (a tiny tmpfs filled up or remounted
read-only, the real unprivileged uid `nobody`, a real socket served by it).

Item 6  a short write on a nearly full disk never becomes a "spooled" event.
Item 9  STATUS under Fail agrees with what ADD would do with the spool.
Item 13 one per-event size cap, enforced before hand-off (and a bounded stdin).
Item 15 a document nested deeper than the limit is refused with code 6.
Item 16 no path component is followed through a link an unprivileged user planted.
Item 17 the socket counts only when root serves it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import spool as wire_spool

from .conftest import POD_ARGS, Dirs, PublisherDouble, Tmpfs, as_nobody, run_plugin

SANDBOX_IF = {"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 1500, "sandbox": "/run/netns/x"}


def prev_result(routes: int = 0, **extra: object) -> dict:
    """A bridge-shaped prevResult; `routes` makes it as large as a test needs (~45 bytes each)."""
    prev = {"cniVersion": "1.0.0", "interfaces": [SANDBOX_IF],
            "ips": [{"address": "10.1.0.5/24", "interface": 0}],
            "routes": [{"dst": f"10.{i // 250}.{i % 250}.0/24", "gw": "10.1.0.1"} for i in range(routes)]}
    prev.update(extra)
    return prev


def add(exe: str, dirs: Dirs, prev: dict, **extra: object) -> tuple[int, str, str]:
    conf = dirs.conf(cniVersion="1.0.0", name="limits-net", prevResult=prev, **extra)
    return run_plugin(exe, "ADD", conf, netns="/run/netns/ncpl-none", args=POD_ARGS)


def status(exe: str, dirs: Dirs, **extra: object) -> tuple[int, str, str]:
    conf = dirs.conf(cniVersion="1.1.0", name="limits-net", **{"failurePolicy": "Fail", **extra})
    return run_plugin(exe, "STATUS", conf, container_id="", ifname="")


def error_of(out: str) -> dict:
    return json.loads(out)


def leftovers(directory: str | Path) -> list[str]:
    """Event files and temp files in a spool dir (the overflow marker is neither)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".json") or n.endswith(".tmp"))


def nested(depth: int) -> object:
    value: object = 1
    for i in range(depth):
        value = {"x": value} if i % 2 else [value]
    return value


# ------------------------------------------------------------------ item 6: a short write is a failure


def test_short_write_on_full_disk_is_not_spooled(plugin_exe: str, dirs: Dirs, tmpfs_factory) -> None:
    """Spool on a 64 KiB tmpfs with one page free; the event is ~10 KiB; no publisher."""
    fs: Tmpfs = tmpfs_factory("64k")
    spool = fs.path / "spool"
    spool.mkdir(mode=0o700)
    fs.fill(leave=4096)
    prev = prev_result(routes=220)
    assert len(json.dumps(prev)) > 8192, "the event must not fit in the free page"

    rc, out, err = add(plugin_exe, dirs, prev, spoolDir=str(spool), failurePolicy="Fail")
    assert rc == 1, out + err
    error = error_of(out)
    assert error["code"] == 11 and "No space left" in error["details"], error
    assert leftovers(spool) == [], "no truncated event and no temp file remains"

    rc, out, err = add(plugin_exe, dirs, prev, spoolDir=str(spool))  # Ignore: a logged drop
    assert (rc, leftovers(spool)) == (0, []), out + err
    lost = [r for r in dirs.log_records() if r["msg"] == "event not handed off"]
    assert lost and lost[-1]["outcome"] == "lost" and "No space left" in lost[-1]["spoolError"]
    assert fs.free() == 4096, "nothing of the failed writes holds space"


def test_dead_writers_temp_files_are_cleaned_live_ones_counted(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    wire_spool.write_spool(str(spool), wire_event.Event(op="ADD", container_id="c0", ifname="eth0", driver="d"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dead_tmp = spool / f"0001-x.event.json.{dead.pid}.tmp"
    dead_tmp.write_bytes(b"x" * 3000)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a live writer
    live_tmp = spool / f"0002-y.event.json.{writer.pid}.tmp"
    live_tmp.write_bytes(b"y" * 3000)
    event_size = os.path.getsize(wire_spool.list_spool(str(spool))[0])
    # Two events fit with room to spare, but not beside the live writer's 3,000 bytes. The margin
    # matters: one event's size differs from the next by a few bytes (its timestamps' digits).
    cap = event_size * 2 + 3000 - 100
    try:
        with pytest.raises(wire_spool.SpoolFull):  # the live writer's bytes count against the cap
            wire_spool.write_spool(str(spool), wire_event.Event(op="ADD", container_id="c1", ifname="eth0", driver="d"),
                             max_bytes=cap)
    finally:
        writer.kill()
        writer.wait()
    assert not dead_tmp.exists(), "a dead writer's temp file is removed"
    assert live_tmp.exists(), "a live writer's temp file is left alone"
    wire_spool.write_spool(str(spool), wire_event.Event(op="ADD", container_id="c2", ifname="eth0", driver="d"),
                     max_bytes=cap)  # its writer died: the temp file goes, room again
    assert len(wire_spool.list_spool(str(spool))) == 2 and not live_tmp.exists()


# ------------------------------------------------------------------ item 9: STATUS agrees with ADD


def test_status_fails_on_a_full_spool_file_system(plugin_exe: str, dirs: Dirs, tmpfs_factory) -> None:
    fs = tmpfs_factory("64k")
    fs.fill(leave=0)
    spool = str(fs.path / "spool")
    rc, out, err = status(plugin_exe, dirs, spoolDir=spool)
    assert rc == 1 and error_of(out)["code"] == 50, out + err
    assert "full" in error_of(out)["details"] or "No space" in error_of(out)["details"], out
    rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=spool, failurePolicy="Fail")
    assert rc == 1 and error_of(out)["code"] == 11, "ADD fails there too: STATUS told the truth"
    assert status(plugin_exe, dirs, spoolDir=spool, failurePolicy="Ignore")[:2] == (0, "")


def test_status_fails_on_a_read_only_spool(plugin_exe: str, dirs: Dirs, tmpfs_factory) -> None:
    fs = tmpfs_factory("1m")
    spool = fs.path / "spool"
    spool.mkdir(mode=0o700)
    fs.remount_read_only()
    rc, out, err = status(plugin_exe, dirs, spoolDir=str(spool))
    assert rc == 1 and error_of(out)["code"] == 50 and "Read-only" in error_of(out)["details"], out + err
    rc, out, _ = add(plugin_exe, dirs, prev_result(), spoolDir=str(spool), failurePolicy="Fail")
    assert rc == 1 and error_of(out)["code"] == 11


def test_status_ok_on_a_healthy_spool_and_leaves_nothing(plugin_exe: str, dirs: Dirs,
                                                                       tmpfs_factory) -> None:
    fs = tmpfs_factory("1m")
    spool = fs.path / "spool"
    rc, out, err = status(plugin_exe, dirs, spoolDir=str(spool))
    assert (rc, out) == (0, ""), out + err
    assert spool.is_dir() and stat.S_IMODE(spool.stat().st_mode) == 0o700, "created as ADD would"
    assert os.listdir(spool) == [], "the probe file is gone"
    rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=str(spool), failurePolicy="Fail")
    assert rc == 0 and len(wire_spool.list_spool(str(spool))) == 1, out + err


# ------------------------------------------------------------------ item 13: one event size cap


def test_oversized_prev_result_is_refused_on_both_channels(plugin_exe: str, dirs: Dirs,
                                                                          publisher: PublisherDouble) -> None:
    prev = prev_result(routes=60000)  # ~2.6 MiB
    assert 2 << 20 < len(json.dumps(prev)) < 3 << 20
    rc, out, err = add(plugin_exe, dirs, prev, failurePolicy="Fail")
    assert rc == 1, out + err
    error = error_of(out)
    assert error["code"] == 7 and "prevResult" in error["msg"] and str(wire_event.MAX_EVENT_BYTES) in error["msg"], error
    assert publisher.events == [] and leftovers(dirs.spool) == [], "nothing sent, nothing spooled"

    rc, out, err = add(plugin_exe, dirs, prev)  # Ignore: the pod starts, the report is a logged drop
    assert rc == 0 and json.loads(out)["routes"] == prev["routes"], err
    assert publisher.events == [] and leftovers(dirs.spool) == []
    dropped = [r for r in dirs.log_records() if r["msg"] == "event not handed off: too large"]
    assert dropped and dropped[-1]["outcome"] == "too-large"


def test_event_just_under_the_cap_is_still_handed_off(plugin_exe: str, dirs: Dirs,
                                                                     publisher: PublisherDouble) -> None:
    prev = prev_result(routes=4000)  # ~180 KiB: a huge but acceptable result
    rc, out, err = add(plugin_exe, dirs, prev, failurePolicy="Fail")
    assert rc == 0, out + err
    assert len(publisher.events) == 1 and len(publisher.events[0].result["routes"]) == 4000


def test_stdin_is_read_bounded(plugin_exe: str, dirs: Dirs) -> None:
    from cni_plugin.config import MAX_STDIN_BYTES

    conf = dirs.conf(cniVersion="1.0.0", name="limits-net", prevResult=prev_result(),
                     padding="p" * (MAX_STDIN_BYTES + 10))
    for command in ("ADD", "DEL"):
        rc, out, err = run_plugin(plugin_exe, command, conf, netns="/run/netns/ncpl-none", args=POD_ARGS)
        assert rc == 1 and error_of(out)["code"] == 6 and "larger than" in error_of(out)["msg"], out + err
    assert leftovers(dirs.spool) == []


# ------------------------------------------------------------------ item 15: nesting depth


def test_deep_prev_result_is_refused_with_code_6(plugin_exe: str, dirs: Dirs) -> None:
    prev = prev_result(dns={"options": [nested(700)]})
    for policy in ("Ignore", "Fail"):
        rc, out, err = add(plugin_exe, dirs, prev, failurePolicy=policy)
        assert rc == 1, out + err
        error = error_of(out)
        assert error["code"] == 6 and "nested more than 64" in error["msg"], error
    assert leftovers(dirs.spool) == [], "never handed off"
    # DEL still cleans up: the too-deep prevResult alone is dropped (the chain must not block).
    conf = dirs.conf(cniVersion="1.0.0", name="limits-net", prevResult=prev)
    rc, out, err = run_plugin(plugin_exe, "DEL", conf, netns="/run/netns/ncpl-none", args=POD_ARGS)
    assert (rc, out) == (0, ""), err
    (event,) = dirs.spooled()
    assert event.op == "DEL" and event.result is None


def test_depth_limit_allows_sane_nesting(plugin_exe: str, dirs: Dirs) -> None:
    rc, out, err = add(plugin_exe, dirs, prev_result(dns={"options": [nested(50)]}))
    assert rc == 0, out + err


# ------------------------------------------------------------------ item 16: no link an unprivileged user planted


@pytest.fixture
def hostile_tree():
    """base (root 0755) / victim (root's dir with a 0755 `spool` in it) and home (owned by nobody)."""
    base = Path(tempfile.mkdtemp(prefix="nc16-"))
    os.chmod(base, 0o755)
    victim = base / "victim"
    (victim / "spool").mkdir(parents=True, mode=0o755)
    os.chmod(victim / "spool", 0o755)
    home = base / "home"
    home.mkdir(mode=0o755)
    os.chown(home, 65534, 65534)
    try:
        yield base, victim, home
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_symlinked_parent_planted_by_nobody_is_not_followed(plugin_exe: str, dirs: Dirs,
                                                                           hostile_tree) -> None:
    _, victim, home = hostile_tree
    as_nobody("ln", "-s", str(victim), str(home / "sub"))  # the real unprivileged user plants the links
    as_nobody("ln", "-s", str(victim), str(home / "logs"))
    spool, log = str(home / "sub" / "spool"), str(home / "logs" / "p.log")

    rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=spool, logFile=log)
    assert rc == 0, out + err  # Ignore: the pod starts; the event is lost and said so
    assert sorted(os.listdir(victim)) == ["spool"] and os.listdir(victim / "spool") == [], "nothing written there"
    assert stat.S_IMODE((victim / "spool").stat().st_mode) == 0o755, "nothing chmod-ed there"
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    lost = [r for r in records if r["msg"] == "event not handed off"]
    assert lost and "owned by uid 65534" in lost[0]["spoolError"], records
    assert "owned by uid 65534" in lost[0].get("logFileError", ""), "the log says why it is on stderr"

    rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=spool, logFile=log, failurePolicy="Fail")
    assert rc == 1, out + err
    error = error_of(out)
    assert error["code"] == 11 and "owned by uid 65534, not root" in error["details"], error
    assert sorted(os.listdir(victim)) == ["spool"] and os.listdir(victim / "spool") == []
    rc, out, _ = status(plugin_exe, dirs, spoolDir=spool, logFile=log)
    assert rc == 1 and error_of(out)["code"] == 50


def test_dir_owned_by_nobody_is_refused_even_without_links(plugin_exe: str, dirs: Dirs,
                                                                          hostile_tree) -> None:
    _, _, home = hostile_tree
    as_nobody("mkdir", str(home / "real"))
    rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=str(home / "real" / "spool"),
                       failurePolicy="Fail")
    assert rc == 1 and "owned by uid 65534" in error_of(out)["details"], out + err
    assert not (home / "real" / "spool").exists(), "root created nothing in a directory nobody controls"


def test_sticky_world_writable_ancestor_is_allowed(plugin_exe: str, dirs: Dirs, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=str(shared / "netclaim" / "spool"),
                       failurePolicy="Fail")
    assert rc == 0 and len(wire_spool.list_spool(str(shared / "netclaim" / "spool"))) == 1, out + err
    assert stat.S_IMODE((shared / "netclaim").stat().st_mode) == 0o755


# ------------------------------------------------------------------ item 17: the socket must be root's

_NOBODY_SERVER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(4)
print("listening", flush=True)
while True:
    conn, _ = s.accept()
    data = conn.recv(65536)
    if data:
        print("GOT", len(data), flush=True)
        body = b'{"ok":true,"id":"stolen"}'
        conn.sendall(len(body).to_bytes(4, "big") + body)
    else:
        print("EMPTY", flush=True)
    conn.close()
"""


def test_socket_served_by_nobody_gets_no_event(plugin_exe: str, dirs: Dirs, hostile_tree) -> None:
    _, _, home = hostile_tree
    sock = str(home / "pub.sock")
    server = subprocess.Popen(["/usr/bin/python3", "-I", "-c", _NOBODY_SERVER, sock], user="nobody",
                              group="nogroup", extra_groups=[], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        rc, out, err = add(plugin_exe, dirs, prev_result(), socketPath=sock, failurePolicy="Fail")
        assert rc == 0, out + err
        assert [e.op for e in dirs.spooled()] == ["ADD"], "spooled instead"
        spooled = [r for r in dirs.log_records() if r["msg"] == "event spooled"]
        assert "served by uid 65534, not root" in spooled[-1]["socketError"]
        # STATUS does not count nobody's socket as the publisher either.
        broken = str(home / "nospool" / "spool")  # nobody's dir: the spool is refused too
        rc, out, _ = status(plugin_exe, dirs, socketPath=sock, spoolDir=broken)
        assert rc == 1 and error_of(out)["code"] == 50
    finally:
        server.kill()
        output = server.communicate(timeout=10)[0]
    assert "GOT" not in output, f"the event reached a socket that root does not serve: {output}"
