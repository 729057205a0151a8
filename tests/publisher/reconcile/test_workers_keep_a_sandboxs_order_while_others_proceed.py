"""The events of one attachment are handled by one worker in journal order, while another
sandbox's events, on another shard, go on (publisher/reconcile/workers.py Workers)."""

from __future__ import annotations

import threading
from typing import Iterator

import pytest

from cni_plugin.wire.event import PodRef
from publisher.journal.store import Pending
from publisher.journal.schema import shard_key
from publisher.reconcile.workers import Workers
from publisher_testkit import cni_result, wait_until, wire_event
from workers_kit import Rig, rig

POD = PodRef("ns", "web", "uid-web")


def on_shard(shard: int, shards: int, prefix: str) -> str:
    """A containerID whose events go to `shard`."""
    return next(cid for cid in (f"{prefix}{i}" for i in range(1000)) if shard_key(cid) % shards == shard)


@pytest.fixture()
def two_shards(workdir) -> Iterator[Rig]:
    yield from rig(workdir / "state", shards=2)


def test_a_sandbox_stuck_in_a_rule_holds_only_its_own_events(two_shards: Rig):
    slow, quick = on_shard(0, 2, "slow"), on_shard(1, 2, "quick")
    release = threading.Event()

    def rule(p: Pending) -> None:
        if p.event.container_id == slow and p.event.op == "ADD":
            release.wait(30)  # an apply that takes long

    two_shards.rules.rule = rule
    for op in ("ADD", "CHECK", "CHECK"):
        two_shards.journal.append(wire_event(op, slow, POD, cni_result()))
    for op in ("ADD", "CHECK"):
        two_shards.journal.append(wire_event(op, quick, POD, cni_result()))
    two_shards.start()
    two_shards.workers.wake.notify(None)

    wait_until("the other sandbox's events", lambda: len(two_shards.rules.of(quick)) == 2, timeout=30)
    assert two_shards.rules.of(slow) == []  # its ADD is still in the rule; its CHECKs wait behind it
    release.set()
    wait_until("the held sandbox's events", lambda: len(two_shards.rules.of(slow)) == 3, timeout=30)

    assert two_shards.rules.of(slow) == [(Workers.name(0), slow, op) for op in ("ADD", "CHECK", "CHECK")]
    assert two_shards.rules.of(quick) == [(Workers.name(1), quick, op) for op in ("ADD", "CHECK")]
    assert two_shards.journal.depth() == 0


def test_a_committed_event_wakes_only_its_own_shard(two_shards: Rig):
    cid = on_shard(1, 2, "c")
    event = wire_event("ADD", cid, POD, cni_result())
    wake = two_shards.workers.wake
    wake.notify(event)
    assert [e.is_set() for e in wake.events] == [False, True]
