"""The socket: who may talk to it, what happens with bad frames, and when an ack is given.

These tests point the publisher at an API server address where nothing listens
(a stand-in, named as such: the socket side must work while the API is down,
which is exactly the situation they exercise). Everything else is real: the
publisher process, its unix socket, the kernel's SO_PEERCRED, SQLite.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import struct

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import encode_frame, event_request, read_frame
from cni_plugin.wire.spool import write_spool
from peers import run_as_uid
from publisher_testkit import Publisher, cni_result, request, unreachable_kubeconfig, wire_event


POD = PodRef("ns", "pod", "uid-1")


@pytest.fixture()
def offline(workdir):
    """Start publishers whose API server is unreachable; killed at teardown."""
    kubeconfig = unreachable_kubeconfig(workdir)
    started: list[Publisher] = []

    def make(extra: list[str] | None = None, sub: str = "p", start: bool = True) -> Publisher:
        d = workdir / sub
        d.mkdir(exist_ok=True)
        p = Publisher(str(kubeconfig), d, extra=list(extra or []))
        started.append(p)
        return p.start() if start else p

    yield make
    for p in started:
        p.kill()


def journal_events(p: Publisher) -> list[tuple[str, str, str]]:
    db = sqlite3.connect(os.path.join(p.state, "journal.db"))
    try:
        return db.execute("SELECT event_id, op, container_id FROM events ORDER BY seq").fetchall()
    finally:
        db.close()


def send_as_uid(path: str, uid: int, message: dict) -> dict:
    """Send one request from a child running as `uid`; returns its reply."""

    def send() -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(path)
            sock.sendall(encode_frame(message))
            return read_frame(sock)

    return run_as_uid(uid, send)


def open_socket_to_everyone(p: Publisher) -> None:
    """Let another uid reach the socket file, so that SO_PEERCRED is what decides."""
    for d in (p.workdir.parent, p.workdir, os.path.dirname(p.socket)):
        os.chmod(d, 0o711)
    os.chmod(p.socket, 0o666)


def test_socket_is_private_by_default(offline):
    p = offline()
    assert os.stat(p.socket).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(p.socket)).st_mode & 0o777 == 0o700


def test_peer_with_another_uid_is_refused_unless_allowed(offline):
    p = offline()
    open_socket_to_everyone(p)
    ev = wire_event("ADD", "cid-nobody", POD, cni_result())
    reply = send_as_uid(p.socket, 65534, event_request(ev))
    assert reply.get("ok") is False and "not allowed" in reply.get("error", ""), reply
    assert p.metric("netclaim_peers_refused_total") == 1
    assert journal_events(p) == []
    # The same peer is accepted by a publisher configured to allow its uid.
    allowed = offline(["--allowed-uid", "65534"], sub="allowed")
    open_socket_to_everyone(allowed)
    reply = send_as_uid(allowed.socket, 65534, event_request(ev))
    assert reply == {"ok": True, "id": ev.event_id}
    assert [e[0] for e in journal_events(allowed)] == [ev.event_id]


def test_garbage_and_oversized_frames_do_not_stop_the_server(offline):
    p = offline()
    bad_frames = [
        struct.pack("!I", 5) + b"hello",                     # not JSON
        struct.pack("!I", 4) + b"[12]",                      # JSON, not an object
        struct.pack("!I", 64 << 20),                         # header announcing 64 MiB
        encode_frame({"kind": "launch-missiles"}),           # unknown request
        encode_frame({"kind": "event", "event": {"op": "ADD"}}),  # malformed event
    ]
    for frame in bad_frames:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(p.socket)
            sock.sendall(frame)
            reply = read_frame(sock)
            assert reply["ok"] is False and reply["error"], reply
            assert sock.recv(1) == b""  # the server closed this connection
    ev = wire_event("ADD", "cid-after-garbage", POD, cni_result())
    assert request(p.socket, event_request(ev)) == {"ok": True, "id": ev.event_id}
    assert p.proc.poll() is None
    assert p.metric("netclaim_events_rejected_total") == len(bad_frames)


def test_ack_means_committed_even_if_killed_right_after(offline):
    p = offline()
    events = [wire_event("ADD", f"cid-{i}", POD, cni_result()) for i in range(20)]
    for ev in events:
        assert request(p.socket, event_request(ev))["ok"] is True
    p.kill()  # SIGKILL straight after the last ack
    assert [e[0] for e in journal_events(p)] == [ev.event_id for ev in events]


def test_duplicate_event_ids_are_journaled_once(offline):
    p = offline()
    ev = wire_event("ADD", "cid-dup", POD, cni_result())
    write_spool(p.spool, ev)  # spooled AND delivered (an ack lost after the commit)
    for _ in range(3):
        assert request(p.socket, event_request(ev)) == {"ok": True, "id": ev.event_id}
    status = p.status()
    assert status["journal_depth"] == 1


def test_add_without_pod_identity_is_decided_counted_and_not_journaled(offline):
    """Acked (so the plugin does not spool it), never journaled, counted, shown by status."""
    p = offline()
    ev = wire_event("ADD", "cid-nopod", None, cni_result())
    reply = request(p.socket, event_request(ev))
    assert reply == {"ok": True, "id": ev.event_id}
    assert p.metric('netclaim_events_rejected_total{reason="no_pod_identity"}') == 1
    assert journal_events(p) == []
    last = p.status()["last_error"]
    assert last["containerID"] == "cid-nopod" and "pod identity" in last["error"]


def test_spool_is_ingested_at_start_and_files_removed_after_commit(offline):
    p = offline(start=False)
    events = [wire_event("ADD", f"cid-sp{i}", POD, cni_result()) for i in range(5)]
    for ev in events:
        write_spool(p.spool, ev)
    broken = os.path.join(p.spool, "00000000000000000001-broken.event.json")
    with open(broken, "w") as fh:
        fh.write("{not json")
    p.start()
    assert [e[0] for e in journal_events(p)] == [ev.event_id for ev in events]
    assert sorted(os.listdir(p.spool)) == [os.path.basename(broken) + ".bad"]
    assert p.metric("netclaim_events_spooled_total") == 5
    lines = [e for e in p.log_events() if e.get("msg") == "spool file unreadable, renamed to .bad"]
    assert len(lines) == 1


def test_status_command_reports_journal_depth_and_last_error(offline):
    import subprocess

    from publisher_testkit import BIN

    p = offline()
    ev = wire_event("ADD", "cid-status", POD, cni_result())
    request(p.socket, event_request(ev))
    out = subprocess.run([str(BIN / "netclaim-publisher"), "status", "--socket", p.socket, "-o", "json"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert st["journal_depth"] == 1
    assert st["oldest_pending"]["containerID"] == "cid-status"
    text = subprocess.run([str(BIN / "netclaim-publisher"), "status", "--socket", p.socket],
                          capture_output=True, text=True, timeout=30)
    assert "journal depth:   1" in text.stdout


def test_help_explains_every_option():
    import subprocess

    from publisher_testkit import BIN

    out = subprocess.run([str(BIN / "netclaim-publisher"), "run", "--help"], capture_output=True, text=True)
    for opt in ("--node-name", "--kubeconfig", "--socket", "--state-dir", "--spool-dir", "--metrics-address",
                "--log-format", "NETCLAIM_NODE_NAME", "NETCLAIM_KUBECONFIG"):
        assert opt in out.stdout
