"""The journal stays bounded on a node that runs for months (real journal file, no API server)."""

from __future__ import annotations

import os
import time

from cni_plugin.wire.event import new_order, PodRef
from publisher import limits
from publisher.clock import node_seconds
from publisher.journal.store import Journal
from publisher_testkit import cni_result, wire_event

POD = PodRef("ns", "pod", "uid")


def fences_of(j: Journal) -> int:
    return j.order_marks()[1]


def test_one_event_retried_for_hours_holds_back_neither_the_fence_cap_nor_older_marks(workdir):
    j = Journal(str(workdir / "state"))
    now = node_seconds()
    long_ago = now - 10 * limits.ORDER_HORIZON
    for i in range(200):  # a flood of GCs, long ago
        j.finish(None, fence=("drv", "net", new_order(), []))
    j.finish(None, tombstone=(("old", "eth0"), new_order()))
    with j._tx() as db:  # recorded long ago, as a node's clock would have it
        db.execute("UPDATE fences SET recorded=?", (long_ago,))
        db.execute("UPDATE tombstones SET recorded=?", (long_ago,))
    # One ADD that a 403 or 429 loop keeps pending for hours, received well after those marks.
    j.append(wire_event("ADD", "stuck", POD, cni_result()))
    # A DEL recorded just before the stuck ADD arrived: the ADD may be older than it, so it stays.
    j.finish(None, tombstone=(("recent", "eth0"), new_order()))
    j.prune_order_marks(now + limits.ORDER_HORIZON)  # as if the horizon has long passed
    assert fences_of(j) == 0, "fences older than the stuck event by more than the horizon must go"
    assert j.tombstone("old", "eth0") is None
    assert j.tombstone("recent", "eth0") is not None, "a mark the pending event may need was dropped"
    j.close()


def test_the_fence_cap_holds_even_while_every_fence_is_young(workdir):
    j = Journal(str(workdir / "state"))
    j.append(wire_event("ADD", "stuck", POD, cni_result()))
    for _ in range(3 * limits.MAX_FENCES):
        j.finish(None, fence=("drv", "net", new_order(), []))
    j.prune_order_marks(node_seconds() - limits.ORDER_HORIZON)
    assert fences_of(j) == limits.MAX_FENCES
    j.close()


def test_a_journal_reopened_in_a_new_boot_retires_the_earlier_boots_attachments(workdir):
    from publisher.journal.schema import Attachment

    state = str(workdir / "state")
    j = Journal(state)
    old = ["boot-before", 5 * 10**9, time.time_ns()]
    legacy = ["", 0, time.time_ns()]
    for cid, stamp in (("old", old), ("legacy", legacy), ("now", new_order())):
        j.finish(None, upsert=[Attachment(cid, "eth0", "drv", "net", "ns", cid, "u-" + cid, "ns", "claim-" + cid,
                                          "cu", "pool", "dev-" + cid, "", {"device": "dev-" + cid}, "h", 0.0,
                                          stamp=stamp, added=stamp)])
    j.finish(None, tombstone=(("gone", "eth0"), old))
    with j._tx() as db:
        db.execute("UPDATE meta SET value='boot-before' WHERE key='boot_id'")
    j.close()
    j = Journal(state)  # the first open of this boot
    assert [a.container_id for a in j.all_attachments()] == ["now"]
    assert j.retired_attachments == 2
    assert sorted(c[:2] for c in j.dirty_claims()) == [("ns", "claim-legacy"), ("ns", "claim-old")]
    assert j.order_marks() == (0, 0)
    j.close()
    j = Journal(state)  # a restart within the same boot retires nothing more
    assert j.retired_attachments == 0 and [a.container_id for a in j.all_attachments()] == ["now"]
    j.close()


def _sqlite_memory_used() -> int:
    """Bytes SQLite holds in this process (page caches included): the library the sqlite3 module loaded."""
    import ctypes
    import ctypes.util
    import _sqlite3

    lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or _sqlite3.__file__)
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return int(lib.sqlite3_memory_used())


def test_the_journals_memory_stops_growing_long_before_its_database_does(workdir):
    """A month of pod starts grows the database; the publisher's memory must not follow it."""
    j = Journal(str(workdir / "state"))

    def churn(first: int, count: int) -> None:
        for i in range(first, first + count):
            j.append(wire_event("ADD", f"c{i}", PodRef("ns", f"p{i}", f"u{i}"), cni_result()))
            for pending in j.ready(0, 1, node_seconds() + 1e9):
                j.finish(pending.seq)
        j.checkpoint()

    churn(0, 400)
    settled = _sqlite_memory_used()
    churn(400, 1600)
    grown = _sqlite_memory_used() - settled
    assert os.path.getsize(j.path) > 1 << 20, "the database did not grow past the default page cache"
    assert grown < limits.JOURNAL_PAGE_CACHE_KIB * 1024, f"SQLite's memory grew {grown >> 10} KiB with the database"
    j.close()
