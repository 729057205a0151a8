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

Each of these steps fails on its own: a step that raises (a spool on a
read-only disk, a journal that cannot be written) backs off by itself and is
logged at its first failures only, while the other steps go on. The loop
records a heartbeat after every iteration (and every claim of a long pass),
which liveness checks. All times here are node time (clock.node_seconds),
except `last_resync`, which is shown to people.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from . import limits, logs
from .clock import node_seconds, wall
from .health import Health
from .journal import Journal
from .kube import TransientError
from .reconciler import Reconciler
from .writer import Writer, backoff_delay


class Housekeeping:
    def __init__(self, journal: Journal, reconciler: Reconciler, writer: Writer, ingest: Callable[[], int],
                 forget_claims: Callable[[set[str]], None], metrics: Any, stopping: threading.Event,
                 resync_interval: float, spool_interval: float, retry_base: float, retry_cap: float,
                 last_ingest: Callable[[], float], health: Health | None = None) -> None:
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
        self.last_ingest = last_ingest  # node time of the last complete spool ingestion
        self.health = health or Health()
        self.log = logs.get()
        self.wake = threading.Event()
        self.last_resync = 0.0  # end of the last complete resync pass (wall time, for status)
        self.resync_failures = 0
        self.next_resync = 0.0  # node time
        self.steps: dict[str, StepState] = {}
        self._recovered = False  # the start-up retry of every dirty claim runs once per process
        self.requested = 0  # resyncs asked for (`netclaim-publisher resync`), done when last_resync moves

    def claim_retry(self, ns: str, name: str, exc: Exception) -> None:
        """A reconcile failed transiently: keep the claim dirty and retry it with backoff."""
        attempts = next((a for n_, m, a in self.journal.dirty_claims() if (n_, m) == (ns, name)), 0)
        delay = backoff_delay(attempts, self.retry_base, self.retry_cap)
        self.journal.retry_dirty(ns, name, node_seconds() + delay)
        if attempts in (0, 1, 3) or attempts % 10 == 0:
            self.log.warning("claim not reconciled, retrying", extra={
                "claim": f"{ns}/{name}", "error": str(exc), "retry_in": round(delay, 3), "attempt": attempts + 1})
        self.wake.set()

    def request_resync(self) -> None:
        self.next_resync = 0.0
        self.wake.set()

    def run(self) -> None:
        """The loop; only a bug outside the steps escapes to the supervisor (publisher/service.py)."""
        if not self._recovered:  # start-up: claims a crash left half-done (not again after a thread restart)
            self._recovered = True
            self._step("retries", lambda: self.retry_dirty(everything=True))
        if not self.next_resync:
            self.next_resync = node_seconds() + self.resync_interval
        while not self.stopping.is_set():
            self.health.beat("housekeeping")
            self.wake.wait(self._sleep())
            self.wake.clear()
            if self.stopping.is_set():
                return
            self._step("spool", self.ingest)
            self._step("checkpoint", self.journal.checkpoint)  # bounds the WAL; its fsyncs block no commit
            self._step("retries", self.retry_dirty)
            if node_seconds() >= self.next_resync:
                self._step("resync", self.resync)
            self._probe_journal()

    def _probe_journal(self) -> None:
        """Every pass, without backoff: a lock held by another process must show in health even
        while nothing needs a write, and clear as soon as writing works again. The journal
        records the outcome for health itself (Journal.writes)."""
        try:
            self.journal.probe()
        except Exception:  # noqa: BLE001 - reported through the journal's write state
            pass

    def _step(self, name: str, body: Callable[[], Any]) -> None:
        """Run one step unless it is backing off; a failure backs off this step only."""
        state = self.steps.setdefault(name, StepState())
        now = node_seconds()
        if now < state.next_try:
            return
        try:
            body()
        except Exception as exc:  # noqa: BLE001 - one failing step must not stop the others
            state.failures += 1
            delay = backoff_delay(state.failures, 1.0, limits.STEP_BACKOFF_CAP)
            state.next_try = now + delay
            state.error = str(exc) or type(exc).__name__
            if state.failures in (1, 2, 4) or state.failures % 16 == 0:
                self.log.warning("housekeeping step failed, backing off", extra={
                    "step": name, "error": state.error, "retry_in": round(delay, 3), "failures": state.failures})
            return
        if state.failures:
            self.log.info("housekeeping step works again", extra={"step": name, "failures": state.failures})
        state.failures, state.next_try, state.error = 0, 0.0, ""

    def _sleep(self) -> float:
        now = node_seconds()
        due = [self.spool_interval, self.next_resync - now]
        try:
            dirty = self.journal.next_dirty()
        except Exception:  # noqa: BLE001 - the retries step reports the journal's trouble
            dirty = None
        if dirty is not None:
            due.append(dirty - now)
        return max(0.05, min(due))

    def retry_dirty(self, everything: bool = False) -> None:
        for ns, name, _ in self.journal.dirty_claims(None if everything else node_seconds()):
            if self.stopping.is_set():
                return
            try:
                self.reconciler.reconcile(ns, name)
            except TransientError as exc:
                self.claim_retry(ns, name, exc)
            self.health.beat("housekeeping")

    def resync(self) -> None:
        """Reconcile every tracked claim; on a transient error back off the whole pass."""
        self.metrics.resyncs.inc()
        started = node_seconds()
        try:
            for ns, name in self.journal.claims():
                if self.stopping.is_set():
                    return
                self.reconciler.reconcile(ns, name)
                self.health.beat("housekeeping")
        except TransientError as exc:
            self.resync_failures += 1
            delay = backoff_delay(self.resync_failures, max(1.0, self.retry_base),
                                  max(self.resync_interval, self.retry_base))
            self.next_resync = node_seconds() + delay
            self.log.warning("resync failed, backing off", extra={"error": str(exc), "retry_in": round(delay, 3),
                                                                 "failures": self.resync_failures})
            return
        self.resync_failures = 0
        self.last_resync = wall()
        self.next_resync = node_seconds() + self.resync_interval
        self._step("prune", lambda: self._prune(started))

    def _prune(self, started: float) -> None:
        """After a complete pass: old finished events, order marks nothing older can reach, and
        the bookkeeping of claims no longer tracked."""
        self.journal.prune()
        cutoff = min(started, self.last_ingest()) - limits.ORDER_HORIZON
        self.journal.prune_order_marks(cutoff)
        active = {f"{ns}/{name}" for ns, name in self.journal.claims()}
        self.writer.forget_inactive(active)
        self.reconciler.forget_inactive(active)
        self.forget_claims(active)


@dataclass
class StepState:
    """Backoff of one housekeeping step."""

    failures: int = 0
    next_try: float = 0.0  # node time
    error: str = ""
