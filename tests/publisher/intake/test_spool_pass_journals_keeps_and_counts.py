"""One pass of the spool reader (publisher.intake.spool.Intake.ingest_spool) on its own.

The spool is a real directory filled by the plugin's own writer (cni_plugin.wire.spool.write_spool),
the journal a real publisher.journal.store.Journal on disk; no service, socket or API server runs.
What is asserted is what an operator sees afterwards: the events the journal holds, the files left
in the spool, the counters of publisher.observe.metrics.Metrics, the last error and readiness.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cni_plugin.lean.jsonio import dumps
from cni_plugin.wire.event import WIRE_VERSION_MAX, Event, PodRef
from cni_plugin.wire.spool import OVERFLOW_NAME, SpoolFull, list_spool, read_overflow, write_spool
from publisher.clock import boot_began_wall, node_seconds
from publisher.intake.spool import Intake
from publisher.journal.store import Journal
from publisher.observe.events import EventRecorder
from publisher.observe.health import Health
from publisher.observe.metrics import Metrics
from publisher.observe.report import Reporter

NODE = "node-a"


def add_event(cid: str) -> Event:
    """An ADD as the plugin makes it, for its own attachment (the journal hands out one per attachment)."""
    return Event(op="ADD", container_id=cid, ifname="eth0", driver="net.example.com", netns="/var/run/netns/x",
                 pod=PodRef("team-a", f"pod-{cid}", f"uid-{cid}"), result={"interfaces": [], "ips": []})


@dataclass
class SpoolPass:
    """An Intake over a temp spool and journal, with what it told its caller and its Warnings' outcomes."""

    spool: Path
    journal: Journal
    metrics: Metrics
    reporter: Reporter
    health: Health
    intake: Intake
    notified: list[Event | None] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def journaled(self) -> list[str]:
        """Event ids the journal holds, oldest first (every one pending: nothing works them off here)."""
        pending = self.journal.ready(0, 1, node_seconds() + 3600, limit=1000)
        return [p.event.event_id for p in pending]

    def files(self) -> list[str]:
        """Names in the spool directory, whatever they are."""
        return sorted(os.listdir(self.spool))

    def rejected(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("netclaim_events_rejected_total", {"reason": reason}) or 0.0

    def counter(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name) or 0.0


@dataclass
class Workers:
    """What the intake wakes after a commit: here it only records what it was told (None: a spool pass)."""

    notified: list[Event | None] = field(default_factory=list)

    def notify(self, event: Event | None) -> None:
        self.notified.append(event)


@pytest.fixture()
def spool_pass(workdir: Path) -> Iterator[SpoolPass]:
    spool = workdir / "spool"
    os.makedirs(spool, mode=0o700)
    journal = Journal(state_dir=str(workdir / "state"))
    metrics = Metrics()
    warnings: list[str] = []
    recorder = EventRecorder(kube=None, node_name=NODE, count=warnings.append, enabled=False)  # no API server
    reporter = Reporter(metrics=metrics, events=recorder)
    health = Health()
    workers = Workers()
    intake = Intake(journal=journal, spool_dir=str(spool), node=NODE, reporter=reporter, workers=workers,
                    health=health)
    yield SpoolPass(spool, journal, metrics, reporter, health, intake, workers.notified, warnings)
    journal.close()


def test_events_the_plugin_spooled_are_journaled_once_and_their_files_removed(spool_pass: SpoolPass) -> None:
    events = [add_event(f"c{i}") for i in range(3)]
    for ev in events:
        write_spool(str(spool_pass.spool), ev)
    assert len(list_spool(str(spool_pass.spool))) == 3

    assert spool_pass.intake.ingest_spool() == 3
    assert spool_pass.journaled() == [ev.event_id for ev in events]
    assert spool_pass.files() == []
    assert spool_pass.counter("netclaim_events_spooled_total") == 3
    assert spool_pass.notified == [None]  # one wake for the pass, not one per event

    write_spool(str(spool_pass.spool), events[0])  # spooled again (its ack was lost): the same event id
    assert spool_pass.intake.ingest_spool() == 0
    assert spool_pass.journaled() == [ev.event_id for ev in events]
    assert spool_pass.files() == []
    assert spool_pass.counter("netclaim_events_spooled_total") == 3
    assert spool_pass.health.readiness()[0], spool_pass.health.readiness()


def test_a_file_of_a_newer_wire_version_is_kept_untouched_and_counted_once(spool_pass: SpoolPass) -> None:
    newer = add_event("c-new")
    body = {**newer.to_dict(), "version": WIRE_VERSION_MAX + 1, "field_of_the_future": {"x": 1}}
    kept = Path(write_spool(str(spool_pass.spool), newer, data=dumps(body).encode()))
    written = kept.read_bytes()
    ordinary = add_event("c-now")
    write_spool(str(spool_pass.spool), ordinary)

    assert spool_pass.intake.ingest_spool() == 1
    assert spool_pass.intake.ingest_spool() == 0  # the next pass neither reads it again nor counts it again

    assert spool_pass.journaled() == [ordinary.event_id]
    assert spool_pass.files() == [kept.name]
    assert kept.read_bytes() == written
    assert spool_pass.rejected("newer_version") == 1
    assert spool_pass.rejected("bad_spool_file") == 0
    assert "newer wire version" in spool_pass.reporter.last_error["error"]
    assert spool_pass.health.readiness()[0], spool_pass.health.readiness()  # kept for a newer publisher: no fault


def test_a_malformed_file_of_this_boot_is_renamed_bad_and_counted(spool_pass: SpoolPass) -> None:
    bad = Path(write_spool(str(spool_pass.spool), add_event("c-bad"), data=b'{"op": "ADD", "container_id": '))
    ordinary = add_event("c-good")
    write_spool(str(spool_pass.spool), ordinary)

    assert spool_pass.intake.ingest_spool() == 1

    assert spool_pass.journaled() == [ordinary.event_id]
    assert spool_pass.files() == [bad.name + ".bad"]
    assert spool_pass.rejected("bad_spool_file") == 1
    assert spool_pass.rejected("earlier_boot") == 0
    assert spool_pass.intake.ingest_spool() == 0  # a .bad file is no spool file: never counted again
    assert spool_pass.rejected("bad_spool_file") == 1


def test_a_torn_file_of_an_earlier_boot_is_deleted_and_counted_without_a_fault(spool_pass: SpoolPass) -> None:
    before_boot = boot_began_wall() - 3600
    torn = spool_pass.spool / f"{int(before_boot * 1e9):020d}-torn.event.json"
    torn.write_bytes(b'{"op": "ADD", "contai')
    os.utime(torn, (before_boot, before_boot))

    assert spool_pass.intake.ingest_spool() == 0

    assert spool_pass.files() == []
    assert spool_pass.journaled() == []
    assert spool_pass.rejected("earlier_boot") == 1
    assert spool_pass.rejected("bad_spool_file") == 0
    assert spool_pass.health.readiness()[0], spool_pass.health.readiness()


def test_drops_in_the_overflow_marker_are_reported_once_and_the_marker_taken(spool_pass: SpoolPass) -> None:
    for cid in ("c-1", "c-2"):
        with pytest.raises(SpoolFull):
            write_spool(str(spool_pass.spool), add_event(cid), max_files=0)  # the plugin at the spool's cap
    assert read_overflow(str(spool_pass.spool))["dropped"] == 2

    spool_pass.intake.ingest_spool()

    assert spool_pass.counter("netclaim_spool_overflow_events_total") == 2
    assert spool_pass.intake.overflow["dropped"] == 2 and spool_pass.intake.overflow["reports"] == 1
    assert spool_pass.intake.overflow["last"]["lastCommand"] == "ADD"
    assert "spool was full: 2 event(s) were not recorded" in spool_pass.reporter.last_error["error"]
    assert spool_pass.warnings == ["disabled"]  # one Warning about the node asked for (Events are off here)
    assert OVERFLOW_NAME not in spool_pass.files() and spool_pass.files() == []
    assert read_overflow(str(spool_pass.spool)) is None

    spool_pass.intake.ingest_spool()  # nothing new dropped: nothing reported again
    assert spool_pass.counter("netclaim_spool_overflow_events_total") == 2
    assert spool_pass.intake.overflow["reports"] == 1
    assert spool_pass.warnings == ["disabled"]


def test_what_the_journal_holds_is_the_event_the_plugin_wrote(spool_pass: SpoolPass) -> None:
    ev = add_event("c-body")
    path = write_spool(str(spool_pass.spool), ev)
    on_disk = json.loads(Path(path).read_text())

    spool_pass.intake.ingest_spool()

    (pending,) = spool_pass.journal.ready(0, 1, node_seconds() + 3600)
    assert pending.event.to_dict() == Event.from_dict(on_disk).to_dict()
