"""The boot order at the unit level (publisher/journal/order.py) on a real journal file.

Stamps of different boots are ranked by the sequence in which the journal first saw
the boots, the current boot above all others, whatever the wall clocks say.
"""

from __future__ import annotations

import time

from cni_plugin.wire.event import legacy_order, new_order, PodRef
from publisher.journal.store import Journal
from publisher.journal.order import BootOrder, current_boot_id
from publisher_testkit import cni_result, wire_event

POD = PodRef("ns", "pod", "uid")
HOUR_NS = 3600 * 10**9


def test_current_boot_outranks_an_older_boot_whose_wall_clock_is_ahead(workdir):
    state = str(workdir / "state")
    j = Journal(state)
    BootOrder(j, "boot-1")  # the publisher ran in boot-1 ...
    j.close()
    j = Journal(state)
    order = BootOrder(j, "boot-2")  # ... then the node rebooted with its clock behind
    old = ["boot-1", 9_000 * 10**9, time.time_ns() + HOUR_NS]
    new = ["boot-2", 5 * 10**9, time.time_ns()]
    assert order.before(old, new) and not order.before(new, old)
    # a boot first seen now (the publisher never ran in it) still ranks below the current one
    unseen = ["boot-0", 1, time.time_ns() + 2 * HOUR_NS]
    assert order.before(unseen, new) and order.before(old, unseen)
    # legacy stamps (no boot) rank below every real boot, by wall clock among themselves
    assert order.before(legacy_order(time.time() + 7200), old)
    assert order.before(legacy_order(1.0), legacy_order(2.0))
    # the same boot orders by CLOCK_BOOTTIME even when its wall clock stepped back
    assert order.before(["boot-2", 1, 2_000], ["boot-2", 2, 1_000])
    j.close()
    j = Journal(state)  # the ranking is the journal's: it survives a restart in the same boot
    again = BootOrder(j, "boot-2")
    assert again.before(old, unseen) and again.before(unseen, new)
    j.close()


def test_a_del_retires_a_pending_add_of_an_older_boot_at_intake(workdir):
    j = Journal(str(workdir / "state"))
    assert j.ordering().boot_id == current_boot_id()
    add = wire_event("ADD", "c1", POD, cni_result(), order=["gone-boot", 10**12, time.time_ns() + HOUR_NS])
    dele = wire_event("DEL", "c1", POD, order=new_order())
    j.append(add)
    j.append(dele)  # a foreign boot first seen inside the intake transaction
    pending = j.ready(0, 1, 1e18)
    assert [p.event.op for p in pending] == ["DEL"], "the older boot's ADD must be superseded"
    assert j.ordering().before(add.order, dele.order)
    j.close()
