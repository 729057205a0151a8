"""The journal's ordering and de-duplication rules (real SQLite files in a temp dir)."""

from __future__ import annotations

from cni_plugin.wire.event import PodRef
from publisher.clock import node_seconds
from publisher.journal.store import Journal
from publisher_testkit import cni_result, wire_event

POD = PodRef("ns", "pod", "uid")


def test_events_of_one_attachment_wait_for_an_older_one_backing_off(workdir):
    j = Journal(str(workdir / "state"))
    add = wire_event("ADD", "c1", POD, cni_result())
    check = wire_event("CHECK", "c1", POD, cni_result())
    other = wire_event("ADD", "c2", POD, cni_result())
    assert j.append_many([add, check, other]) == [True, True, True]
    ready = j.ready(0, 1, node_seconds())
    assert [p.event.event_id for p in ready] == [add.event_id, other.event_id]  # CHECK waits behind its ADD
    j.reschedule(ready[0].seq, node_seconds() + 60, "pod not visible")
    ready = j.ready(0, 1, node_seconds())
    assert [p.event.event_id for p in ready] == [other.event_id]  # the CHECK still waits
    j.finish(ready[0].seq)
    assert j.depth() == 2
    # ... without making the worker spin: the CHECK is not due, only the ADD's retry is.
    assert j.next_due(0, 1) > node_seconds() + 50
    j.close()


def test_a_del_retires_the_older_pending_add_of_its_attachment(workdir):
    j = Journal(str(workdir / "state"))
    add = wire_event("ADD", "c1", POD, cni_result())
    dele = wire_event("DEL", "c1", POD)
    j.append(add)
    j.reschedule(j.ready(0, 1, node_seconds())[0].seq, node_seconds() + 60, "claim not allocated")
    j.append(dele)
    assert [p.event.op for p in j.ready(0, 1, node_seconds())] == ["DEL"]
    j.close()


def test_duplicates_are_dropped_and_state_survives_reopen(workdir):
    j = Journal(str(workdir / "state"))
    ev = wire_event("ADD", "c1", POD, cni_result())
    assert j.append(ev) is True
    assert j.append(ev) is False
    j.set_applied("ns/claim", "abc")
    j.close()
    j = Journal(str(workdir / "state"))
    assert j.depth() == 1 and j.applied_hashes() == {"ns/claim": "abc"}
    assert j.append(ev) is False
    j.close()
