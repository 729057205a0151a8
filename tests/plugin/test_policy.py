"""The node-safety policy (docs/plugin.md, "Node-safety policy"), one test per
table row, each through the real `netclaim` executable exactly as a runtime
runs it (env + config on stdin, exit code + stdout read back).

Rows that need a real sandbox (restore refused, vanished netns) use the real
bridge + host-local chain in a real netns.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import spool as wire_spool

from .conftest import POD_ARGS, Chain, Dirs, run_plugin

MAC_MTU_PREV = {"cniVersion": "1.0.0", "interfaces": [
    {"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 1500, "sandbox": "/run/netns/x"}],
    "ips": [{"address": "10.9.0.2/24", "interface": 0}]}


def _conf(dirs: Dirs, command: str, policy: str, **extra: object) -> dict:
    version = "1.1.0" if command in ("STATUS", "GC") else "1.0.0"
    conf = dirs.conf(cniVersion=version, name="policy-net", failurePolicy=policy)
    if command == "ADD":
        conf["prevResult"] = MAC_MTU_PREV
    conf.update(extra)
    return {k: v for k, v in conf.items() if v is not _DROP}


_DROP = object()


def _exec(exe: str, command: str, conf: dict | bytes, **kw: str) -> tuple[int, str, str]:
    netns = kw.pop("netns", "/run/netns/ncpl-none" if command in ("ADD", "CHECK") else "")
    stdin = conf if isinstance(conf, bytes) else None
    return run_plugin(exe, command, conf if isinstance(conf, dict) else {}, netns=netns, stdin=stdin,
                      args=POD_ARGS, **kw)


def _error(out: str) -> dict:
    error = json.loads(out)
    assert set(error) == {"cniVersion", "code", "msg", "details"}, error
    return error


# ------------------------------------------------------------------ set-ups of the failure column


def _spool_full(dirs: Dirs) -> dict:
    """The spool already at a cap of one file."""
    event = wire_event.Event(op="ADD", container_id="old", ifname="eth0", driver="net.example.com")
    wire_spool.write_spool(dirs.spool, event)
    return {"spoolMaxFiles": 1}


def _spool_unwritable(dirs: Dirs) -> dict:
    blocker = Path(dirs.root) / "blocker"
    blocker.write_text("")
    return {"spoolDir": str(blocker / "spool")}


FAILURES = {
    "publisher absent, spool ok": lambda d: {},
    "publisher absent, spool full": _spool_full,
    "publisher absent, spool unwritable": _spool_unwritable,
}


# ------------------------------------------------------------------ ADD


@pytest.mark.parametrize("failure,policy,rc,code,outcome", [
    ("publisher absent, spool ok", "Ignore", 0, None, "spooled"),
    ("publisher absent, spool ok", "Fail", 0, None, "spooled"),
    ("publisher absent, spool full", "Ignore", 0, None, "dropped"),
    ("publisher absent, spool full", "Fail", 1, 11, "dropped"),
    ("publisher absent, spool unwritable", "Ignore", 0, None, "lost"),
    ("publisher absent, spool unwritable", "Fail", 1, 11, "lost"),
])
def test_add_hand_off_failures(plugin_exe: str, dirs: Dirs, failure: str, policy: str, rc: int,
                               code: int | None, outcome: str) -> None:
    extra = FAILURES[failure](dirs)
    got_rc, out, err = _exec(plugin_exe, "ADD", _conf(dirs, "ADD", policy, **extra))
    assert got_rc == rc, out + err
    if code is None:
        assert json.loads(out)["interfaces"][0]["mac"] == "02:00:00:00:00:01"
    else:
        assert _error(out)["code"] == code
    handoffs = [r.get("handoff") or r.get("outcome") for r in dirs.log_records()
                if r["msg"] in ("ADD done", "event not handed off")]
    assert outcome in handoffs, handoffs
    if outcome == "dropped":
        marker = wire_spool.read_overflow(dirs.spool)
        assert marker is not None and marker["dropped"] == 1 and marker["lastCommand"] == "ADD"
        assert len(wire_spool.list_spool(dirs.spool)) == 1, "the cap holds: the event was not written"


@pytest.mark.parametrize("extra,code", [
    ({"driverName": _DROP}, 7),
    ({"cniVersion": "9.9.9"}, 1),
    ({"spoolMaxFiles": "many"}, 7),
    ({"prevResult": _DROP}, 7),
])
def test_add_config_errors_fail_as_before(plugin_exe: str, dirs: Dirs, extra: dict, code: int) -> None:
    rc, out, err = _exec(plugin_exe, "ADD", _conf(dirs, "ADD", "Ignore", **extra))
    assert rc == 1 and _error(out)["code"] == code, out + err


# ------------------------------------------------------------------ DEL


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
def test_del_hand_off_failures_exit_0(plugin_exe: str, dirs: Dirs, failure: str, policy: str) -> None:
    extra = FAILURES[failure](dirs)
    rc, out, err = _exec(plugin_exe, "DEL", _conf(dirs, "DEL", policy, **extra))
    assert (rc, out) == (0, ""), out + err
    if failure == "publisher absent, spool full":
        assert wire_spool.read_overflow(dirs.spool)["lastCommand"] == "DEL"
    if failure == "publisher absent, spool ok":
        assert [e.op for e in dirs.spooled()] == ["DEL"]


@pytest.mark.parametrize("extra", [
    {"driverName": _DROP},
    {"driverName": 42},
    {"driverName": "x" * 70},
    {"cniVersion": "9.9.9"},
    {"cniVersion": _DROP},
    {"name": "bad name"},
    {"spoolDir": "relative/spool"},
    {"logFile": 3},
    {"failurePolicy": "Sometimes"},
    {"ackTimeoutMs": "fast"},
    {"spoolMaxBytes": True},
    {"interface": {"mtu": "big"}},
    {"prevResult": [1, 2]},
], ids=lambda e: ",".join(f"{k}={'absent' if v is _DROP else v!r}"[:40] for k, v in e.items()))
@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
def test_del_with_invalid_config_exits_0_and_records_what_it_can(plugin_exe: str, dirs: Dirs, extra: dict,
                                                                 policy: str) -> None:
    rc, out, err = _exec(plugin_exe, "DEL", _conf(dirs, "DEL", policy, **extra))
    assert (rc, out) == (0, ""), out + err
    logs = dirs.log_records() or [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(r["msg"].startswith("DEL with an invalid config") for r in logs), logs
    driver_ok = "driverName" not in extra
    # What it could: with a usable driverName and spool dir the DEL event still reaches the spool.
    if driver_ok and "spoolDir" not in extra:
        assert [e.op for e in dirs.spooled()] == ["DEL"]
    if not driver_ok:
        assert dirs.spooled() == []


def test_del_with_corrupt_state_file_exits_0_and_drops_it(plugin_exe: str, dirs: Dirs) -> None:
    os.makedirs(dirs.state, mode=0o700)
    state = Path(dirs.state) / "policy-net:ctr1:eth0.state.json"
    state.write_bytes(b"\x00{not json")
    rc, out, err = _exec(plugin_exe, "DEL", _conf(dirs, "DEL", "Fail"), netns="/run/netns/ncpl-gone")
    assert (rc, out) == (0, ""), out + err
    assert not state.exists()


def test_del_with_state_file_of_wrong_shape_exits_0(chain: Chain) -> None:
    """A state file that parses but holds nonsense: restore refuses each value, DEL exits 0."""
    prev = chain.bridge_add()
    os.makedirs(chain.dirs.state, mode=0o700)
    path = Path(chain.dirs.state) / f"{chain.network}:{chain.container_id}:eth0.state.json"
    path.write_text(json.dumps({"original": {"mtu": "huge", "mac": 5, "up": "no", "sysctl": ["x"]}}))
    rc, out, err = chain.netclaim("DEL", prev, failurePolicy="Fail")
    assert (rc, out) == (0, ""), out + err
    assert chain.netns.link("eth0")["mtu"] == 1500
    assert not path.exists()


def test_del_restore_refuses_paths_outside_proc_sys_net(chain: Chain, tmp_path: Path) -> None:
    """A state file naming any path but /proc/sys/net/...: refused, logged, DEL exits 0."""
    prev = chain.bridge_add()
    victim = tmp_path / "victim"
    victim.write_text("original")
    link = tmp_path / "link-into-proc"
    link.symlink_to("/proc/sys/kernel/hostname")
    originals = {
        str(victim): "overwritten",
        "/proc/sys/net/../kernel/hostname": "pwned",
        f"/proc/sys/net/ipv4/conf/eth0/../../../../kernel/domainname": "pwned",
        str(link): "pwned",
        "/proc/sys/net/ipv4/conf/eth0/arp_filter": "0",
    }
    hostname = Path("/proc/sys/kernel/hostname").read_text()
    os.makedirs(chain.dirs.state, mode=0o700)
    path = Path(chain.dirs.state) / f"{chain.network}:{chain.container_id}:eth0.state.json"
    path.write_text(json.dumps({"original": {"sysctl": originals}}))
    chain.netns.ip("link", "show", "eth0")
    subprocess_set = ["ip", "netns", "exec", chain.netns.name, "sh", "-c",
                      "echo 1 > /proc/sys/net/ipv4/conf/eth0/arp_filter"]
    import subprocess

    subprocess.run(subprocess_set, check=True)
    rc, out, err = chain.netclaim("DEL", prev)
    assert (rc, out) == (0, ""), out + err
    assert victim.read_text() == "original"
    assert Path("/proc/sys/kernel/hostname").read_text() == hostname
    assert chain.netns.read("/proc/sys/net/ipv4/conf/eth0/arp_filter") == "0", "the legitimate path is restored"
    refused = [r for r in chain.dirs.log_records() if r["msg"] == "restore incomplete"]
    assert refused and sum("refused" in f for f in refused[0]["failed"]) == 4


@pytest.mark.parametrize("stdin,code", [(b"{", 6), (b"\xff", 6), (b"[]", 6)])
def test_del_protocol_errors_keep_their_spec_code(plugin_exe: str, stdin: bytes, code: int) -> None:
    """Undecodable stdin is the caller's error, not netclaim's: libcni always
    marshals the config itself, so this is never a runtime's teardown."""
    rc, out, _ = _exec(plugin_exe, "DEL", stdin)
    assert rc == 1 and _error(out)["code"] == code


def test_del_without_container_id_is_error_4(plugin_exe: str, dirs: Dirs) -> None:
    rc, out, _ = _exec(plugin_exe, "DEL", _conf(dirs, "DEL", "Ignore"), container_id="")
    assert rc == 1 and _error(out)["code"] == 4


# ------------------------------------------------------------------ STATUS


@pytest.mark.parametrize("failure,policy,code", [
    ("publisher absent, spool ok", "Ignore", None),
    ("publisher absent, spool ok", "Fail", None),
    ("publisher absent, spool full", "Ignore", None),
    ("publisher absent, spool full", "Fail", 50),
    ("publisher absent, spool unwritable", "Ignore", None),
    ("publisher absent, spool unwritable", "Fail", 50),
])
def test_status_follows_the_policy(plugin_exe: str, dirs: Dirs, failure: str, policy: str,
                                   code: int | None) -> None:
    extra = FAILURES[failure](dirs)
    rc, out, err = _exec(plugin_exe, "STATUS", _conf(dirs, "STATUS", policy, **extra))
    if code is None:
        assert (rc, out) == (0, ""), out + err
    else:
        assert rc == 1 and _error(out)["code"] == code
    assert not os.path.exists(os.path.join(dirs.spool, "overflow")) or failure.endswith("full")


@pytest.mark.parametrize("failure", ["publisher absent, spool full", "publisher absent, spool unwritable"])
def test_status_ready_when_the_publisher_listens(plugin_exe: str, dirs: Dirs, failure: str) -> None:
    extra = FAILURES[failure](dirs)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(dirs.socket)
        listener.listen(4)
        rc, out, err = _exec(plugin_exe, "STATUS", _conf(dirs, "STATUS", "Fail", **extra))
    assert (rc, out) == (0, ""), out + err


@pytest.mark.parametrize("extra,policy,code", [
    ({"driverName": _DROP}, "Ignore", None),
    ({"cniVersion": "9.9.9"}, "Ignore", None),
    ({"spoolMaxFiles": 0}, "Ignore", None),
    ({"driverName": _DROP}, "Fail", 7),
    ({"cniVersion": "9.9.9"}, "Fail", 1),
    ({"cniVersion": "1.0.0"}, "Ignore", 1),  # STATUS needs 1.1.0: the caller's protocol error
])
def test_status_with_invalid_config(plugin_exe: str, dirs: Dirs, extra: dict, policy: str, code: int | None) -> None:
    rc, out, err = _exec(plugin_exe, "STATUS", _conf(dirs, "STATUS", policy, **extra))
    if code is None:
        assert (rc, out) == (0, ""), out + err
    else:
        assert rc == 1 and _error(out)["code"] == code, out + err


# ------------------------------------------------------------------ protocol rows (every verb)


@pytest.mark.parametrize("command,extra,env,code", [
    ("CHECK", {"cniVersion": "0.3.1"}, {}, 1),
    ("GC", {"cniVersion": "1.0.0"}, {}, 1),
    ("GC", {"cni.dev/valid-attachments": {}}, {}, 7),  # not a list (null or absent: none valid)
    ("ADD", {"interface": {"mtu": 1400}}, {"netns": "/run/netns/ncpl-none"}, 3),
    ("ADD", {}, {"ifname": "a b"}, 4),
    ("STATUS", {}, {"container_id": "bad/id"}, 4),
    ("GC", {"cni.dev/valid-attachments": []}, {"ifname": "x" * 16}, 4),
], ids=["check-predates", "gc-predates", "gc-attachments-not-a-list", "add-netns-unknown", "add-bad-ifname",
        "status-bad-containerid", "gc-long-ifname"])
def test_protocol_errors_keep_their_spec_code(plugin_exe: str, dirs: Dirs, command: str, extra: dict, env: dict,
                                              code: int) -> None:
    conf = _conf(dirs, command, "Ignore", **extra)
    if command == "CHECK":
        conf["prevResult"] = dict(MAC_MTU_PREV, cniVersion="0.3.1")
    rc, out, err = _exec(plugin_exe, command, conf, **env)
    assert rc == 1 and _error(out)["code"] == code, out + err


@pytest.mark.parametrize("command", ["ADD", "CHECK", "GC", "STATUS"])
@pytest.mark.parametrize("stdin", [b"{\"cniVersion\": \"1.1.0\", \"name\": \"x", b"\xc3(", b"1e400", b"{} {}"])
def test_undecodable_stdin_is_6_for_every_verb(plugin_exe: str, command: str, stdin: bytes) -> None:
    rc, out, _ = _exec(plugin_exe, command, stdin)
    assert rc == 1 and _error(out)["code"] == 6
