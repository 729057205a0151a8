"""The publisher's per-claim bookkeeping stays bounded under pod churn.

A node sees a new claim for nearly every pod; the publisher must forget the
ones it no longer tracks (lesson from node agents whose memory grew with every
pod ever seen), but never while a worker might still use a claim's lock: two
workers holding different locks for one claim could drop a sibling's entry.
"""

from __future__ import annotations

import threading

from publisher.reconcile.writer import Writer


def _writer(remembered: dict[str, str | None]) -> Writer:
    def remember(key: str, digest: str | None) -> None:
        remembered[key] = digest

    applied = {f"ns/claim-{i}": f"hash-{i}" for i in range(1000)}
    return Writer(kube=None, node_name="node-a", stopping=threading.Event(), applied=applied, remember=remember)


def test_inactive_claims_are_forgotten_and_the_journal_told():
    remembered: dict[str, str | None] = {}
    writer = _writer(remembered)
    for i in range(1000):
        with writer.claim_lock(f"ns/claim-{i}"):
            pass
    active = {"ns/claim-1", "ns/claim-2"}

    dropped = writer.forget_inactive(active)

    assert dropped == 998
    assert set(writer._locks) == active
    assert set(writer._last) == active
    assert remembered["ns/claim-3"] is None and "ns/claim-1" not in remembered


def test_a_lock_in_use_is_never_forgotten():
    writer = _writer({})
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with writer.claim_lock("ns/claim-7"):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(10)
    waiter_started = threading.Event()
    got_lock = threading.Event()

    def wait_for_lock() -> None:
        waiter_started.set()
        with writer.claim_lock("ns/claim-7"):
            got_lock.set()

    waiter = threading.Thread(target=wait_for_lock)
    waiter.start()
    waiter_started.wait(10)

    writer.forget_inactive(set())  # the claim is not tracked any more, but two users hold/wait
    assert "ns/claim-7" in writer._locks
    # Anyone arriving now must queue on the SAME lock as the holder.
    assert not got_lock.wait(0.2)
    release.set()
    holder.join(10)
    waiter.join(10)
    assert got_lock.is_set()

    writer.forget_inactive(set())
    assert "ns/claim-7" not in writer._locks
