"""Workers: the threads that drive journaled events through the rules, one shard each.

Workers are sharded by containerID (publisher/journal/schema.py shard_key), so the
events of one attachment are handled by one thread in journal order while other
sandboxes run in parallel. A failure is reported and the event kept or dropped, never
the worker: an API that does not answer reschedules the event, a journal error
reschedules it and reports it, any other error (a bug, an input no rule can take) is
retried a few times and then failed for good (`Workers._internal_error`).

This module runs the loop body only: publisher/service.py starts each shard's body
under its supervisor (thread restarts, health). What the loop needs from its
neighbours is declared below as Protocols, so a test can hand in small fakes.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING, Any, Protocol

from cni_plugin.wire.event import Event
from publisher import limits, logs
from publisher.clock import node_seconds
from publisher.journal.schema import shard_key
from publisher.kube.calls import TransientError
from publisher.observe.report import event_fields

if TYPE_CHECKING:
    from publisher.journal.store import Pending, WriteState


class JournalView(Protocol):
    """What the workers read and write in the journal (publisher/journal/store.py Journal)."""

    @property
    def writes(self) -> WriteState: ...

    def ready(self, shard: int, shards: int, now: float, limit: int = 64) -> list[Pending]: ...

    def next_due(self, shard: int, shards: int) -> float | None: ...

    def reschedule(self, seq: int, next_try: float, error: str) -> None: ...

    def finish(self, seq: int | None, state: str = "done", error: str = "") -> None: ...

    def depth(self) -> int: ...

    def attachment_count(self) -> int: ...


class RulesView(Protocol):
    """The per-verb rules (publisher/reconcile/rules.py Rules) and their sibling holds."""

    def process(self, p: Pending) -> None: ...

    def next_hold_end(self, shard: int, shards: int) -> float | None: ...

    def ended_holds(self, shard: int, shards: int) -> list[tuple[str, Any]]: ...

    def apply_held(self, claim_key: str, hold: Any) -> None: ...


class HealthView(Protocol):
    """Heartbeats and faults (publisher/observe/health.py Health)."""

    def beat(self, loop: str) -> None: ...

    def fault(self, component: str, message: str) -> bool: ...

    def clear(self, component: str) -> bool: ...


class ErrorReport(Protocol):
    """Where an event's error is told (publisher/observe/report.py Reporter)."""

    def error(self, error: str, event: Event | None = None, claim: str = "") -> None: ...


class AddSeen(Protocol):
    """Told of each ADD or CHECK with a pod (publisher/repair/unchained.py UnchainedPods)."""

    def saw_add(self, pod_uid: str, namespace: str, name: str) -> None: ...


class AttachmentsChanged(Protocol):
    """Told after each committed outcome (publisher/live/watcher.py LiveWatch)."""

    def attachments_changed(self) -> None: ...


class Synced(Protocol):
    """The pod watch's first listing (publisher/reconcile/podcache.py PodCache)."""

    @property
    def synced(self) -> threading.Event: ...


class Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class LabelledCounter(Protocol):
    def labels(self, *values: str) -> Counter: ...


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class WorkerMetrics(Protocol):
    """The metrics the workers count in (publisher/observe/metrics.py Metrics)."""

    @property
    def events_failed(self) -> LabelledCounter: ...

    @property
    def journal_depth(self) -> Gauge: ...

    @property
    def attachments(self) -> Gauge: ...


class ShardWake:
    """One wake event per worker shard: set when a shard's events may be ready.

    Built before the parts that commit events (publisher/intake/spool.py Intake) and
    the workers that wait on it, so neither needs the other to exist first.
    """

    def __init__(self, shards: int) -> None:
        self.events = [threading.Event() for _ in range(shards)]

    def __len__(self) -> int:
        return len(self.events)

    def notify(self, event: Event | None) -> None:
        """Wake the shard of `event`, or every shard when None (a spool ingestion)."""
        if event is None:
            self.wake_all()
        else:
            self.events[shard_key(event.container_id) % len(self.events)].set()

    def wake_all(self) -> None:
        for w in self.events:
            w.set()


class Workers:
    """The worker loop of every shard: batches of ready events, one at a time, in journal order."""

    def __init__(self, *, journal: JournalView, rules: RulesView, health: HealthView, report: ErrorReport,
                 unchained: AddSeen, live: AttachmentsChanged, pods: Synced, metrics: WorkerMetrics,
                 wake: ShardWake, stopping: threading.Event, down: dict[str, str] | None = None) -> None:
        self.journal = journal
        self.rules = rules
        self.health = health
        self.report = report
        self.unchained = unchained
        self.live = live
        self.pods = pods
        self.metrics = metrics
        self.wake = wake
        self.stopping = stopping
        self.down = {} if down is None else down  # thread name -> why it is being restarted (the supervisor's)
        self.log = logs.get()

    @property
    def shards(self) -> int:
        return len(self.wake)

    @staticmethod
    def name(shard: int) -> str:
        return f"worker-{shard}"

    def run(self, shard: int) -> None:
        """One shard's loop until stop; only a bug outside `_handle` escapes to the supervisor."""
        n = self.shards
        name = self.name(shard)
        # A replay right after start would otherwise GET every pod the watch is
        # about to deliver anyway; wait a little for the first listing.
        self.pods.synced.wait(5.0)
        read_failed = False
        while not self.stopping.is_set():
            self.health.beat(name)
            self.wake.events[shard].clear()
            try:
                batch = self.journal.ready(shard, n, node_seconds())
                due = None if batch else self.journal.next_due(shard, n)
            except Exception as exc:  # noqa: BLE001 - the journal may come back: keep the worker
                read_failed = True
                if self.health.fault("journal", f"not readable: {exc}"):
                    self.log.error("journal read failed", extra={"component": name, "error": str(exc)})
                self.stopping.wait(1.0)
                continue
            if read_failed and not self.journal.writes.failing_since:
                read_failed = False
                self.health.clear("journal")  # reading works again (a write failure clears on its own)
            self.down.pop(name, None)
            self._end_holds(shard, name)
            if not batch:
                ends = [t for t in (due, self.rules.next_hold_end(shard, n)) if t is not None]
                wait = 5.0 if not ends else max(0.0, min(5.0, min(ends) - node_seconds()))
                self.wake.events[shard].wait(wait)
                continue
            for pending in batch:
                if self.stopping.is_set():
                    return
                self._handle(pending)
                self.health.beat(name)
            self._gauges()

    def _end_holds(self, shard: int, name: str) -> None:
        """Apply the claims whose sibling hold ended without the sandbox's last ADD, here on the
        sandbox's own worker, beside the others, not one after another on housekeeping's thread.
        A failure leaves the claim's mark to housekeeping, once the hold's lease is over."""
        for claim, hold in self.rules.ended_holds(shard, self.shards):
            try:
                self.rules.apply_held(claim, hold)
            except Exception:  # the mark stays: housekeeping retries the claim
                self.log.exception("held claim not applied", extra={"component": name, "claim": claim})
            self.health.beat(name)

    def _handle(self, pending: Pending) -> None:
        """One event; a failure is reported and the event kept or dropped, never the worker."""
        event = pending.event
        if event.op in ("ADD", "CHECK") and event.pod is not None:
            self.unchained.saw_add(event.pod.uid, event.pod.namespace, event.pod.name)
        try:
            self.rules.process(pending)
            self.health.clear("journal")  # the event's outcome was committed: the journal works
            self.live.attachments_changed()
        except TransientError:
            self._reschedule(pending, 1.0, "API unavailable")
        except (sqlite3.Error, OSError) as exc:  # the journal failing: the event must not be lost
            self.log.exception("event handling failed", extra=event_fields(pending.event))
            if self._reschedule(pending, 5.0, f"journal error: {exc}"):
                self.report.error(f"journal error: {exc}", pending.event)
        except Exception as exc:  # noqa: BLE001 - a bug or an input no rule can take
            self._internal_error(pending, exc)

    def _internal_error(self, pending: Pending, exc: Exception) -> None:
        """An error that is not the journal's: retried a few times, then failed for good.

        Such an error comes from the event itself (an input the rules cannot take)
        or from a bug; either way it repeats, and a retry loop every few seconds
        would hold the attachment's later CHECK and DEL behind it forever.
        """
        self.log.exception("event handling failed", extra=event_fields(pending.event))
        error = f"internal error: {type(exc).__name__}: {exc}"[:500]
        permanent = isinstance(exc, (RecursionError, MemoryError))
        if permanent or pending.attempts + 1 >= limits.INTERNAL_ERROR_RETRIES:
            try:
                self.journal.finish(pending.seq, "failed", error)
            except Exception as jexc:  # noqa: BLE001
                self.health.fault("journal", f"not writable: {jexc}")
                return
            self.metrics.events_failed.labels("internal_error").inc()
            self.report.error(error, pending.event)
            return
        if self._reschedule(pending, 5.0, error):
            self.report.error(error, pending.event)

    def _reschedule(self, pending: Pending, delay: float, error: str) -> bool:
        """Retry the event after `delay`; a journal that cannot even record that is a journal fault."""
        try:
            self.journal.reschedule(pending.seq, node_seconds() + delay, error)
            return True
        except Exception as exc:  # noqa: BLE001
            if self.health.fault("journal", f"not writable: {exc}"):
                self.log.error("journal write failed", extra={"error": str(exc)})
            self.stopping.wait(1.0)
            return False

    def _gauges(self) -> None:
        """Cached in the gauges: a scrape never reads the journal for these."""
        try:
            self.metrics.journal_depth.set(self.journal.depth())
            self.metrics.attachments.set(self.journal.attachment_count())
        except Exception:  # noqa: BLE001 - a gauge is not worth a failure; the next batch sets it
            pass
