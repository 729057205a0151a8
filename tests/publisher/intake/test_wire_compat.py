"""A wire format that can grow: what the publisher does with events of other plugin releases.

During a rollout (publisher first, then plugins) and after a downgrade, a publisher meets
events of a newer plugin: fields it does not know, or a wire version above the ones it
reads. It must accept the first (the fields are ignored, logged once and counted), refuse
the second without destroying it (the plugin spools it; a spooled one is kept for a newer
publisher), and still quarantine what is truly malformed. An old plugin's spool file
(tests/publisher/data) must still be read. Torn files of an earlier boot (a spool write
has no fsync) are dropped and counted, not alarmed.

The publishers here are real subprocesses whose API server address is unreachable (a
stand-in, named as such: intake works while the API is down, which is all these tests
look at). Socket, spool, journal and logs are real.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from cni_plugin.wire import event as events
from cni_plugin.wire import spool as wire_spool
from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from cni_plugin.wire.spool import write_spool
from publisher_testkit import Publisher, cni_result, request, unreachable_kubeconfig, wait_until, wire_event

DATA = Path(__file__).resolve().parents[1] / "data"
POD = PodRef("team-a", "web-0", "uid-1")


@pytest.fixture()
def offline(workdir):
    """Publishers whose API server is unreachable, started after the test prepared their spool."""
    kubeconfig = unreachable_kubeconfig(workdir)
    started: list[Publisher] = []

    def make(prepare=None, start: bool = True) -> Publisher:
        p = Publisher(str(kubeconfig), workdir / f"p{len(started)}")
        p.workdir.mkdir()
        os.makedirs(p.spool, mode=0o700)
        if prepare:
            prepare(Path(p.spool))
        started.append(p)
        return p.start() if start else p

    yield make
    for p in started:
        p.kill()


def journaled(p: Publisher) -> list[str]:
    db = sqlite3.connect(os.path.join(p.state, "journal.db"))
    try:
        return [row[0] for row in db.execute("SELECT event_id FROM events ORDER BY seq")]
    finally:
        db.close()


def spool_file(spool: Path, body: dict | str, written: float | None = None) -> Path:
    """A spool file named as the plugin names it; `written`: its wall time (name and mtime)."""
    ns = time.time_ns() if written is None else int(written * 1e9)
    path = spool / f"{ns:020d}-{os.urandom(4).hex()}{wire_spool.SPOOL_SUFFIX}"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    if written is not None:
        os.utime(path, (written, written))
    return path


def rejected(p: Publisher, reason: str) -> float:
    return p.metric(f'netclaim_events_rejected_total{{reason="{reason}"}}')


def another_spool_pass(p: Publisher) -> None:
    """Wait until the publisher has read its whole spool once more, from now."""
    first = p.status()["last_spool_ingest"] or 0
    wait_until("another complete spool pass", lambda: (p.status()["last_spool_ingest"] or 0) > first)


def test_an_unknown_optional_field_is_accepted_on_the_socket_and_from_the_spool_and_logged_once(offline):
    p = offline()
    sent = wire_event("ADD", "cid-sock", POD, cni_result())
    body = {**sent.to_dict(), "numa_node": 1}
    assert request(p.socket, {"kind": "event", "event": body}) == {"ok": True, "id": sent.event_id}

    spooled = wire_event("ADD", "cid-spool", POD, cni_result())
    spool_file(Path(p.spool), {**spooled.to_dict(), "numa_node": 0})
    wait_until("the spooled event journaled", lambda: spooled.event_id in journaled(p))
    assert journaled(p) == [sent.event_id, spooled.event_id]
    assert not [n for n in os.listdir(p.spool) if n.endswith(".bad")]
    assert rejected(p, "bad_spool_file") == 0 and rejected(p, "bad_event") == 0
    assert p.metric('netclaim_wire_unknown_fields_total{field="numa_node"}') == 2
    lines = [e for e in p.log_events() if e.get("msg") == "unknown event field ignored"]
    assert len(lines) == 1 and lines[0]["field"] == "numa_node", lines


def test_an_event_of_a_newer_wire_version_is_refused_on_the_socket_with_a_reason(offline):
    """The plugin spools a refused event; the reply tells why (the plugin logs it)."""
    p = offline()
    event = {**wire_event("ADD", "cid-v2", POD, cni_result()).to_dict(), "version": events.WIRE_VERSION_MAX + 1}
    reply = request(p.socket, {"kind": "event", "event": event})
    assert reply["ok"] is False and "newer" in reply["error"] and "upgrade the publisher" in reply["error"], reply
    assert journaled(p) == []


def test_a_spooled_event_of_a_newer_version_is_kept_while_a_malformed_one_is_quarantined(offline):
    newer = {**wire_event("ADD", "cid-v2", POD, cni_result()).to_dict(), "version": events.WIRE_VERSION_MAX + 1}
    malformed = {**wire_event("ADD", "cid-bad", POD, cni_result()).to_dict(), "op": 5}
    names = {}

    def plant(spool: Path) -> None:
        names["newer"] = spool_file(spool, newer).name
        names["malformed"] = spool_file(spool, malformed).name

    p = offline(plant)
    wait_until("the newer event counted", lambda: rejected(p, "newer_version") == 1)
    wait_until("the malformed file quarantined", lambda: (names["malformed"] + ".bad") in os.listdir(p.spool))
    another_spool_pass(p)
    another_spool_pass(p)
    assert sorted(os.listdir(p.spool)) == sorted([names["newer"], names["malformed"] + ".bad"])
    assert rejected(p, "newer_version") == 1, "counted once per file, not once per pass"
    assert rejected(p, "bad_spool_file") == 1
    assert journaled(p) == []
    status = p.status()
    assert "spool" not in status["not_ready_reason"], status["not_ready_reason"]
    assert status["spool_files"] == 1  # still pending: a newer publisher will read it
    assert "newer" in status["last_error"]["error"], status["last_error"]
    kept = [e for e in p.log_events() if e.get("msg") == "spool files kept for a newer publisher"]
    assert len(kept) == 1 and kept[0]["file"] == names["newer"], kept


def test_an_unparseable_spool_file_of_an_earlier_boot_is_dropped_and_counted_without_a_fault(offline):
    boot_started = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    names = {}

    def plant(spool: Path) -> None:
        names["torn"] = spool_file(spool, '{"op": "ADD", "container_id": "cid-to', written=boot_started - 3600).name
        names["empty"] = spool_file(spool, "", written=boot_started - 60).name
        names["now"] = spool_file(spool, "{not json").name  # this boot's: quarantined as before

    p = offline(plant)
    wait_until("the earlier boot's files dropped", lambda: rejected(p, "earlier_boot") == 2)
    wait_until("this boot's file quarantined", lambda: sorted(os.listdir(p.spool)) == [names["now"] + ".bad"])
    another_spool_pass(p)
    assert rejected(p, "bad_spool_file") == 1
    status = p.status()
    assert "spool" not in status["not_ready_reason"], status["not_ready_reason"]
    assert status["spool_files"] == 0
    dropped = [e for e in p.log_events() if e.get("msg") == "unparseable spool files of an earlier boot dropped"]
    assert len(dropped) == 1 and dropped[0]["level"] == "info" and dropped[0]["count"] == 2, dropped


def test_an_old_plugins_spool_file_is_read_by_this_publisher(offline):
    """A file the first wire version's plugin spooled (kept verbatim in tests/publisher/data)."""
    fixture = DATA / "v1-plugin-add.event.json"
    event_id = json.loads(fixture.read_text())["event_id"]
    p = offline(lambda spool: shutil.copy(fixture, spool / f"{time.time_ns():020d}-{event_id}{wire_spool.SPOOL_SUFFIX}"))
    wait_until("the old plugin's event journaled", lambda: event_id in journaled(p))
    assert os.listdir(p.spool) == []
    assert p.metric("netclaim_events_spooled_total") == 1
    assert rejected(p, "bad_spool_file") == 0 and p.metric("netclaim_wire_unknown_fields_total") == 0


def test_a_plugin_event_spooled_and_acked_twice_is_one_event_whatever_its_extra_fields(offline):
    """De-duplication by event id holds across a copy with an unknown field and one without."""
    p = offline()
    ev = wire_event("DEL", "cid-dup", POD)
    write_spool(p.spool, ev)
    assert request(p.socket, {"kind": "event", "event": {**ev.to_dict(), "future": True}})["ok"] is True
    assert request(p.socket, event_request(ev))["ok"] is True
    another_spool_pass(p)
    assert journaled(p) == [ev.event_id]


# ------------------------------------------------------------------ Event.from_dict itself


@pytest.mark.parametrize("version", [0, -1, "2", 1.0, True, None, [2]])
def test_a_version_that_is_no_positive_integer_is_malformed_not_newer(version):
    body = {**wire_event("ADD", "c", POD).to_dict(), "version": version}
    with pytest.raises(events.WireError) as info:
        events.Event.from_dict(body)
    assert not isinstance(info.value, events.NewerVersion)


def test_a_newer_version_is_refused_before_its_other_fields_are_judged():
    """A newer format may change any field; it must not be quarantined as malformed for that."""
    body = {"version": events.WIRE_VERSION_MAX + 1, "op": {"changed": "shape"}}
    with pytest.raises(events.NewerVersion):
        events.Event.from_dict(body)


def test_unknown_fields_are_dropped_from_the_event_and_told_to_the_hook():
    seen: list[list[str]] = []
    events.on_unknown_fields(seen.append)
    try:
        body = {**wire_event("ADD", "c", POD).to_dict(), "numa_node": 1,
                "pod": {"namespace": "ns", "name": "n", "uid": "u", "labels": {}}}
        event = events.Event.from_dict(body)
        with pytest.raises(events.WireError):
            events.Event.from_dict({**body, "op": "JUMP"})  # malformed: nothing is told of it
    finally:
        events.on_unknown_fields(None)
    assert seen == [["numa_node", "pod.labels"]]
    assert "numa_node" not in event.to_dict() and event.pod == PodRef("ns", "n", "u")
    assert events.Event.from_dict(event.to_dict()).to_dict() == event.to_dict()


def test_the_plugin_still_sends_what_the_previous_publisher_reads():
    """Publishers roll out first: the plugin raises its version only after WIRE_VERSION_MAX did."""
    assert events.WIRE_VERSION <= events.WIRE_VERSION_MAX
    assert events.Event(op="ADD", container_id="c", ifname="eth0", driver="d").version == events.WIRE_VERSION

