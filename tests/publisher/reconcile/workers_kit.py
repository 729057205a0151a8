"""The worker loop (publisher/reconcile/workers.py Workers) on a real journal, with small stand-ins
for the rules and the other neighbours the loop only tells (the Protocols that module declares)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from cni_plugin.wire.event import Event
from publisher.journal.store import Journal, Pending
from publisher.observe.health import Health
from publisher.observe.metrics import Metrics
from publisher.reconcile.workers import ShardWake, Workers


@dataclass
class FakeRules:
    """Rules that run `rule` for each event and then finish it in the journal (what a real rule's commit does)."""

    journal: Journal
    rule: Callable[[Pending], None] = lambda p: None
    handled: list[tuple[str, str, str]] = field(default_factory=list)  # (thread, containerID, op), in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def process(self, p: Pending) -> None:
        self.rule(p)
        with self.lock:
            self.handled.append((threading.current_thread().name, p.event.container_id, p.event.op))
        self.journal.finish(p.seq)

    def of(self, container_id: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [h for h in self.handled if h[1] == container_id]

    def next_hold_end(self, shard: int, shards: int) -> float | None:
        return None

    def ended_holds(self, shard: int, shards: int) -> list[tuple[str, Any]]:
        return []

    def apply_held(self, claim_key: str, hold: Any) -> None:
        raise AssertionError("nothing is held here")


@dataclass
class FakeReport:
    errors: list[tuple[str, str]] = field(default_factory=list)  # (error, event_id)

    def error(self, error: str, event: Event | None = None, claim: str = "") -> None:
        self.errors.append((error, event.event_id if event else ""))


@dataclass
class FakeUnchained:
    adds: list[str] = field(default_factory=list)  # pod UIDs

    def saw_add(self, pod_uid: str, namespace: str, name: str) -> None:
        self.adds.append(pod_uid)


@dataclass
class FakeLive:
    changes: int = 0

    def attachments_changed(self) -> None:
        self.changes += 1


@dataclass
class SyncedPods:
    synced: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.synced.set()  # the first listing is in: the workers do not wait for it


@dataclass
class Rig:
    journal: Journal
    rules: FakeRules
    report: FakeReport
    health: Health
    metrics: Metrics
    workers: Workers
    stopping: threading.Event
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        """Each shard's loop on a thread named as the service names it."""
        for shard in range(self.workers.shards):
            t = threading.Thread(target=self.workers.run, args=(shard,), name=Workers.name(shard), daemon=True)
            t.start()
            self.threads.append(t)


def rig(state_dir: Path, shards: int = 1) -> Iterator[Rig]:
    """A Workers on a real journal in `state_dir`; stops its loops and closes the journal afterwards."""
    journal = Journal(str(state_dir))
    stopping = threading.Event()
    rules, report, health, metrics = FakeRules(journal), FakeReport(), Health(), Metrics()
    workers = Workers(journal=journal, rules=rules, health=health, report=report, unchained=FakeUnchained(),
                      live=FakeLive(), pods=SyncedPods(), metrics=metrics, wake=ShardWake(shards),
                      stopping=stopping)
    r = Rig(journal, rules, report, health, metrics, workers, stopping)
    try:
        yield r
    finally:
        stopping.set()
        workers.wake.wake_all()
        for t in r.threads:
            t.join(10)
        journal.close()
