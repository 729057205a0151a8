"""The live-interface watch (publisher.live.watcher.LiveWatch) on its own.

The other live tests run it inside the publisher's Service or the whole publisher; here it is
built alone over a real publisher.journal.store.Journal on disk, with a real pod netns (a veth
`eth0`, tests/publisher/livewatch_kit.py) and its on_change callable recording each call. What it
is given to do: record a link change into the attachment's live state and mark the claim (then
wake its caller), follow a committed attachment when told (attachments_changed), and retire an
attachment whose netns path was removed without a DEL, keeping no socket in that netns.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from livewatch_kit import PodNetns, ip, made_pod_netns
from publisher_testkit import suffix, wait_until

from cni_plugin.wire.event import new_order
from publisher.journal.schema import Attachment
from publisher.journal.store import Journal
from publisher.live.watcher import LiveSettings, LiveWatch
from publisher.observe.metrics import Metrics

pytestmark = [pytest.mark.netns]

CID = "c" * 64
CLAIM = ("ns", "claim-a")


@dataclass
class Watch:
    """A LiveWatch running on its own thread, with the journal it follows and its wake-ups."""

    journal: Journal
    metrics: Metrics
    live: LiveWatch
    stopping: threading.Event
    woken: list[float] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.live.run, name="live-watch", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(30)
            assert not self.thread.is_alive(), "the watch did not end when asked to stop"

    def follows(self, namespaces: int) -> bool:
        state = self.live.state()
        return state["namespaces"] == namespaces and state["attachments"] == namespaces and self.live.busy() == 0

    def live_state(self, cid: str = CID) -> str | None:
        """The interface state the journal holds for the attachment (None: no such attachment)."""
        att = self.journal.attachment(cid, "eth0")
        if att is None:
            return None
        live: dict[str, Any] = att.live if isinstance(att.live, dict) else json.loads(att.live or "{}")
        return live.get("state", "Ready")

    def dirty(self, claim: tuple[str, str] = CLAIM) -> bool:
        return any((ns, name) == claim for ns, name, _ in self.journal.dirty_claims())

    def changes(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("netclaim_interface_changes_total", {"reason": reason}) or 0.0


@dataclass
class Woken:
    """What the watch wakes once a change is journaled (housekeeping's wake): records each call."""

    calls: list[float] = field(default_factory=list)

    def set(self) -> None:
        self.calls.append(time.monotonic())


@pytest.fixture()
def watch(workdir: Path) -> Iterator[Watch]:
    journal = Journal(state_dir=str(workdir / "state"))
    metrics = Metrics()
    stopping = threading.Event()
    woken = Woken()
    live = LiveWatch(journal=journal, metrics=metrics, changed=woken, stopping=stopping,
                     # journal_interval long: only attachments_changed() makes the watch read the journal soon
                     settings=LiveSettings(hold=0.2, journal_interval=3600, retry_unopenable=0.5))
    w = Watch(journal, metrics, live, stopping, woken.calls)
    yield w
    w.stop()
    journal.close()


@pytest.fixture()
def pod_netns() -> Iterator[PodNetns]:
    with made_pod_netns("lwa", "10.78.0.5/24") as ns:
        yield ns


def journal_attachment(w: Watch, netns: str, mac: str, cid: str = CID, claim: tuple[str, str] = CLAIM) -> None:
    """An attachment as a worker journals it after the ADD, its claim published (clean), and the watch told."""
    entry = {"driver": "net.example.com", "pool": "p", "device": "nic0",
             "networkData": {"interfaceName": "eth0", "ips": ["10.78.0.5/24"], "hardwareAddress": mac},
             "conditions": [{"type": "Ready", "status": "True", "reason": "NetworkConfigured", "message": "",
                             "lastTransitionTime": "2026-12-05T00:00:00Z"}]}
    stamp = new_order()
    w.journal.finish(None, upsert=[Attachment(
        container_id=cid, ifname="eth0", driver="net.example.com", network="podnet", pod_namespace=claim[0],
        pod_name="pod-" + cid[:6], pod_uid="uid-" + cid[:6], claim_namespace=claim[0], claim_name=claim[1],
        claim_uid="cuid", pool="p", device="nic0", share_id="", entry=entry, result_hash="h", event_ts=time.time(),
        stamp=stamp, added=stamp, netns=netns)])
    w.journal.clean(*claim)
    w.live.attachments_changed()


def host_link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@contextmanager
def pod_netns_with_host_peer() -> Iterator[tuple[PodNetns, str]]:
    """A pod netns whose `eth0` is a veth with its peer on the host, as a runtime's bridge setup leaves it:
    the peer lives exactly as long as the netns does, so it shows whether anything still holds the netns."""
    ns, peer = PodNetns(f"lwa-{suffix()}"), f"lwh{suffix()}"
    ip("netns", "add", ns.name)
    try:
        ip("link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        ip("link", "set", peer, "up")
        ip("-n", ns.name, "addr", "add", "10.78.0.6/24", "dev", "eth0")
        ns.link("up")
        yield ns, peer
    finally:
        ns.remove()
        subprocess.run(["ip", "link", "del", peer], capture_output=True)


def test_a_committed_attachment_is_followed_as_soon_as_the_watch_is_told(watch: Watch, pod_netns: PodNetns) -> None:
    watch.start()
    wait_until("the watch to have read the empty journal", lambda: watch.live.busy() == 0, timeout=30)
    assert watch.live.state() == {"enabled": True, "reason": "", "attachments": 0, "namespaces": 0,
                                  "journal_errors": {}}

    journal_attachment(watch, pod_netns.path, pod_netns.mac())

    wait_until("the watch to follow the attachment", lambda: watch.follows(1), timeout=30)
    assert watch.live_state() == "Ready" and not watch.dirty()  # as the ADD said: nothing to write
    assert watch.woken == []


def test_a_link_set_down_is_recorded_for_the_claim_and_wakes_the_caller(watch: Watch, pod_netns: PodNetns) -> None:
    journal_attachment(watch, pod_netns.path, pod_netns.mac())
    watch.start()
    wait_until("the watch to follow the attachment", lambda: watch.follows(1), timeout=30)

    pod_netns.link("down")

    wait_until("LinkDown recorded", lambda: watch.live_state() == "LinkDown", timeout=30)
    assert watch.dirty(), "the claim is marked for its reconcile"
    wait_until("the caller woken", lambda: watch.woken, timeout=30)
    assert watch.changes("LinkDown") == 1

    watch.journal.clean(*CLAIM)
    pod_netns.link("up")

    wait_until("Ready recorded again", lambda: watch.live_state() == "Ready" and watch.dirty(), timeout=30)
    assert watch.changes("Recovered") == 1
    wait_until("the caller woken again", lambda: len(watch.woken) == 2, timeout=30)


def test_an_attachment_whose_netns_is_removed_is_retired_and_the_netns_let_go(watch: Watch) -> None:
    with pod_netns_with_host_peer() as (pod_netns, host_peer):
        journal_attachment(watch, pod_netns.path, pod_netns.mac())
        watch.start()
        wait_until("the watch to follow the attachment", lambda: watch.follows(1), timeout=30)

        pod_netns.remove()  # the runtime removes the sandbox; no DEL comes

        wait_until("the attachment retired", lambda: watch.journal.attachment(CID, "eth0") is None, timeout=30)
        assert watch.dirty(), "the claim is marked, so its reconcile removes the entry"
        wait_until("the caller woken", lambda: watch.woken, timeout=30)
        assert watch.metrics.registry.get_sample_value("netclaim_interface_netns_vanished_total") == 1
        wait_until("the watch to hold nothing", lambda: watch.follows(0), timeout=30)
        # Nothing holds the netns any more: the kernel destroys it, and with it the veth's host end.
        wait_until("the netns freed (its veth's host end gone)", lambda: not host_link_exists(host_peer), timeout=30)
