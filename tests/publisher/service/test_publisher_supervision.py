"""Through the publisher's code: a failing journal or a crashing thread never
takes a worker away for good, and /readyz says why while it lasts.

A full disk cannot be produced safely on this shared machine, so the journal's
write methods are replaced by ones raising what SQLite raises then
("database or disk is full") — a fake only for that condition; everything else
(journal file, API server, threads) is real.
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from cni_plugin.wire.event import PodRef
from publisher_testkit import cni_result, wire_event

pytestmark = pytest.mark.controlplane


def disk_full(*_a, **_kw):
    raise sqlite3.OperationalError("database or disk is full")


def wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition never became true")


def test_journal_write_error_keeps_the_worker_and_says_not_ready(service, monkeypatch):
    service.start()
    wait(lambda: service.ready()[0])
    real_finish, real_reschedule = service.journal.finish, service.journal.reschedule
    monkeypatch.setattr(service.journal, "finish", disk_full)
    monkeypatch.setattr(service.journal, "reschedule", disk_full)
    ev = wire_event("ADD", "c1", PodRef("ns", "never-there", "u"), cni_result())
    service.submit(ev)
    wait(lambda: not service.ready()[0])
    assert "disk is full" in service.ready()[1]
    assert service.journal.depth() == 1  # the event is still there, not lost
    monkeypatch.setattr(service.journal, "finish", real_finish)
    monkeypatch.setattr(service.journal, "reschedule", real_reschedule)
    wait(lambda: service.ready()[0])  # the same worker goes on
    workers = [t for t in service._threads if t.name == "worker-0"]
    assert workers and workers[0].is_alive()


def test_crashed_thread_is_restarted_and_reported(service):
    calls = []
    release = threading.Event()

    def body() -> None:
        calls.append(time.time())
        if len(calls) == 1:
            raise RuntimeError("boom")
        release.wait(20)

    service.started = True
    service._spawn("probe", body)
    wait(lambda: "probe" in service.down)
    ok, why = service.ready()
    # /readyz names the thread and the error's type; the message (maybe an API answer) is logged only.
    assert not ok and "probe crashed: RuntimeError" in why and "boom" not in why
    assert "probe crashed: RuntimeError: boom" in service.down["probe"]
    wait(lambda: len(calls) == 2)  # restarted
    wait(lambda: service.ready()[0])  # and no longer reported down
    release.set()


def test_an_api_outage_is_aged_by_node_time_not_by_a_wall_clock_step(service, monkeypatch):
    """A wall clock stepped forward (NTP after a reboot with the clock behind) must not turn a
    seconds-old outage into one "past the threshold", nor a step back hide a long one."""
    from publisher import limits

    service.start()
    wait(lambda: service.ready()[0])
    service.kube._note(0, "connection refused")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 10 * limits.API_DOWN_NOT_READY)
    assert service.ready()[0], service.ready()[1]
    service.kube._note(200)


def test_readyz_says_not_ready_past_the_api_thresholds(service):
    """The thresholds of publisher/limits.py, from the API health the client records per answer."""
    from publisher import limits

    service.start()
    wait(lambda: service.ready()[0])
    kube = service.kube
    kube._note(0, "connection refused")  # no answer: the outage starts now
    assert service.ready()[0]  # not yet past the threshold
    kube._health.failing_since -= limits.API_DOWN_NOT_READY + 1
    ok, why = service.ready()
    # A fixed class of failure; the error's own text is the log's (anyone reaching the port reads /readyz).
    assert not ok and why.startswith("api: failing for") and "unreachable (no answer)" in why
    assert "connection refused" not in why
    kube._note(200)  # any answer ends it
    assert service.ready()[0]
    for _ in range(limits.UNAUTHORIZED_NOT_READY):
        kube._note(401, "Unauthorized")
    ok, why = service.ready()
    assert not ok and why.startswith("credentials: ") and "401" in why
    assert service.status()["credentials"]["unauthorized_consecutive"] == limits.UNAUTHORIZED_NOT_READY
    kube._note(200)
    assert service.ready()[0] and service.status()["credentials"]["unauthorized_total"] == limits.UNAUTHORIZED_NOT_READY
