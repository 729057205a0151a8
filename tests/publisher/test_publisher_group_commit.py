"""The ack waits for the disk; the status does not (issue 16, IO pressure).

The publisher acks an event only once its journal commit is on disk, but the
worker resolves and applies while that fsync is in flight, and concurrent acks
share one fsync. The disk is the one part faked here, and only its timing and
failures: a sitecustomize in the publisher process wraps os.fsync of the
journal's WAL so that it blocks while a file exists (a disk under someone
else's writeback) or fails with EIO while another exists. Everything else is
real: the publisher subprocess, the API server, the netclaim binary.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cni_plugin.wire import PodRef, event_request
from publisher_testkit import Plugin, add, cni_result, request, wait_until, wire_event

pytestmark = pytest.mark.controlplane

SLOW_DISK = """
import errno
import os
import time

_fsync = os.fsync
_HOLD, _FAIL, _COUNT = {hold!r}, {fail!r}, {count!r}


def _is_wal(fd):
    try:
        return os.readlink(f"/proc/self/fd/{{fd}}").endswith("journal.db-wal")
    except OSError:
        return False


def fsync(fd):
    if _is_wal(fd):
        while os.path.exists(_HOLD):
            time.sleep(0.01)
        if os.path.exists(_FAIL):
            raise OSError(errno.EIO, "injected EIO")
        with open(_COUNT, "a") as fh:
            fh.write("x")
    return _fsync(fd)


os.fsync = fsync
"""


@pytest.fixture()
def slow_disk(publisher_factory, workdir, monkeypatch):
    site = workdir / "site"
    site.mkdir()
    disk = {"hold": workdir / "hold-fsync", "fail": workdir / "fail-fsync", "count": workdir / "fsyncs"}
    (site / "sitecustomize.py").write_text(SLOW_DISK.format(**{k: str(v) for k, v in disk.items()}))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    pub = publisher_factory(extra=["--spool-interval", "0.3"])
    return pub, disk


def fsyncs(disk: dict[str, Path]) -> int:
    return len(disk["count"].read_text()) if disk["count"].exists() else 0


def test_status_is_visible_while_the_ack_still_waits_for_the_disk(cluster, slow_disk):
    pub, disk = slow_disk
    claim, uid = cluster.pod_with_claim("gc-visible", [("nic", "nic0")])
    event = wire_event("ADD", "c-gc-visible", PodRef(cluster.namespace, "gc-visible", uid), cni_result())
    disk["hold"].touch()
    answer: dict = {}
    sender = threading.Thread(target=lambda: answer.update(request(pub.socket, event_request(event), timeout=60)))
    sender.start()
    try:
        cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["networkData"]["interfaceName"] == "eth0", 30)
        assert sender.is_alive() and not answer, "acked before the commit was on disk"
    finally:
        disk["hold"].unlink()
    sender.join(30)
    assert answer.get("ok") is True


def test_concurrent_acks_share_an_fsync(cluster, slow_disk):
    pub, disk = slow_disk
    n = 20
    events = []
    for i in range(n):
        claim, uid = cluster.pod_with_claim(f"gc-share-{i}", [("nic", "nic0")])
        events.append(wire_event("ADD", f"c-gc-share-{i}", PodRef(cluster.namespace, f"gc-share-{i}", uid),
                                 cni_result()))
    wait_until("publisher idle", lambda: pub.status(brief=True)["quiescent"], 30)
    before = fsyncs(disk)
    disk["hold"].touch()  # the disk is busy: every ack that arrives now queues behind one fsync
    answers: list[dict] = []
    senders = [threading.Thread(target=lambda e=e: answers.append(request(pub.socket, event_request(e), timeout=60)))
               for e in events]
    for s in senders:
        s.start()
    # Every event is committed and applied while the disk is stalled (no ack yet)...
    for i in range(n):
        cluster.wait_devices(f"gc-share-{i}-net", lambda d: len(d) == 1, 30)
    assert not answers, "acked before the commit was on disk"
    disk["hold"].unlink()
    for s in senders:
        s.join(60)
    assert [a.get("ok") for a in answers] == [True] * n
    # ...and the 20 waiting acks ride on one fsync (two if one was already in flight).
    assert fsyncs(disk) - before <= 2, f"{fsyncs(disk) - before} fsyncs for {n} acks"


def readyz(pub) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{pub.port}/readyz", timeout=5) as r:
            return r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def test_an_fsync_failure_is_not_acked_and_the_spooled_copy_publishes_once(cluster, slow_disk, workdir):
    pub, disk = slow_disk
    plugin = Plugin(pub.socket, pub.spool, workdir)
    claim, uid = cluster.pod_with_claim("gc-eio", [("nic", "nic0")])
    disk["fail"].touch()
    try:
        add(plugin, "c-gc-eio", PodRef(cluster.namespace, "gc-eio", uid))  # the plugin spools after the error
        assert any(Path(pub.spool).iterdir()), "the event was neither acked nor spooled"
        wait_until("journal fault reported", lambda: "journal" in readyz(pub), 30)
    finally:
        disk["fail"].unlink()
    cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["data"]["containerID"] == "c-gc-eio", 60)
    wait_until("spool ingested", lambda: not any(p.suffix != ".bad" for p in Path(pub.spool).iterdir()
                                                 if p.is_file() and not p.name.startswith(".")), 30)
    db = sqlite3.connect(os.path.join(pub.state, "journal.db"))
    try:  # the copy journaled before the failed fsync and the spooled copy are one event
        assert db.execute("SELECT COUNT(*) FROM events WHERE container_id='c-gc-eio'").fetchone()[0] == 1
    finally:
        db.close()
