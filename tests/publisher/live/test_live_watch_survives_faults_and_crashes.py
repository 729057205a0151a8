"""The live-interface watch keeps following every attachment through journal faults and its own crashes.

Real parts: the publisher's `Service` with its real `Journal` on disk and its supervisor, running
only the live-watch thread (no API server is needed for it: nothing here publishes); a real netns
with a veth `eth0`, changed the way an operator or the node changes it (`ip -n ... link set`).
The journal fault is real too: a second SQLite connection holds the journal's write lock
(`BEGIN IMMEDIATE`), as a backup tool or a `sqlite3` shell left in a transaction does. SQLite's
busy timeout is shortened so that the fault costs a fraction of a second instead of five.

What an operator would see without these guarantees: after one journal fault or one crash of
the thread, a pod's link going down keeps showing `Ready=True`, and a sandbox removed without a
DEL keeps its entry for good.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest
from livewatch_kit import (
    CLAIM,
    PodNetns,
    dirty,
    interface_written,
    ip,
    journal_attachment,
    live_state,
    pod_netns,
    service,
    start_watch,
)
from publisher_testkit import suffix, wait_until

from publisher.service import Service

pytestmark = pytest.mark.netns

__all__ = ["pod_netns", "service"]  # fixtures, used by name


def test_a_link_change_during_a_journal_fault_lands_when_the_journal_is_back(service: Service,
                                                                             pod_netns: PodNetns) -> None:
    journal_attachment(service, pod_netns.path, pod_netns.mac())
    start_watch(service)

    holder = sqlite3.connect(service.journal.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process holds the journal's write lock
        pod_netns.link("down")
        wait_until("the watch's write to fail on the held lock", lambda: service.journal.writes.failing_since,
                   timeout=30)
    finally:
        holder.rollback()
        holder.close()

    # The change made during the fault lands, with no further change in the netns.
    wait_until("LinkDown written after the lock was released", lambda: interface_written(service, "LinkDown"),
               timeout=30)
    assert service.metrics.live_journal_errors.labels("write")._value.get() >= 1
    assert "live-watch" not in service.health.crashes, "the fault was caught inside the loop"

    # And the watch goes on: a recovery and a later link-down are written too.
    service.journal.clean(*CLAIM)
    pod_netns.link("up")
    wait_until("Ready written", lambda: interface_written(service, "Ready"), timeout=30)
    service.journal.clean(*CLAIM)
    pod_netns.link("down")
    wait_until("a later LinkDown written", lambda: interface_written(service, "LinkDown"), timeout=30)
    assert service.live_watch.state()["journal_errors"] == {}


def test_after_a_crash_the_restarted_watch_follows_every_interface_again(service: Service,
                                                                         pod_netns: PodNetns) -> None:
    # Once journal errors are caught inside the loop, what is left to crash the thread is a bug;
    # one is injected where the watch tells housekeeping about a write, and it strikes once.
    told = service.live_watch.on_change
    calls: list[float] = []

    def on_change_with_a_bug_once() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("a bug in what the watch calls after a write")
        told()

    service.live_watch.on_change = on_change_with_a_bug_once
    journal_attachment(service, pod_netns.path, pod_netns.mac())
    start_watch(service)

    pod_netns.link("down")
    wait_until("the thread to crash and be restarted by the supervisor",
               lambda: len(service.health.crashes.get("live-watch", [])) == 1 and "live-watch" not in service.down,
               timeout=30)
    assert interface_written(service, "LinkDown")  # written before the bug struck

    # The restarted thread follows the attachment it followed before the crash.
    service.journal.clean(*CLAIM)
    pod_netns.link("up")
    wait_until("Ready written after the restart", lambda: interface_written(service, "Ready"), timeout=30)
    service.journal.clean(*CLAIM)
    pod_netns.link("down")
    wait_until("LinkDown written after the restart", lambda: interface_written(service, "LinkDown"), timeout=30)

    # And a sandbox removed without a DEL is retired: its netns freed, its entry gone.
    service.journal.clean(*CLAIM)
    pod_netns.remove()
    wait_until("the attachment retired", lambda: live_state(service) is None and dirty(service), timeout=30)
    assert service.metrics.live_vanished._value.get() == 1
    assert service.live_watch.state()["namespaces"] == 0
    assert len(service.health.crashes["live-watch"]) == 1


def test_an_attachment_whose_netns_is_already_gone_is_retired_not_retried_forever(service: Service,
                                                                                  workdir: Path,
                                                                                  pod_netns: PodNetns) -> None:
    # The sandbox died while the publisher was down, and its DEL was lost: its netns path is gone,
    # in the directory where the publisher sees a live pod's netns.
    gone = PodNetns(f"lw-{suffix()}")
    ip("netns", "add", gone.name)
    gone.remove()
    assert not os.path.exists(gone.path) and os.path.isdir(os.path.dirname(gone.path))
    # Paths that cannot be opened for other reasons prove nothing: those entries stay as the ADD said.
    not_a_netns = workdir / "not-a-netns"
    not_a_netns.write_text("")
    unmounted_dir = str(workdir / "netns-dir-not-mounted" / "cni-1")
    # An empty directory where the runtime's should be mounted (the image's own) holds no netns the
    # watch ever opened: a missing path there is a mount to fix, not a sandbox gone.
    (workdir / "netns-dir-of-the-image").mkdir()
    image_dir = str(workdir / "netns-dir-of-the-image" / "cni-2")

    retired = journal_attachment(service, gone.path, cid="a" * 64, claim=("ns", "gone"))
    kept = [journal_attachment(service, str(not_a_netns), cid="b" * 64, claim=("ns", "file")),
            journal_attachment(service, unmounted_dir, cid="d" * 64, claim=("ns", "unmounted")),
            journal_attachment(service, image_dir, cid="e" * 64, claim=("ns", "image-dir"))]
    journal_attachment(service, pod_netns.path, mac=pod_netns.mac(), cid="f" * 64, claim=("ns", "live"))
    service._spawn("live-watch", service.live_watch.run)

    wait_until("the attachment of the gone netns retired", lambda: live_state(service, retired) is None, timeout=30)
    wait_until("the watch's pass over the journal to end", lambda: service.live_watch.busy() == 0, timeout=30)
    assert dirty(service, ("ns", "gone"))  # its reconcile removes the entry from the claim
    assert service.metrics.live_vanished._value.get() == 1
    assert [live_state(service, cid) for cid in kept] == ["Ready", "Ready", "Ready"]
    assert not any(dirty(service, ("ns", claim)) for claim in ("file", "unmounted", "image-dir"))
