"""Across a reboot: the previous boot's sandboxes are gone, and so must their entries be.

The real publisher process and the real API server. A "boot" is what the
publisher and the plugin can tell of it, the kernel's boot id: the earlier
boot's publisher runs in a private mount namespace whose boot id file names
another boot (publisher_testkit.in_boot); the events it handled carry that
boot's stamps. The publisher of the next boot is started on the same state
and spool directories, as a node's publisher is after a reboot.

The OS crash of an unsynced page cache is simulated by putting back copies
of the journal and spool taken at an earlier moment: what a crash may leave
when nothing on the ADD path waits for an fsync.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from cni_plugin.wire.spool import write_spool
from publisher_testkit import (DRIVER, Cluster, cni_result, drained, in_boot, request, suffix, wait_until,
                               wire_event)

pytestmark = pytest.mark.controlplane


def stamp(boot: str, seconds: float) -> list:
    """An order stamp of `boot`, `seconds` after that boot began."""
    return [boot, int(seconds * 1e9), time.time_ns()]


def send(publisher, op: str, cid: str, pod: PodRef, boot: str, at: float, **kw) -> None:
    ev = wire_event(op, cid, pod, cni_result(**kw) if op == "ADD" else None, order=stamp(boot, at))
    reply = request(publisher.socket, event_request(ev))
    assert reply.get("ok"), reply


def ips(cluster: Cluster, claim: str) -> list[list[str]]:
    return [d["networkData"]["ips"] for d in cluster.devices(claim) if d["driver"] == DRIVER]


def current_boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def earlier_boot_publisher(publisher_factory, workdir: Path, boot: str):
    pub = publisher_factory(start=False, sub="node")
    pub.prefix = in_boot(workdir, boot)
    return pub.start()


def test_after_a_reboot_the_dead_sandboxes_entries_leave_their_claims(cluster: Cluster, publisher_factory, workdir):
    old_boot = str(uuid.uuid4())
    claim_a, uid_a = cluster.pod_with_claim("a", [("nic", "nic0")])
    claim_b, uid_b = cluster.pod_with_claim("b", [("nic", "nic1")])
    pod_a, pod_b = PodRef(cluster.namespace, "a", uid_a), PodRef(cluster.namespace, "b", uid_b)
    before = earlier_boot_publisher(publisher_factory, workdir, old_boot)
    send(before, "ADD", "ca" + suffix(), pod_a, old_boot, 5, ipv4="10.77.0.5/24", ipv6=None)
    send(before, "ADD", "cb" + suffix(), pod_b, old_boot, 6, ipv4="10.77.0.6/24", ipv6=None)
    wait_until("both claims published in the earlier boot",
               lambda: ips(cluster, claim_a) == [["10.77.0.5/24"]] and ips(cluster, claim_b) == [["10.77.0.6/24"]])
    before.kill()  # the node goes down with it

    after = publisher_factory(start=False, sub="node")
    after.start()
    # The pods still exist with their UIDs, but their sandboxes died with the boot: nothing of
    # them may stay shown as Ready, even though no DEL and no new ADD came.
    wait_until("the earlier boot's entries removed", lambda: not ips(cluster, claim_a) and not ips(cluster, claim_b))
    st = drained(after)
    assert st["attachments"] == 0 and st["dirty_claims"] == 0, st
    assert after.metric("netclaim_boot_retired_attachments_total") == 2

    # An ADD of the earlier boot that arrives late (a spool file written just before the crash)
    # changes nothing; it is counted as ignored, not failed.
    write_spool(after.spool, wire_event("ADD", "late" + suffix(), pod_a, cni_result(ipv4="10.77.0.9/24", ipv6=None),
                                        order=stamp(old_boot, 7)))
    wait_until("the late ADD ignored", lambda: after.metric('netclaim_events_ignored_total{reason="earlier_boot"}') == 1)
    drained(after)
    assert not ips(cluster, claim_a)

    # The pod's sandbox of this boot publishes as usual.
    send(after, "ADD", "cn" + suffix(), pod_a, current_boot(), time.clock_gettime(time.CLOCK_BOOTTIME),
         ipv4="10.77.0.7/24", ipv6=None)
    wait_until("the new sandbox shown", lambda: ips(cluster, claim_a) == [["10.77.0.7/24"]])


def test_an_os_crash_that_loses_the_last_commits_and_spool_files_converges_to_the_new_boot(
        cluster: Cluster, publisher_factory, workdir):
    old_boot = str(uuid.uuid4())
    pods = {}
    for name, device in (("p1", "nic0"), ("p2", "nic1"), ("p3", "nic2")):
        claim, uid = cluster.pod_with_claim(name, [("nic", device)])
        pods[name] = (claim, PodRef(cluster.namespace, name, uid))
    before = earlier_boot_publisher(publisher_factory, workdir, old_boot)
    send(before, "ADD", "s1" + suffix(), pods["p1"][1], old_boot, 5, ipv4="10.77.0.11/24", ipv6=None)
    wait_until("p1 published", lambda: ips(cluster, pods["p1"][0]) == [["10.77.0.11/24"]])
    drained(before)
    # What the disk holds at this moment is all an unsynced page cache may leave behind.
    disk = workdir / "disk-at-crash"
    (disk / "state").mkdir(parents=True)
    with sqlite3.connect(Path(before.state) / "journal.db") as src, \
            sqlite3.connect(disk / "state" / "journal.db") as dst:
        src.backup(dst)  # a consistent copy, as SQLite's recovery would find it
    Path(before.spool).mkdir(exist_ok=True)
    shutil.copytree(Path(before.spool), disk / "spool")
    # After that moment: p2's sandbox ADDed and published, p1's sandbox replaced by a newer one.
    send(before, "ADD", "s2" + suffix(), pods["p2"][1], old_boot, 8, ipv4="10.77.0.12/24", ipv6=None)
    send(before, "ADD", "s1b" + suffix(), pods["p1"][1], old_boot, 9, ipv4="10.77.0.13/24", ipv6=None)
    wait_until("the later commits applied", lambda: ips(cluster, pods["p2"][0]) == [["10.77.0.12/24"]]
               and ips(cluster, pods["p1"][0]) == [["10.77.0.13/24"]])
    before.kill()
    for part in ("state", "spool"):  # the crash: the later commits never reached the disk
        shutil.rmtree(Path(getattr(before, part)))
        shutil.copytree(disk / part, Path(getattr(before, part)))
    # A spool file torn by the crash (written just before it, half on disk).
    boot_began = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    torn = Path(before.spool) / f"{int((boot_began - 10) * 1e9):020d}-torn.event.json"
    torn.write_bytes(b'{"version": 1, "op": "ADD", "contai')
    os.utime(torn, (boot_began - 10, boot_began - 10))

    after = publisher_factory(start=False, sub="node")
    after.start()
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    # The kubelet's new sandboxes of this boot: p1 and p2 come back, p3 never ran.
    send(after, "ADD", "n1" + suffix(), pods["p1"][1], current_boot(), now, ipv4="10.77.0.21/24", ipv6=None)
    send(after, "ADD", "n2" + suffix(), pods["p2"][1], current_boot(), now + 0.001, ipv4="10.77.0.22/24", ipv6=None)
    live = {"p1": [["10.77.0.21/24"]], "p2": [["10.77.0.22/24"]], "p3": []}
    wait_until("every claim shows its live sandbox and nothing of the dead boot",
               lambda: all(ips(cluster, pods[n][0]) == want for n, want in live.items()), timeout=30)
    st = drained(after)
    assert st["dirty_claims"] == 0 and st["attachments"] == 2, st
    assert not torn.exists(), "a torn spool file of before this boot must be dropped"
