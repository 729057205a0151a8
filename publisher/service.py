"""The publisher service: wires the data flow together and keeps its threads alive.

    socket / spool ─▶ intake (publisher/intake.py) ─▶ journal (publisher/journal.py)
    journal ─▶ workers ─▶ per-verb rules (publisher/rules.py) ─▶ reconciler (publisher/reconciler.py,
    the only writer) ─▶ server-side apply (publisher/writer.py)
    housekeeping (publisher/resync.py): spool ingestion, dirty-claim retries, resync, pruning
    report (publisher/report.py): status, last error, Warning Events

Workers are sharded by containerID, so the events of one attachment are
handled by one thread in journal order; other sandboxes run in parallel.
Every thread runs under a supervisor that logs a crash, marks the thread
down (/readyz says so) and starts it again after a short delay.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from cni_plugin.wire import Event, list_spool

from . import limits, logs
from .events import EventRecorder
from .intake import Intake
from .journal import Journal, Pending, shard_key
from .kube import Kube, TransientError
from .metrics import Metrics
from .podcache import PodCache
from .reconciler import Reconciler
from .report import Reporter, event_fields
from .resolver import Resolver
from .resync import Housekeeping
from .rules import RuleSettings, Rules, result_hash  # noqa: F401  (result_hash: used by tools/tests)
from .writer import Writer


@dataclass
class Settings:
    node_name: str
    state_dir: str
    spool_dir: str
    workers: int = 4
    resolve_timeout: float = 120.0
    resync_interval: float = 300.0
    spool_interval: float = 5.0
    retry_base: float = 0.2
    retry_cap: float = 5.0
    emit_events: bool = True


class Service:
    def __init__(self, settings: Settings, kube: Kube, metrics: Metrics) -> None:
        self.settings = settings
        self.kube = kube
        self.metrics = metrics
        self.log = logs.get()
        self.stopping = threading.Event()
        self.journal = Journal(settings.state_dir)
        self.events = EventRecorder(kube, settings.node_name, lambda result: metrics.k8s_events.labels(result).inc(),
                                    enabled=settings.emit_events)
        self.report = Reporter(metrics, self.events)
        self.pods = PodCache(kube, settings.node_name, self.stopping)
        self.resolver = Resolver(kube, settings.node_name, self.pods)
        self.writer = Writer(kube, settings.node_name, self.stopping, metrics.apply_skips.inc,
                             settings.retry_base, settings.retry_cap,
                             applied=self.journal.applied_hashes(), remember=self.journal.set_applied)
        self.reconciler = Reconciler(kube, self.journal, self.writer, self.pods, settings.node_name, self.report)
        self._wake = [threading.Event() for _ in range(settings.workers)]
        self.intake = Intake(self.journal, settings.spool_dir, settings.node_name, self.report, self._notify)
        self.housekeeping = Housekeeping(
            self.journal, self.reconciler, self.writer, self.intake.ingest_spool, self.report.forget_claims,
            metrics, self.stopping, settings.resync_interval, settings.spool_interval, settings.retry_base,
            settings.retry_cap, lambda: self.intake.last_ingest)
        self.rules = Rules(self.journal, self.resolver, self.reconciler, self.report,
                           RuleSettings(settings.resolve_timeout, settings.retry_cap), self.housekeeping.claim_retry)
        self._threads: list[threading.Thread] = []
        self.down: dict[str, str] = {}  # thread name -> why it is being restarted
        self.started = False
        metrics.ready.set_function(lambda: 1.0 if self.ready()[0] else 0.0)
        metrics.credential_reloads.set_function(lambda: float(self.kube.health().reloads))
        metrics.unauthorized.set_function(lambda: float(self.kube.health().unauthorized))

    # ------------------------------------------------------------ intake (the socket server calls these)

    def submit(self, event: Event) -> tuple[bool, str]:
        return self.intake.submit(event)

    def ingest_spool(self) -> int:
        return self.intake.ingest_spool()

    def _notify(self, event: Event | None) -> None:
        if event is None:
            for w in self._wake:
                w.set()
        else:
            self._wake[shard_key(event.container_id) % len(self._wake)].set()

    @property
    def last_error(self) -> dict[str, Any] | None:
        return self.report.last_error

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        try:
            self.ingest_spool()
        except Exception:
            self.log.exception("spool ingestion at start failed")
        self.events.start()
        self.pods.start()
        for shard in range(self.settings.workers):
            self._spawn(f"worker-{shard}", lambda s=shard: self._worker(s))
        self._spawn("housekeeping", self.housekeeping.run)
        self.started = True

    def _spawn(self, name: str, body: Callable[[], None]) -> None:
        t = threading.Thread(target=self._supervise, args=(name, body), name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _supervise(self, name: str, body: Callable[[], None]) -> None:
        """Run `body` until stop; whatever it raises, log it, show it in /readyz, and start it again."""
        while not self.stopping.is_set():
            try:
                body()
                return
            except BaseException as exc:  # noqa: BLE001 - a node service must not lose a thread
                self.down[name] = f"{name} crashed: {type(exc).__name__}: {exc}"
                self.log.exception("thread crashed, restarting", extra={"component": name})
                if self.stopping.wait(limits.WORKER_RESTART_DELAY):
                    return
                self.down.pop(name, None)  # running again
        self.down.pop(name, None)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.housekeeping.wake.set()
        for w in self._wake:
            w.set()
        for t in self._threads:
            t.join(timeout)
        self.events.stop()
        self.journal.close()

    # ------------------------------------------------------------ workers

    def _worker(self, shard: int) -> None:
        n = self.settings.workers
        name = f"worker-{shard}"
        # A replay right after start would otherwise GET every pod the watch is
        # about to deliver anyway; wait a little for the first listing.
        self.pods.synced.wait(5.0)
        while not self.stopping.is_set():
            self._wake[shard].clear()
            try:
                batch = self.journal.ready(shard, n, time.time())
            except Exception as exc:
                self.intake.journal_error = f"journal not readable: {exc}"
                self.log.exception("journal read failed")
                self.stopping.wait(1.0)
                continue
            self.down.pop(name, None)
            if not batch:
                due = self.journal.next_due(shard, n)
                wait = 5.0 if due is None else max(0.0, min(5.0, due - time.time()))
                self._wake[shard].wait(wait)
                continue
            for pending in batch:
                if self.stopping.is_set():
                    return
                self._handle(pending)
            self._gauges()

    def _handle(self, pending: Pending) -> None:
        """One event; a failure is reported and the event kept or dropped, never the worker."""
        try:
            self.rules.process(pending)
            self.intake.journal_error = ""
        except TransientError:
            self.journal.reschedule(pending.seq, time.time() + 1.0, "API unavailable")
        except Exception as exc:  # a bug, or the journal failing: the event must not be lost
            self.log.exception("event handling failed", extra=event_fields(pending.event))
            try:
                self.journal.reschedule(pending.seq, time.time() + 5.0, f"internal error: {exc}")
                self.report.error(f"internal error: {exc}", pending.event)
            except Exception as jexc:
                self.intake.journal_error = f"journal not writable: {jexc}"
                self.stopping.wait(1.0)

    def _gauges(self) -> None:
        self.metrics.journal_depth.set(self.journal.depth())
        self.metrics.attachments.set(self.journal.attachment_count())

    def request_resync(self) -> None:
        """Resync as soon as the housekeeping thread wakes (`netclaim-publisher resync`)."""
        self.housekeeping.request_resync()

    # ------------------------------------------------------------ health and status

    def ready(self) -> tuple[bool, str]:
        if not self.started:
            return False, "starting"
        if self.stopping.is_set():
            return False, "stopping"
        if self.down:
            return False, "; ".join(sorted(self.down.values()))
        if self.intake.journal_error:
            return False, self.intake.journal_error
        api = self.kube.health()
        if api.unauthorized >= limits.UNAUTHORIZED_NOT_READY:
            return False, f"API refuses the credentials: {api.unauthorized} consecutive 401s"
        if api.failing_since and time.time() - api.failing_since > limits.API_DOWN_NOT_READY:
            return False, f"API unreachable for {time.time() - api.failing_since:.0f}s: {api.last_error}"
        return True, ""

    def spool_files(self) -> int:
        return len(list_spool(self.settings.spool_dir))

    def brief_status(self) -> dict[str, Any]:
        """The counters a poll for quiescence needs, cheap enough to ask every few ms."""
        depth, spooled, dirty = self.journal.depth(), self.spool_files(), self.journal.dirty_count()
        return {"node": self.settings.node_name, "journal_depth": depth, "spool_files": spooled,
                "dirty_claims": dirty, "quiescent": depth == 0 and spooled == 0 and dirty == 0,
                "last_resync": self.housekeeping.last_resync or None,
                "resync_failures": self.housekeeping.resync_failures}

    def status(self, brief: bool = False) -> dict[str, Any]:
        if brief:
            return self.brief_status()
        claims = self.report.claims()
        for ns, name in self.journal.claims():
            claims.setdefault(f"{ns}/{name}", {"state": "pending", "error": "", "devices": [], "updated": None})
        total = len(claims)
        if total > limits.STATUS_MAX_CLAIMS:  # keep the answer well inside one frame: errors first
            keys = sorted(claims, key=lambda k: (claims[k]["state"] == "published", k))[: limits.STATUS_MAX_CLAIMS]
            claims = {k: claims[k] for k in sorted(keys)}
        ready, why = self.ready()
        depth, spooled, dirty = self.journal.depth(), self.spool_files(), self.journal.dirty_count()
        tombstones, fences = self.journal.order_marks()
        api = self.kube.health()
        hk = self.housekeeping
        return {
            "claims_total": total,
            "node": self.settings.node_name,
            "ready": ready,
            "not_ready_reason": why,
            "journal_depth": depth,
            "spool_files": spooled,
            "dirty_claims": dirty,
            "quiescent": depth == 0 and spooled == 0 and dirty == 0,
            "last_resync": hk.last_resync or None,
            "resync_failures": hk.resync_failures,
            "last_spool_ingest": self.intake.last_ingest or None,
            "oldest_pending": self.journal.oldest_pending(),
            "attachments": self.journal.attachment_count(),
            "tombstones": tombstones,
            "gc_fences": fences,
            "last_error": self.report.last_error,
            "failed_events": self.journal.failed(),
            "credentials": {"unauthorized_total": api.unauthorized_total, "unauthorized_consecutive": api.unauthorized,
                            "reloads": api.reloads, "last_reload": api.last_reload or None},
            "spool_overflow": dict(self.intake.overflow),
            "threads_down": dict(self.down),
            "pid": os.getpid(),
            "claims": claims,
        }
