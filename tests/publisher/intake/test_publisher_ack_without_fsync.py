"""A pod start waits for no disk: the ack follows the journal commit, not an fsync.

Real nodes are under IO pressure exactly when pods start (image pulls, container
root filesystems). The disk is the one part faked here, and only its timing: a
sitecustomize in the publisher process makes any os.fsync of the journal's WAL
block while a file exists (a disk under someone else's writeback) and counts
the calls. Everything else is real: the publisher subprocess, the API server.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from publisher_testkit import cni_result, request, wait_until, wire_event

pytestmark = pytest.mark.controlplane

SLOW_DISK = """
import os
import time

_fsync = os.fsync
_HOLD, _COUNT = {hold!r}, {count!r}


def _is_wal(fd):
    try:
        return os.readlink(f"/proc/self/fd/{{fd}}").endswith("journal.db-wal")
    except OSError:
        return False


def fsync(fd):
    if _is_wal(fd):
        while os.path.exists(_HOLD):
            time.sleep(0.01)
        with open(_COUNT, "a") as fh:
            fh.write("x")
    return _fsync(fd)


os.fsync = fsync
"""


@pytest.fixture()
def slow_disk(publisher_factory, workdir, monkeypatch):
    site = workdir / "site"
    site.mkdir()
    disk = {"hold": workdir / "hold-fsync", "count": workdir / "fsyncs"}
    (site / "sitecustomize.py").write_text(SLOW_DISK.format(**{k: str(v) for k, v in disk.items()}))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    pub = publisher_factory(extra=["--spool-interval", "0.3"])
    return pub, disk


def fsyncs(disk: dict[str, Path]) -> int:
    return len(disk["count"].read_text()) if disk["count"].exists() else 0


def test_adds_are_acked_and_published_while_the_disk_is_stalled(cluster, slow_disk):
    pub, disk = slow_disk
    n = 20
    events = []
    for i in range(n):
        claim, uid = cluster.pod_with_claim(f"stall-{i}", [("nic", "nic0")])
        events.append(wire_event("ADD", f"c-stall-{i}", PodRef(cluster.namespace, f"stall-{i}", uid), cni_result()))
    wait_until("publisher idle", lambda: pub.status(brief=True)["quiescent"], 30)
    disk["hold"].touch()  # the disk is busy with someone else's writeback for as long as this file exists
    try:
        answers: list[dict] = []
        senders = [threading.Thread(target=lambda e=e: answers.append(request(pub.socket, event_request(e),
                                                                              timeout=60))) for e in events]
        for s in senders:
            s.start()
        for s in senders:
            s.join(60)
        # Every ADD was acked while the disk was stalled: no pod start waited for it.
        assert [a.get("ok") for a in answers] == [True] * n
        for i in range(n):
            cluster.wait_devices(f"stall-{i}-net", lambda d: len(d) == 1, 30)
        assert fsyncs(disk) == 0, "the ADD path fsynced the journal"
        assert pub.status(brief=True)["spool_files"] == 0, "an event was spooled instead of acked"
    finally:
        disk["hold"].unlink()
