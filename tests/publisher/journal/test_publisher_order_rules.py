"""The ordering rules on a real journal file: stamps, tombstones, GC fences, bounds."""

from __future__ import annotations

from cni_plugin.wire.event import Event, legacy_order, new_order, PodRef
from publisher.clock import node_seconds
from publisher.journal.store import Attachment, Journal
from publisher.journal.order import BootOrder
from publisher.reconcile.rules import gc_victims, stale_reason
from publisher_testkit import cni_result, wire_event

POD = PodRef("ns", "pod", "uid")


def att(cid: str, stamp: list, network: str = "testnet") -> Attachment:
    return Attachment(container_id=cid, ifname="eth0", driver="net.example.com", network=network,
                      pod_namespace="ns", pod_name="pod", pod_uid="uid", claim_namespace="ns", claim_name="c",
                      claim_uid="cu", pool="p", device="d", share_id="", entry={}, result_hash="h",
                      event_ts=0.0, stamp=stamp)


def test_same_boot_orders_by_boottime_even_when_the_wall_clock_steps_back(workdir):
    order = BootOrder(Journal(str(workdir / "state")), "boot-1")
    a = ["boot-1", 100, 2_000]
    b = ["boot-1", 200, 1_000]  # the wall clock was stepped back between a and b
    assert order.before(a, b) and not order.before(b, a)


def test_an_earlier_boot_ranks_below_the_current_one_whatever_the_wall_clocks(workdir):
    order = BootOrder(Journal(str(workdir / "state")), "boot-2")
    before_reboot = ["boot-1", 9_000_000, 3_000]  # its wall clock was ahead
    after_reboot = ["boot-2", 5, 2_000]  # CLOCK_BOOTTIME restarted
    assert order.before(before_reboot, after_reboot)


def test_stamp_is_the_same_on_both_channels_and_old_events_still_load(workdir):
    ev = wire_event("ADD", "c1", POD, cni_result())
    assert Event.from_dict(ev.to_dict()).order == ev.order  # socket frame and spool file hold to_dict()
    old = ev.to_dict()
    del old["order"]  # written by a plugin before stamps existed
    assert Event.from_dict(old).order == legacy_order(ev.timestamp)
    assert BootOrder(Journal(str(workdir / "state"))).before(Event.from_dict(old).order, new_order())


def test_tombstone_beats_every_older_add_and_gc_fence_every_older_unlisted_add(workdir):
    j = Journal(str(workdir / "state"))
    add = wire_event("ADD", "c1", POD, cni_result())
    dele = wire_event("DEL", "c1", POD)
    j.finish(None, tombstone=(dele.attachment, dele.order))
    assert stale_reason(j, j.ordering(), add, None) == "a later DEL removed this attachment"
    readd = wire_event("ADD", "c1", POD, cni_result())  # the same attachment added again afterwards
    assert stale_reason(j, j.ordering(), readd, None) == ""
    early = wire_event("ADD", "c2", POD, cni_result())
    listed = wire_event("ADD", "c3", POD, cni_result())
    gc = wire_event("GC", "*", None, ifname="*", valid_attachments=[{"containerID": "c3", "ifname": "eth0"}])
    late = wire_event("ADD", "c4", POD, cni_result())
    j.finish(None, fence=(gc.driver, gc.network, gc.order, gc.valid_attachments))
    assert stale_reason(j, j.ordering(), early, None) == "a later GC did not list this attachment"
    assert stale_reason(j, j.ordering(), listed, None) == "" and stale_reason(j, j.ordering(), late, None) == ""
    victims = gc_victims([att("c2", early.order), att("c3", listed.order), att("c4", late.order),
                          att("c5", early.order, network="other")], gc, j.ordering())
    assert [a.container_id for a in victims] == ["c2"]
    j.close()


def test_marks_are_kept_while_something_older_can_arrive(workdir):
    j = Journal(str(workdir / "state"))
    dele = wire_event("DEL", "c1", POD)
    j.finish(None, tombstone=(dele.attachment, dele.order))
    j.append(wire_event("ADD", "c9", POD, cni_result()))  # still pending
    assert j.prune_order_marks(node_seconds() + 1) == 0 and j.order_marks() == (1, 0)
    [p] = j.ready(0, 1, node_seconds())
    j.finish(p.seq)
    assert j.prune_order_marks(node_seconds() - 3600) == 0  # recorded after the cutoff: kept
    assert j.prune_order_marks(node_seconds() + 1) == 1 and j.order_marks() == (0, 0)
    j.close()
