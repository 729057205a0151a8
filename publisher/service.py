"""The publisher service: wires the data flow together and keeps its threads alive.

    socket / spool ─▶ intake (publisher/intake/spool.py) ─▶ journal (publisher/journal/store.py)
    journal ─▶ workers ─▶ per-verb rules (publisher/reconcile/rules.py) ─▶ reconciler (publisher/reconcile/reconciler.py,
    the only writer) ─▶ server-side apply (publisher/reconcile/writer.py)
    claim windows (publisher/repair/claimwatch.py): resolve by a watch that stays open after the apply
    housekeeping (publisher/repair/resync.py): spool ingestion, dirty-claim retries, safety net, pruning
    report (publisher/observe/report.py): status, last error, Warning Events
    live watch (publisher/live/watcher.py): each entry follows its interface in the pod's netns

Workers are sharded by containerID, so the events of one attachment are
handled by one thread in journal order; other sandboxes run in parallel.
Every thread runs under a supervisor that logs a crash, marks the thread
down (/readyz says so) and starts it again after a short delay; past its
restart budget liveness fails too. Loops record heartbeats and parts record
faults in `health` (publisher/observe/health.py), which the probes read without
touching the journal.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from cni_plugin.wire.event import Event

from publisher import limits
from publisher import logs
from publisher.clock import node_seconds
from publisher.repair.claimwatch import ClaimWindows
from publisher.observe.events import EventRecorder, node_ref
from publisher.observe.health import Health
from publisher.intake.spool import Intake
from publisher.live.watcher import LiveSettings, LiveWatch
from publisher.nsopen.access import NetnsAccess
from publisher.journal.store import Journal, Pending, shard_key
from publisher.kube.calls import Kube, TransientError
from publisher.reconcile.writer import backoff_delay
from publisher.observe.metrics import Metrics
from publisher.observe.nodelease import KeeperWatch, LeaseSettings, NodeLease, Sources
from publisher.reconcile.podcache import PodCache
from publisher.reconcile.reconciler import Reconciler
from publisher.observe.report import Reporter, event_fields
from publisher.reconcile.resolver import Resolver
from publisher.reconcile.slices import DEFAULT_DEVICE_ID_ATTRIBUTES, SliceFacts
from publisher.repair.rebuild import Rebuilt, rebuild
from publisher.repair.resync import Housekeeping
from publisher.repair.safetynet import SafetyNet
from publisher.reconcile.rules import RuleSettings, Rules, result_hash  # noqa: F401  (result_hash: used by tools/tests)
from publisher.repair.unchained import UnchainedPods
from publisher.reconcile.writer import Writer


@dataclass
class Settings:
    node_name: str
    state_dir: str
    spool_dir: str
    workers: int = 4
    resolve_timeout: float = 120.0
    sibling_hold: float = limits.SIBLING_HOLD  # publisher/reconcile/rules.py Rules._hold
    verify_after: float = 86400.0  # safety net: each claim verified after this + uniform[0, spread] s
    verify_spread: float = 43200.0
    claim_window: float = 0.0  # seconds a claim stays watched after netclaim's apply (0, the default: no watch)
    max_claim_windows: int = 32
    spool_interval: float = 5.0
    retry_base: float = 0.2
    retry_cap: float = 5.0
    emit_events: bool = True
    driver_names: tuple[str, ...] = ()  # netclaim's drivers: pods started while unchained are reported
    drivers_file: str = ""  # more of them, one `DRIVER CONFLIST` line each, as scripts/install.sh records them
    unchained_grace: float = 30.0
    durable_commits: bool = False  # fsync every journal commit (publisher/journal/durability.py decides)
    live_watch: bool = True  # follow each attachment's interface in its netns (publisher/live/)
    live_added_addresses: tuple[str, ...] = ()  # CNI networks whose gained addresses the watch publishes
    netns: NetnsAccess = field(default_factory=NetnsAccess)  # the netns dirs it may open, and the opener if any
    # Slice attributes an event's device ID is matched against (publisher/reconcile/slices.py).
    device_id_attributes: tuple[str, ...] = DEFAULT_DEVICE_ID_ATTRIBUTES
    # The node's heartbeat Lease for `netclaim-publisher fleet` (publisher/observe/nodelease.py); None: off.
    node_lease: LeaseSettings | None = None


class Service:
    def __init__(self, settings: Settings, kube: Kube, metrics: Metrics) -> None:
        self.settings = settings
        self.kube = kube
        self.metrics = metrics
        self.log = logs.get()
        self.stopping = threading.Event()
        self.health = Health()
        self.journal = Journal(settings.state_dir, on_fault=lambda why: self.health.fault("journal", why),
                               on_recover=lambda: self.health.clear("journal"),
                               durable_commits=settings.durable_commits)
        metrics.boot_retired.inc(self.journal.retired_attachments)
        self.health.checks.append(self.journal.wedged)
        self.events = EventRecorder(kube, settings.node_name, lambda result: metrics.k8s_events.labels(result).inc(),
                                    enabled=settings.emit_events)
        self.report = Reporter(metrics, self.events)
        self.pods = PodCache(kube, settings.node_name, self.stopping)
        self.unchained = UnchainedPods(kube, settings.driver_names, self.events.warn, self._attached_pods,
                                       self.journal.oldest_received, metrics, settings.unchained_grace,
                                       settings.drivers_file)
        self.pods.observers.append(self.unchained.observe)
        self.writer = Writer(kube, settings.node_name, self.stopping, metrics.apply_skips.inc,
                             settings.retry_base, settings.retry_cap,
                             applied=self.journal.applied_hashes(), remember=self.journal.set_applied)
        self.safety = SafetyNet(settings.verify_after, settings.verify_spread)
        self.windows = ClaimWindows(kube, self.writer.field_manager, self._drifted, self.stopping,
                                    settings.claim_window, settings.max_claim_windows,
                                    on_gauge=metrics.claim_windows.set)
        slices = SliceFacts(kube, settings.node_name, settings.device_id_attributes)
        self.resolver = Resolver(kube, settings.node_name, self.pods, self.windows, slices)
        self.reconciler = Reconciler(kube, self.journal, self.writer, self.pods, settings.node_name, self.report,
                                     windows=self.windows, verified=self.safety.verified, slices=slices)
        self.reconciler.covered = self.unchained.covered
        self._wake = [threading.Event() for _ in range(settings.workers)]
        self.intake = Intake(self.journal, settings.spool_dir, settings.node_name, self.report, self._notify,
                             self.health)
        self.housekeeping = Housekeeping(
            self.journal, self.reconciler, self.writer, self.intake.ingest_spool, self.report.forget_claims,
            metrics, self.stopping, self.safety, settings.spool_interval, settings.retry_base,
            settings.retry_cap, lambda: self.intake.last_ingest, self.health, self.windows)
        self.pods.observers.append(self.housekeeping.pod_seen)
        self.live_watch = LiveWatch(self.journal, metrics, self.housekeeping.wake.set, self.stopping,
                              LiveSettings(enabled=settings.live_watch,
                                           report_added=frozenset(settings.live_added_addresses), netns=settings.netns))
        self.rules = Rules(self.journal, self.resolver, self.reconciler, self.report,
                           RuleSettings(settings.resolve_timeout, settings.retry_cap, settings.sibling_hold), self.housekeeping.claim_retry,
                           held=self.housekeeping.held)
        self.node_lease = self._node_lease(settings.node_lease)
        # A newer journal set aside at open: workers and housekeeping wait for the rebuild.
        self.rebuilt: Rebuilt | None = None
        self.rebuild_error = ""
        self.rebuilding = bool(self.journal.opening.set_aside)
        self._threads: list[threading.Thread] = []
        self.down: dict[str, str] = {}  # thread name -> why it is being restarted
        self.started = False
        metrics.ready.set_function(lambda: 1.0 if self.ready()[0] else 0.0)
        metrics.credential_reloads.read_from(lambda: float(self.kube.health().reloads))
        metrics.unauthorized.set_function(lambda: float(self.kube.health().unauthorized))

    def _drifted(self, ns: str, name: str, why: str) -> None:
        self.housekeeping.drifted(ns, name, why)

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
        except Exception as exc:  # the journal reports itself; housekeeping tries again
            self.log.error("spool ingestion at start failed", extra={"error": str(exc)})
        self.events.start()
        self.pods.start()
        if self.journal.opening.set_aside:
            self._spawn("journal-rebuild", self._rebuild)
        else:
            self._rolled_back()
            self._start_work()
        self._spawn("live-watch", self.live_watch.run)
        if self.unchained.enabled:
            self._spawn("unchained", lambda: self.unchained.run(self.stopping))
        if self.node_lease is not None:
            self._spawn("node-lease", self.node_lease.run)
        self.started = True

    def _start_work(self) -> None:
        for shard in range(self.settings.workers):
            self._spawn(f"worker-{shard}", lambda s=shard: self._worker(s))
        self._spawn("housekeeping", self.housekeeping.run)

    def _rebuild(self) -> None:
        """After a set-aside: rebuild the node's attachments from the live cluster
        (publisher/repair/rebuild.py), then start the workers and housekeeping, whose start-up
        reconcile applies the outcome. Tried again while the API does not answer; a rebuild
        that fails otherwise is logged and the work starts without it (the entries of the
        set-aside journal's sandboxes are then not tracked, as after a journal moved by hand)."""
        failures = 0
        while not self.stopping.is_set():
            try:
                self.rebuilt = rebuild(self.kube, self.journal, self.settings.node_name,
                                       self.writer.field_manager, self.journal.opening.set_aside)
                self.rebuild_error = ""
                break
            except TransientError as exc:
                failures += 1
                self.rebuild_error = str(exc) or type(exc).__name__
                if failures in (1, 2, 4) or failures % 16 == 0:
                    self.log.warning("journal rebuild: API not answering, retrying",
                                     extra={"error": self.rebuild_error, "failures": failures})
                self.stopping.wait(backoff_delay(failures, 1.0, limits.STEP_BACKOFF_CAP))
            except Exception as exc:  # a rebuild that cannot work must not stop publishing
                self.rebuild_error = f"{type(exc).__name__}: {exc}"
                self.log.exception("journal rebuild failed, starting without it")
                break
        if self.stopping.is_set():
            return
        self.rebuilding = False
        self._rolled_back()
        self._start_work()

    def journal_event(self) -> str:
        """What opening the journal found and did, for people ('' when it was an ordinary open)."""
        opening = self.journal.opening
        note = opening.note()
        if note and opening.set_aside:
            done = self.rebuilt.text() if self.rebuilt else (
                f"rebuild not done: {self.rebuild_error}" if self.rebuild_error else "rebuild pending")
            note = f"{note}: {done}"
        return note

    def _rolled_back(self) -> None:
        """One Warning on the Node when the journal was another release's (a rollback)."""
        note = self.journal_event()
        if note:
            self.events.warn(node_ref(self.settings.node_name), "RolledBack", note,
                             fields={"journal_event": self.journal.opening.event})

    def _node_lease(self, cfg: LeaseSettings | None) -> NodeLease | None:
        """The heartbeat reads each part of its state where that part lives (nothing is kept twice)."""
        if cfg is None:
            return None
        sources = Sources(
            journal_depth=self.journal.depth, oldest_journaled_age=self.oldest_pending_age,
            spool_times=self.intake.spooled_times, claims=self.journal.claim_count,
            attachments=self.journal.attachment_count, claim_states=self.report.claims,
            pods_unchained=lambda: self.unchained.flagged() if self.unchained.enabled else 0,
            ready=self.ready, keeper=KeeperWatch(cfg.keeper, min(limits.KEEPER_SILENT_GRACE, cfg.period)))
        return NodeLease(self.kube, cfg, sources, self.metrics.node_lease_failures.inc, self.stopping)

    def _spawn(self, name: str, body: Callable[[], None]) -> None:
        if name == "housekeeping" or name.startswith("worker-"):
            self.health.beat(name)  # a loop that never completes its first iteration counts too
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
                # /readyz names the thread and the error's type; its text (maybe an API answer) is logged.
                self.health.fault(f"thread:{name}", f"{name} crashed: {type(exc).__name__}")
                crashes = self.health.crashed(name)
                self.log.exception("thread crashed, restarting", extra={"component": name, "crashes": crashes})
                if self.stopping.wait(limits.WORKER_RESTART_DELAY):
                    return
                self.down.pop(name, None)  # running again
                self.health.clear(f"thread:{name}")
                if name in self.health.beats:
                    self.health.beat(name)
        self.down.pop(name, None)
        self.health.clear(f"thread:{name}")

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.windows.close_all()
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
        read_failed = False
        while not self.stopping.is_set():
            self.health.beat(name)
            self._wake[shard].clear()
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
                self._wake[shard].wait(wait)
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
        for claim, hold in self.rules.ended_holds(shard, self.settings.workers):
            try:
                self.rules.apply_held(claim, hold)
            except Exception:  # the mark stays: housekeeping retries the claim
                self.log.exception("held claim not applied", extra={"component": name, "claim": claim})
            self.health.beat(name)

    def _attached_pods(self) -> set[str]:
        """Pod UIDs with an attachment in the journal (publisher/repair/unchained.py asks only for suspects)."""
        return {a.pod_uid for a in self.journal.all_attachments()}

    def _handle(self, pending: Pending) -> None:
        """One event; a failure is reported and the event kept or dropped, never the worker."""
        event = pending.event
        if event.op in ("ADD", "CHECK") and event.pod is not None:
            self.unchained.saw_add(event.pod.uid, event.pod.namespace, event.pod.name)
        try:
            self.rules.process(pending)
            self.health.clear("journal")  # the event's outcome was committed: the journal works
            self.live_watch.attachments_changed()
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

    def request_resync(self) -> None:
        """Resync as soon as the housekeeping thread wakes (`netclaim-publisher resync`)."""
        self.housekeeping.request_resync()

    # ------------------------------------------------------------ health and status

    def ready(self) -> tuple[bool, str]:
        """Readiness (/readyz): every fault, the component first; never reads the journal."""
        if not self.started:
            return False, "starting"
        if self.rebuilding:
            return False, "journal: rebuilding this node's attachments from the API"
        if self.stopping.is_set():
            return False, "stopping"
        ok, why = self.health.readiness()
        reasons = [why] if why else []
        api = self.kube.health()
        if api.unauthorized >= limits.UNAUTHORIZED_NOT_READY:
            reasons.append(f"credentials: the API refuses them: {api.unauthorized} consecutive 401s")
        down = node_seconds() - api.failing_since if api.failing_since else 0.0
        if down > limits.API_DOWN_NOT_READY:  # the reason's class only: the error itself is in the log
            reasons.append(f"api: failing for {down:.0f}s: {api.last_reason}")
        if not reasons and self.live_watch.disabled:  # degraded, not unready: entries keep what the ADD said
            return True, f"ok (live interface watch off: {self.live_watch.disabled})"
        return (not reasons), "; ".join(reasons)

    def live(self) -> tuple[bool, str]:
        """Liveness (/healthz): False only when a restart is the cure (see publisher/observe/health.py)."""
        if not self.started or self.stopping.is_set():
            return True, ""
        return self.health.liveness()

    def oldest_pending_age(self) -> float | None:
        """Seconds the oldest pending journal event has waited (node time), or None."""
        received = self.journal.oldest_received()
        return None if received is None else max(0.0, node_seconds() - received)

    def spool_files(self) -> int:
        return len(self.intake.pending_files())

    def _counters(self) -> dict[str, Any]:
        depth, spooled, dirty = self.journal.depth(), self.spool_files(), self.journal.dirty_count()
        live = self.live_watch.busy()
        return {"node": self.settings.node_name, "journal_depth": depth, "spool_files": spooled,
                "spool_stuck_files": len(self.intake.stuck), "dirty_claims": dirty, "interface_changes_pending": live,
                "quiescent": depth == 0 and spooled == 0 and dirty == 0 and live == 0,
                "last_resync": self.housekeeping.last_resync or None,
                "resync_failures": self.housekeeping.resync_failures}

    def brief_status(self) -> dict[str, Any]:
        """The counters a poll for quiescence needs, cheap enough to ask every few ms."""
        return self._counters()

    def status(self, brief: bool = False) -> dict[str, Any]:
        if brief:
            return self.brief_status()
        # Counters first: a claim's state is told before the journal calls it clean, so a
        # quiescent answer never carries a claim still shown as pending.
        counters = self._counters()
        claims = self.report.claims()
        dirty = {f"{ns}/{name}" for ns, name, _ in self.journal.dirty_claims()} if counters["dirty_claims"] else set()
        for ns, name in self.journal.claims():
            key = f"{ns}/{name}"
            # Not told since this process started: a claim an earlier run applied (its body's hash
            # is journaled) and nothing changed since is published, not waiting for anything.
            state = "published" if key not in dirty and self.writer.last_digest(key) is not None else "pending"
            claims.setdefault(key, {"state": state, "error": "", "devices": [], "updated": None})
        total = len(claims)
        if total > limits.STATUS_MAX_CLAIMS:  # keep the answer well inside one frame: errors first
            keys = sorted(claims, key=lambda k: (claims[k]["state"] == "published", k))[: limits.STATUS_MAX_CLAIMS]
            claims = {k: claims[k] for k in sorted(keys)}
        ready, why = self.ready()
        live, dead_why = self.live()
        tombstones, fences = self.journal.order_marks()
        api = self.kube.health()
        return {
            **counters,
            "claims_total": total,
            "ready": ready,
            "not_ready_reason": why,
            "live": live,
            "not_live_reason": dead_why,
            "last_spool_ingest": self.intake.last_ingest_wall or None,
            "oldest_pending": self.journal.oldest_pending(),
            "attachments": self.journal.attachment_count(),
            "tombstones": tombstones,
            "gc_fences": fences,
            "last_error": self.report.last_error,
            "failed_events": self.journal.failed(),
            "credentials": {"unauthorized_total": api.unauthorized_total, "unauthorized_consecutive": api.unauthorized,
                            "reloads": api.reloads, "last_reload": api.last_reload or None},
            "spool_overflow": dict(self.intake.overflow),
            "live_watch": self.live_watch.state(),
            "unchained_check": self.unchained.state(),
            "journal_schema": {**self.journal.opening.status(), "note": self.journal_event() or None},
            "threads_down": dict(self.down),
            "housekeeping_steps": {k: {"failures": v.failures, "error": v.error}
                                   for k, v in self.housekeeping.steps.items() if v.failures},
            "pid": os.getpid(),
            "claims": claims,
        }
