"""The publisher service: wires the data flow together and keeps its threads alive.

    socket / spool ─▶ intake (publisher/intake/spool.py) ─▶ journal (publisher/journal/store.py)
    journal ─▶ workers (publisher/reconcile/workers.py) ─▶ per-verb rules (publisher/reconcile/rules.py)
    ─▶ reconciler (publisher/reconcile/reconciler.py, the only writer)
    ─▶ server-side apply (publisher/reconcile/writer.py)
    claim windows (publisher/repair/claimwatch.py): resolve by a watch that stays open after the apply
    housekeeping (publisher/repair/resync.py): spool ingestion, dirty-claim retries, safety net, pruning
    report (publisher/observe/report.py): status, last error, Warning Events
    live watch (publisher/live/watcher.py): each entry follows its interface in the pod's netns

Workers are sharded by containerID, so the events of one attachment are
handled by one thread in journal order; other sandboxes run in parallel.
Each part takes its neighbours by keyword at construction, as the Protocols
its module declares, and nothing is patched in afterwards. Every thread runs
under a supervisor that logs a crash, marks the thread down (/readyz says so)
and starts it again after a short delay; past its restart budget liveness
fails too. Loops record heartbeats and parts record faults in `health`
(publisher/observe/health.py), which the probes read without touching the journal.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from cni_plugin.wire.event import Event
from publisher import limits, logs
from publisher.clock import backoff_delay, node_seconds
from publisher.intake.spool import Intake
from publisher.journal.store import Journal
from publisher.kube.calls import Kube, TransientError
from publisher.live.watcher import LiveSettings, LiveWatch
from publisher.nsopen.access import NetnsAccess
from publisher.observe.events import EventRecorder, node_ref
from publisher.observe.health import Health
from publisher.observe.metrics import Metrics
from publisher.observe.nodelease import KeeperWatch, LeaseSettings, NodeLease, Sources
from publisher.observe.report import Reporter
from publisher.reconcile.podcache import PodCache
from publisher.reconcile.reconciler import Reconciler
from publisher.reconcile.resolver import Resolver
from publisher.reconcile.rules import Rules, RuleSettings, result_hash  # noqa: F401  (result_hash: used by tools/tests)
from publisher.reconcile.slices import DEFAULT_DEVICE_ID_ATTRIBUTES, SliceFacts
from publisher.reconcile.workers import ShardWake, Workers
from publisher.reconcile.writer import Writer
from publisher.repair.claimwatch import ClaimWindows
from publisher.repair.rebuild import Rebuilt, rebuild
from publisher.repair.resync import DeletedPods, Housekeeping, RetrySettings
from publisher.repair.safetynet import SafetyNet
from publisher.repair.unchained import UnchainedPods


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
    # A device several pods use lists them all in its entry's data (publisher/reconcile/sharing.py).
    shared_attachments: bool = False
    # The node's heartbeat Lease for `netclaim-publisher fleet` (publisher/observe/nodelease.py); None: off.
    node_lease: LeaseSettings | None = None


class SocketFactory(Protocol):
    """Builds the plugin's socket server (publisher/intake/server.py SocketServer) around the service's
    intake, so its accept loop is one of the service's liveness checks from the start."""

    def __call__(self, *, submit: Callable[[Event], tuple[bool, str]], status: Callable[..., dict[str, Any]],
                 resync: Callable[[], None]) -> Served: ...


class Served(Protocol):
    """The socket server as the service and `netclaim-publisher run` use it."""

    def serving(self) -> str: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class NoSocket:
    """The server of a service built without a socket (tests, tools): serves nothing, never fails."""

    def serving(self) -> str:
        return ""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class Service:
    """The publisher's parts, wired once at construction (nothing is patched in afterwards), and their threads.

    `socket`, when given, builds the plugin's socket server (`server`, started by its caller): its
    accept loop is one of the liveness checks. The backlog gauges (spool depth, oldest pending age) are wired here too.
    """

    def __init__(self, settings: Settings, kube: Kube, metrics: Metrics, *,
                 socket: SocketFactory | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.metrics = metrics
        self.log = logs.get()
        self.stopping = threading.Event()
        self.down: dict[str, str] = {}  # thread name -> why it is being restarted
        self.server: Served = (socket(submit=self.submit, status=self.status, resync=self.request_resync)
                               if socket else NoSocket())
        self.health = Health(checks=(self._journal_wedged, self.server.serving))
        self.journal = Journal(settings.state_dir, on_fault=self._journal_fault, on_recover=self._journal_recovered,
                               durable_commits=settings.durable_commits)
        metrics.boot_retired.inc(self.journal.retired_attachments)
        self.events = EventRecorder(kube, settings.node_name, lambda result: metrics.k8s_events.labels(result).inc(),
                                    enabled=settings.emit_events)
        self.report = Reporter(metrics, self.events)
        self.shards = ShardWake(settings.workers)
        housekeeping_wake = threading.Event()
        self.unchained = UnchainedPods(kube=kube, drivers=settings.driver_names, events=self.events,
                                       journal=self.journal, metrics=metrics, grace=settings.unchained_grace,
                                       drivers_file=settings.drivers_file)
        deleted = DeletedPods(wake=housekeeping_wake)
        self.pods = PodCache(kube=kube, node_name=settings.node_name, stopping=self.stopping,
                             observers=(self.unchained.observe, deleted))
        self.writer = Writer(kube=kube, node_name=settings.node_name, stopping=self.stopping,
                             on_skip=metrics.apply_skips.inc, backoff_base=settings.retry_base,
                             backoff_cap=settings.retry_cap, applied=self.journal.applied_hashes(),
                             remember=self.journal.set_applied)
        self.safety = SafetyNet(settings.verify_after, settings.verify_spread)
        self.windows = ClaimWindows(kube=kube, field_manager=self.writer.field_manager, on_drift=self._drifted,
                                    stopping=self.stopping, window=settings.claim_window,
                                    max_open=settings.max_claim_windows, on_gauge=metrics.claim_windows.set)
        slices = SliceFacts(kube, settings.node_name, settings.device_id_attributes)
        self.resolver = Resolver(kube, settings.node_name, self.pods, self.windows, slices)
        self.reconciler = Reconciler(kube=kube, journal=self.journal, writer=self.writer, pods=self.pods,
                                     node=settings.node_name, reporter=self.report, windows=self.windows,
                                     verified=self.safety.verified, slices=slices, covered=self.unchained.covered,
                                     shared_attachments=settings.shared_attachments)
        self.intake = Intake(journal=self.journal, spool_dir=settings.spool_dir, node=settings.node_name,
                             reporter=self.report, workers=self.shards, health=self.health)
        self.housekeeping = Housekeeping(
            journal=self.journal, reconciler=self.reconciler, writer=self.writer, spool=self.intake,
            reports=self.report, metrics=metrics, stopping=self.stopping, safety=self.safety,
            settings=RetrySettings(settings.spool_interval, settings.retry_base, settings.retry_cap),
            health=self.health, windows=self.windows, wake=housekeeping_wake, deleted=deleted)
        self.live_watch = LiveWatch(journal=self.journal, metrics=metrics, changed=housekeeping_wake,
                                    stopping=self.stopping,
                                    settings=LiveSettings(enabled=settings.live_watch,
                                                          report_added=frozenset(settings.live_added_addresses),
                                                          netns=settings.netns))
        self.rules = Rules(journal=self.journal, resolver=self.resolver, reconciler=self.reconciler,
                           reporter=self.report,
                           settings=RuleSettings(settings.resolve_timeout, settings.retry_cap, settings.sibling_hold),
                           retries=self.housekeeping)
        self.workers = Workers(journal=self.journal, rules=self.rules, health=self.health, report=self.report,
                               unchained=self.unchained, live=self.live_watch, pods=self.pods, metrics=metrics,
                               wake=self.shards, stopping=self.stopping, down=self.down)
        self.node_lease = self._node_lease(settings.node_lease)
        # A newer journal set aside at open: workers and housekeeping wait for the rebuild.
        self.rebuilt: Rebuilt | None = None
        self.rebuild_error = ""
        self.rebuilding = bool(self.journal.opening.set_aside)
        self._threads: list[threading.Thread] = []
        self.started = False
        metrics.ready.set_function(lambda: 1.0 if self.ready()[0] else 0.0)
        metrics.credential_reloads.read_from(lambda: float(self.kube.health().reloads))
        metrics.unauthorized.set_function(lambda: float(self.kube.health().unauthorized))
        metrics.watch_backlog(settings.spool_dir, self.oldest_pending_age, self.intake.spooled_times)

    def _journal_wedged(self) -> str:
        """A liveness check: the journal's writes stuck or failing too long (publisher/journal/store.py)."""
        return self.journal.wedged()

    def _journal_fault(self, why: str) -> None:
        self.health.fault("journal", why)

    def _journal_recovered(self) -> None:
        self.health.clear("journal")

    def _drifted(self, ns: str, name: str, why: str) -> None:
        self.housekeeping.drifted(ns, name, why)

    # ------------------------------------------------------------ intake (the socket server calls these)

    def submit(self, event: Event) -> tuple[bool, str]:
        return self.intake.submit(event)

    def ingest_spool(self) -> int:
        return self.intake.ingest_spool()

    @property
    def last_error(self) -> dict[str, Any] | None:
        return self.report.last_error

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        try:
            self.ingest_spool()
        except Exception as exc:  # noqa: BLE001 - the journal reports itself; housekeeping tries again
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
        for shard in range(self.workers.shards):
            self._spawn(Workers.name(shard), functools.partial(self.workers.run, shard))
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
            except BaseException as exc:
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
        self.shards.wake_all()
        for t in self._threads:
            t.join(timeout)
        self.events.stop()
        self.journal.close()

    # ------------------------------------------------------------ commands

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
