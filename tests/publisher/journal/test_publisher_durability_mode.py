"""Where an ack may skip the fsync, and where it must not (publisher/journal/durability.py)."""

from __future__ import annotations

import time

from publisher.journal.durability import durable_commits, filesystem_type
from publisher.journal.store import Journal
from publisher.repair.unchained import started_before_this_boot

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /var/lib/netclaim rw,relatime shared:9 - nfs4 server:/export rw
31 22 0:41 / /var/lib/fused rw - fuse.sshfs host:/x rw
32 22 0:42 / /var/lib/with\\040space rw - tmpfs tmpfs rw
"""


def test_a_state_dir_on_a_network_or_fuse_filesystem_fsyncs_every_commit():
    assert durable_commits("auto", "/var/lib/netclaim/state", MOUNTINFO)[0] is True
    assert durable_commits("auto", "/var/lib/fused/j", MOUNTINFO)[0] is True
    assert durable_commits("auto", "/var/lib/other", MOUNTINFO)[0] is False
    assert filesystem_type("/var/lib/with space/j", MOUNTINFO) == "tmpfs"
    assert durable_commits("always", "/var/lib/other", MOUNTINFO)[0] is True
    assert durable_commits("never", "/var/lib/netclaim", MOUNTINFO)[0] is False


def test_durable_commits_make_sqlite_sync_each_commit(workdir):
    j = Journal(str(workdir / "a"), durable_commits=True)
    assert j._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    j.close()
    j = Journal(str(workdir / "b"))
    assert j._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: a commit survives a process crash
    j.close()


def test_a_pod_shown_running_with_containers_of_an_earlier_boot_is_not_judged_unchained():
    boot_began = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)

    def pod(started: float) -> dict:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        return {"status": {"phase": "Running", "containerStatuses": [{"state": {"running": {"startedAt": stamp}}}]}}

    assert started_before_this_boot(pod(boot_began - 120))
    assert not started_before_this_boot(pod(time.time()))
    assert not started_before_this_boot({"status": {"phase": "Running"}})
