"""Housekeeping: spool ingestion, retries of dirty claims, periodic resync, pruning.

One thread. Every `spool_interval` it ingests the spool. Claims marked dirty
(their last reconcile failed transiently) are retried when due, each with its
own capped exponential backoff with jitter. Every `resync_interval` every
tracked claim is reconciled against the live cluster (one GET per claim, an
apply only when the status differs); a pass that fails backs off
exponentially with jitter instead of retrying at once. After a successful
pass, tombstones and GC fences nothing older can reach any more are dropped
(journal.prune_order_marks) and so is the bookkeeping of claims no longer
tracked.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from . import limits, logs
from .journal import Journal
from .kube import TransientError
from .reconciler import Reconciler
from .writer import Writer, backoff_delay


class Housekeeping:
    def __init__(self, journal: Journal, reconciler: Reconciler, writer: Writer, ingest: Callable[[], int],
                 forget_claims: Callable[[set[str]], None], metrics: Any, stopping: threading.Event,
                 resync_interval: float, spool_interval: float, retry_base: float, retry_cap: float,
                 last_ingest: Callable[[], float]) -> None:
        self.journal = journal
        self.reconciler = reconciler
        self.writer = writer
        self.ingest = ingest
        self.forget_claims = forget_claims
        self.metrics = metrics
        self.stopping = stopping
        self.resync_interval = resync_interval
        self.spool_interval = spool_interval
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.last_ingest = last_ingest
        self.log = logs.get()
        self.wake = threading.Event()
        self.last_resync = 0.0  # end of the last complete resync pass
        self.resync_failures = 0
        self.next_resync = 0.0
        self.requested = 0  # resyncs asked for (`netclaim-publisher resync`), done when last_resync moves

    def claim_retry(self, ns: str, name: str, exc: Exception) -> None:
        """A reconcile failed transiently: keep the claim dirty and retry it with backoff."""
        attempts = next((a for n_, m, a in self.journal.dirty_claims() if (n_, m) == (ns, name)), 0)
        delay = backoff_delay(attempts, self.retry_base, self.retry_cap)
        self.journal.retry_dirty(ns, name, time.time() + delay)
        if attempts in (0, 1, 3) or attempts % 10 == 0:
            self.log.warning("claim not reconciled, retrying", extra={
                "claim": f"{ns}/{name}", "error": str(exc), "retry_in": round(delay, 3), "attempt": attempts + 1})
        self.wake.set()

    def request_resync(self) -> None:
        self.next_resync = 0.0
        self.wake.set()

    def run(self) -> None:
        """The loop; an exception escapes only to the supervisor (publisher/service.py)."""
        self.retry_dirty(everything=True)  # start-up: claims a crash left half-done
        self.next_resync = time.time() + self.resync_interval
        while not self.stopping.is_set():
            self.wake.wait(self._sleep())
            self.wake.clear()
            if self.stopping.is_set():
                return
            self.ingest()
            self.retry_dirty()
            if time.time() >= self.next_resync:
                self.resync()

    def _sleep(self) -> float:
        now = time.time()
        due = [self.spool_interval, self.next_resync - now]
        dirty = self.journal.next_dirty()
        if dirty is not None:
            due.append(dirty - now)
        return max(0.05, min(due))

    def retry_dirty(self, everything: bool = False) -> None:
        for ns, name, _ in self.journal.dirty_claims(None if everything else time.time()):
            if self.stopping.is_set():
                return
            try:
                self.reconciler.reconcile(ns, name)
            except TransientError as exc:
                self.claim_retry(ns, name, exc)

    def resync(self) -> None:
        """Reconcile every tracked claim; on a transient error back off the whole pass."""
        self.metrics.resyncs.inc()
        started = time.time()
        try:
            for ns, name in self.journal.claims():
                if self.stopping.is_set():
                    return
                self.reconciler.reconcile(ns, name)
        except TransientError as exc:
            self.resync_failures += 1
            delay = backoff_delay(self.resync_failures, max(1.0, self.retry_base),
                                  max(self.resync_interval, self.retry_base))
            self.next_resync = time.time() + delay
            self.log.warning("resync failed, backing off", extra={"error": str(exc), "retry_in": round(delay, 3),
                                                                 "failures": self.resync_failures})
            return
        self.resync_failures = 0
        self.last_resync = time.time()
        self.next_resync = self.last_resync + self.resync_interval
        self.journal.prune()
        cutoff = min(started, self.last_ingest()) - limits.ORDER_HORIZON
        self.journal.prune_order_marks(cutoff)
        active = {f"{ns}/{name}" for ns, name in self.journal.claims()}
        self.writer.forget_inactive(active)
        self.reconciler.forget_inactive(active)
        self.forget_claims(active)
