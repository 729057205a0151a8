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

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from publisher_testkit import suffix, wait_until

from cni_plugin.wire import new_order
from publisher import limits
from publisher.journal.schema import Attachment
from publisher.kube.calls import Kube
from publisher.live.watcher import LiveSettings
from publisher.observe.metrics import Metrics
from publisher.service import Service, Settings

pytestmark = pytest.mark.netns

CLAIM = ("ns", "claim-a")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class PodNetns:
    """A pod sandbox's netns with its interface `eth0` (a veth whose peer stays in the netns)."""

    name: str

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.name}"

    def link(self, state: str) -> None:
        ip("-n", self.name, "link", "set", "eth0", state)

    def mac(self) -> str:
        out = subprocess.run(["ip", "-n", self.name, "-j", "link", "show", "dev", "eth0"], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)[0]["address"]

    def remove(self) -> None:
        """The runtime unmounts and removes the netns; no DEL comes."""
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)


@pytest.fixture()
def pod_netns() -> Iterator[PodNetns]:
    ns = PodNetns(f"lw-{suffix()}")
    ip("netns", "add", ns.name)
    try:
        ip("-n", ns.name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
        ip("-n", ns.name, "addr", "add", "10.77.0.5/24", "dev", "eth0")
        ip("-n", ns.name, "link", "set", "peer0", "up")
        ns.link("up")
        yield ns
    finally:
        ns.remove()


@pytest.fixture()
def service(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    """The publisher's Service, not started: each test spawns the live-watch thread under its supervisor."""
    monkeypatch.setattr(limits, "JOURNAL_BUSY_TIMEOUT", 0.3)  # read when the journal opens its connection
    svc = Service(Settings(node_name="node-a", state_dir=str(workdir / "state"), spool_dir=str(workdir / "spool"),
                           workers=1, emit_events=False), Kube(api_client=None), Metrics())
    # Short holds and re-reads, so each step of a test takes a fraction of a second.
    svc.live_watch.settings = LiveSettings(hold=0.2, journal_interval=0.5, retry_unopenable=0.5)
    yield svc
    svc.stop()


def journal_attachment(svc: Service, netns: str, mac: str = "02:00:00:00:00:01", cid: str = "c" * 64,
                       claim: tuple[str, str] = CLAIM) -> str:
    """An attachment as a worker journals it after the ADD, published (its claim clean)."""
    entry = {"driver": "net.example.com", "pool": "p", "device": "nic0",
             "networkData": {"interfaceName": "eth0", "ips": ["10.77.0.5/24"], "hardwareAddress": mac},
             "conditions": [{"type": "Ready", "status": "True", "reason": "NetworkConfigured", "message": "",
                             "lastTransitionTime": "2026-12-05T00:00:00Z"}]}
    stamp = new_order()
    svc.journal.finish(None, upsert=[Attachment(
        container_id=cid, ifname="eth0", driver="net.example.com", network="podnet", pod_namespace=claim[0],
        pod_name="pod-" + cid[:6], pod_uid="uid-" + cid[:6], claim_namespace=claim[0], claim_name=claim[1],
        claim_uid="cuid", pool="p", device="nic0", share_id="", entry=entry, result_hash="h", event_ts=time.time(),
        stamp=stamp, added=stamp, netns=netns)])
    svc.journal.clean(*claim)
    svc.live_watch.attachments_changed()  # what the worker does once the event is committed
    return cid


def live_state(svc: Service, cid: str = "c" * 64) -> str | None:
    """The interface state the journal holds for the attachment (None: no such attachment)."""
    rows = svc.journal._read("SELECT live FROM attachments WHERE container_id=?", (cid,))
    if not rows:
        return None
    live: dict[str, Any] = json.loads(rows[0][0]) if rows[0][0] else {}
    return live.get("state", "Ready")


def dirty(svc: Service, claim: tuple[str, str] = CLAIM) -> bool:
    return any((ns, name) == claim for ns, name, _ in svc.journal.dirty_claims())


def start_watch(svc: Service) -> None:
    svc._spawn("live-watch", svc.live_watch.run)
    wait_until("the watch to follow the attachment", lambda: svc.live_watch.state()["namespaces"] == 1
               and svc.live_watch.busy() == 0, timeout=30)


def interface_written(svc: Service, state: str) -> bool:
    """The journal holds `state` and the claim is marked for its reconcile (the apply follows)."""
    return live_state(svc) == state and dirty(svc)


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
