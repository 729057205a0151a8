"""the publisher's side of the shared wire limits.

The plugin refuses oversized and too-deep events (tests/plugin/test_plugin_input_and_handoff_limits.py),
but the spool is a directory anyone with root can drop files into, and an older
plugin may have spooled such events. So the real publisher (a subprocess on the
real API server) must refuse them at intake, before parsing, from either
channel: the spool file is renamed `.bad` and counted, the socket frame is
refused and counted, nothing is journaled (so nothing is retried), and the
publisher stays ready with its memory bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import frame as wire_frame
from cni_plugin.wire import spool as wire_spool

sys.path.append(str(Path(__file__).resolve().parents[1] / "publisher"))
from publisher_testkit import Publisher, request, wait_until  # noqa: E402  (tests/publisher: the publisher subprocess)

pytestmark = pytest.mark.controlplane


@pytest.fixture
def publisher_at(control_plane):
    """Start real publishers on fresh work dirs, after the test has prepared their spool."""
    started: list[Publisher] = []
    roots: list[Path] = []

    def make(prepare=None) -> Publisher:
        root = Path(tempfile.mkdtemp(prefix="nc16p-"))
        roots.append(root)
        pub = Publisher(control_plane.kubeconfig, root)
        os.makedirs(pub.spool, mode=0o700)
        if prepare:
            prepare(Path(pub.spool))
        started.append(pub)
        return pub.start()

    yield make
    for pub in started:
        pub.stop()
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


def wait_for(predicate, what: str, timeout: float = 60.0):
    return wait_until(what, predicate, timeout)


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set size of a process (VmHWM in /proc/<pid>/status), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def spool_name(tag: str) -> str:
    return f"{time.time_ns():020d}-{tag}{wire_spool.SPOOL_SUFFIX}"


def event_dict(cid: str, result: object) -> dict:
    return wire_event.Event(op="ADD", container_id=cid, ifname="eth0", driver="net.example.com",
                      pod=wire_event.PodRef("team-a", "web-0", "uid-1"), result=result).to_dict()


def rejected(pub: Publisher, reason: str) -> float:
    return pub.metric(f'netclaim_events_rejected_total{{reason="{reason}"}}')


def test_huge_spool_file_is_quarantined_before_parsing(publisher_at) -> None:
    size = 66 << 20

    def plant_big(spool: Path) -> None:
        head, tail = json.dumps(event_dict("big", {"cniVersion": "1.1.0", "pad": "@PAD@"})).encode().split(b"@PAD@")
        with open(spool / spool_name("big"), "wb") as fh:  # a well-formed 66 MiB event
            fh.write(head)
            fh.write(b"A" * (size - len(head) - len(tail)))
            fh.write(tail)

    control = publisher_at()  # the same publisher with an ordinary spool: its memory is the yardstick
    wait_for(lambda: control.status(brief=True)["spool_files"] == 0, "the control publisher's spool pass")
    baseline = vm_hwm_kib(control.proc.pid)
    control.stop()

    pub = publisher_at(plant_big)
    bad = wait_for(lambda: [n for n in os.listdir(pub.spool) if n.endswith(".bad")], "the .bad rename")
    assert len(bad) == 1 and os.path.getsize(os.path.join(pub.spool, bad[0])) >= size
    assert rejected(pub, "bad_spool_file") == 1
    logged = [r for r in pub.log_events() if "renamed to .bad" in r.get("msg", "")]
    assert logged and "exceeds" in json.dumps(logged[0]), logged
    status = pub.status()
    assert status["ready"] and status["journal_depth"] == 0 and status["spool_files"] == 0, status
    peak = vm_hwm_kib(pub.proc.pid)
    # Reading the file alone would add 66 MiB; parsing it peaked at ~600 MiB.
    assert peak < baseline + (16 << 10), f"publisher peak RSS {peak} KiB vs {baseline} KiB without the file"


def test_oversized_frame_is_refused_on_the_socket(publisher_at) -> None:
    pub = publisher_at()
    big = event_dict("bigsock", {"cniVersion": "1.1.0", "pad": "A" * (300 << 10)})  # over the 256 KiB cap
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(pub.socket)
        body = json.dumps({"kind": "event", "event": big}).encode()
        try:
            sock.sendall(len(body).to_bytes(4, "big") + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused on the length: the server may hang up before reading it all
        reply = wire_frame.read_frame(sock)
    assert reply["ok"] is False and "exceeds" in reply["error"], reply
    assert rejected(pub, "bad_frame") == 1
    assert pub.status(brief=True)["journal_depth"] == 0


def _deep(depth: int) -> object:
    value: object = 1
    for i in range(depth):
        value = {"x": value} if i % 2 else [value]
    return value


def test_deep_event_is_quarantined_not_retried(publisher_at) -> None:
    def plant_deep(spool: Path) -> None:
        event = event_dict("deep", {"cniVersion": "1.1.0", "interfaces": [], "ips": [], "dns": {"x": _deep(700)}})
        (spool / spool_name("deep")).write_text(json.dumps(event))

    pub = publisher_at(plant_deep)
    wait_for(lambda: [n for n in os.listdir(pub.spool) if n.endswith(".bad")], "the .bad rename")
    assert rejected(pub, "bad_spool_file") == 1
    # The socket channel refuses the same event as a counted bad event.
    event = event_dict("deep2", {"cniVersion": "1.1.0", "interfaces": [], "ips": [], "dns": {"x": _deep(700)}})
    reply = request(pub.socket, {"kind": "event", "event": event})
    assert reply["ok"] is False and "nested more than" in reply["error"], reply
    assert rejected(pub, "bad_event") == 1
    # Nothing entered the journal, so nothing can be retried: after two more spool passes the
    # journal is still empty and no line of the log names the event again.
    first = pub.status()["last_spool_ingest"]
    wait_for(lambda: (pub.status()["last_spool_ingest"] or 0) > first, "another spool pass")
    status = pub.status()
    assert status["ready"] and status["journal_depth"] == 0 and status["oldest_pending"] is None, status
    mentions = [r for r in pub.log_events() if "deep" in json.dumps(r) and "renamed to .bad" not in json.dumps(r)
                and "malformed event" not in json.dumps(r)]
    assert mentions == [], mentions
