"""Housekeeping: spool ingestion, retries of dirty claims, the safety net, pruning.

One thread. Every `spool_interval` it ingests the spool. Claims marked dirty are
reconciled when due: at once when something says the claim may have drifted (a claim
window saw a change, publisher/repair/claimwatch.py; the pod watch saw an attached pod
deleted; the live watch saw an interface change), unless the mark is already due later (a
sibling hold, a backoff and its Retry-After floor: publisher/journal/store.py _mark_dirty);
with capped exponential backoff and jitter when their last reconcile failed transiently
(no answer, a lost answer, 429, 5xx: the server may or may not have applied, so the claim
is read again and applied again). That is what repairs drift and lost applies, without any
periodic pass.

The safety net (publisher/repair/safetynet.py) verifies each tracked claim once per
`verify_after` + uniform[0, `verify_spread`] seconds (one GET, an apply only when the
status differs), a few claims at a time. Pruning (old events, tombstones and GC fences
nothing older can reach, the bookkeeping of claims no longer tracked) runs every
PRUNE_INTERVAL on its own and costs no API request.

Each of these steps fails on its own: a step that raises (a spool on a
read-only disk, a journal that cannot be written) backs off by itself and is
logged at its first failures only, while the other steps go on. The loop
records a heartbeat after every iteration (and every claim it reconciles),
which liveness checks. All times here are node time (clock.node_seconds),
except `last_resync`, which is shown to people.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from publisher import limits, logs
from publisher.clock import backoff_delay, node_seconds, wall
from publisher.journal.store import Journal
from publisher.kube.calls import TransientError
from publisher.observe.health import Health
from publisher.repair.safetynet import SafetyNet

PRUNE_INTERVAL = 60.0  # seconds between prune steps (no API request; bounded SQLite work)


class ClaimReconciler(Protocol):
    """The only writer (publisher/reconcile/reconciler.py Reconciler): reconciles one claim."""

    def reconcile(self, ns: str, name: str, *, purpose: str = ...) -> bool: ...

    def forget_inactive(self, active: set[str]) -> None: ...


class AppliedMemory(Protocol):
    """What the apply path remembers per claim (publisher/reconcile/writer.py Writer)."""

    def forget_inactive(self, active: set[str]) -> object: ...


class SpoolIntake(Protocol):
    """The spool's reader (publisher/intake/spool.py Intake)."""

    @property
    def last_ingest(self) -> float: ...  # node time the spool was last read to the end

    def ingest_spool(self) -> int: ...


class ClaimReports(Protocol):
    """The claims' states told to people (publisher/observe/report.py Reporter)."""

    def forget_claims(self, active: set[str]) -> None: ...


class Windows(Protocol):
    """The claim windows (publisher/repair/claimwatch.py ClaimWindows), swept here so expired ones close."""

    def next_deadline(self) -> float | None: ...

    def sweep(self) -> None: ...


@dataclass(frozen=True)
class RetrySettings:
    """How often housekeeping reads the spool, and the backoff of a claim's retries (seconds)."""

    spool_interval: float = 5.0
    retry_base: float = 0.2
    retry_cap: float = 5.0


class DeletedPods:
    """The pods the pod watch saw deleted, not looked up yet: a pod watch observer.

    Its own part, built before the pod watch (publisher/reconcile/podcache.py PodCache)
    that tells it and before the housekeeping that looks the pods' claims up, so that
    neither is patched after it is built. Telling it wakes housekeeping.
    """

    def __init__(self, *, wake: threading.Event) -> None:
        self.wake = wake
        self._uids: set[str] = set()
        self._guard = threading.Lock()

    def __call__(self, pod: Any, namespace: str, name: str, uid: str = "") -> None:
        """Pod watch observer (O(1), never blocks): a deleted pod's claims are looked up by the loop."""
        if pod is None and uid:
            with self._guard:
                self._uids.add(uid)
            self.wake.set()

    def take(self) -> set[str]:
        with self._guard:
            uids, self._uids = self._uids, set()
        return uids

    def put_back(self, uids: set[str]) -> None:
        with self._guard:
            self._uids |= uids


class Housekeeping:
    def __init__(self, *, journal: Journal, reconciler: ClaimReconciler, writer: AppliedMemory, spool: SpoolIntake,
                 reports: ClaimReports, metrics: Any, stopping: threading.Event, safety: SafetyNet,
                 settings: RetrySettings = RetrySettings(), health: Health | None = None,
                 windows: Windows | None = None, wake: threading.Event | None = None,
                 deleted: DeletedPods | None = None) -> None:
        self.journal = journal
        self.reconciler = reconciler
        self.writer = writer
        self.spool = spool
        self.reports = reports
        self.metrics = metrics
        self.stopping = stopping
        self.safety = safety
        self.windows = windows  # publisher/repair/claimwatch.py: swept here, so expired windows close
        self.spool_interval = settings.spool_interval
        self.retry_base = settings.retry_base
        self.retry_cap = settings.retry_cap
        self.health = health or Health()
        self.log = logs.get()
        self.wake = wake or threading.Event()
        self.deleted = deleted or DeletedPods(wake=self.wake)
        self.last_resync = 0.0  # every tracked claim was verified since (wall time, for status)
        self.resync_failures = 0  # consecutive safety-net verifications that failed transiently
        self.next_prune = 0.0  # node time
        self.steps: dict[str, StepState] = {}
        self._recovered = False  # the start-up retry of every dirty claim runs once per process
        self._resync_requested = threading.Event()  # `netclaim-publisher resync`: every claim due now
        # claim -> why it was marked dirty without a failure (window, pod_deleted): the cause a
        # repair it leads to is counted under (netclaim_drift_repaired_total).
        self._causes: dict[str, str] = {}
        self._guard = threading.Lock()

    def claim_retry(self, ns: str, name: str, exc: Exception) -> None:
        """A reconcile failed transiently: keep the claim dirty and retry it with backoff
        (never sooner than the Retry-After the API server sent with a 429 or 503)."""
        attempts = next((a for n_, m, a in self.journal.dirty_claims() if (n_, m) == (ns, name)), 0)
        delay = max(getattr(exc, "retry_after", 0.0), backoff_delay(attempts, self.retry_base, self.retry_cap))
        self.journal.retry_dirty(ns, name, node_seconds() + delay)
        if attempts in (0, 1, 3) or attempts % 10 == 0:
            self.log.warning("claim not reconciled, retrying", extra={
                "claim": f"{ns}/{name}", "error": str(exc), "retry_in": round(delay, 3), "attempt": attempts + 1})
        self.wake.set()

    def held(self, ns: str, name: str) -> None:
        """An ADD holds the claim's apply for its sandbox's other ADDs (publisher/reconcile/rules.py):
        the sandbox's worker applies it when the hold ends; the mark is due here only a lease
        later (a worker that never got to it), and the apply it leads to is no repair."""
        with self._guard:
            self._causes[f"{ns}/{name}"] = "held"

    def request_resync(self) -> None:
        self._resync_requested.set()
        self.wake.set()

    def drifted(self, ns: str, name: str, why: str) -> None:
        """A claim window saw a change under netclaim's entries: reconcile the claim at once.
        Called from a window's thread: one journal write, then the loop does the work."""
        with self._guard:
            self._causes[f"{ns}/{name}"] = "window"
        self.journal.finish(None, "", "", dirty=[(ns, name)])
        self.wake.set()

    def pod_seen(self, pod: Any, namespace: str, name: str, uid: str) -> None:
        """Pod watch observer (O(1), never blocks): a deleted pod's claims are looked up by the loop."""
        self.deleted(pod, namespace, name, uid)

    def run(self) -> None:
        """The loop; only a bug outside the steps escapes to the supervisor (publisher/service.py)."""
        if not self._recovered:  # start-up: claims a crash left half-done (not again after a thread restart)
            self._recovered = True
            self._step("retries", lambda: self.retry_dirty(everything=True))
        while not self.stopping.is_set():
            self.health.beat("housekeeping")
            self.wake.wait(self._sleep())
            self.wake.clear()
            if self.stopping.is_set():
                return
            self._step("spool", self.spool.ingest_spool)
            self._step("checkpoint", self.journal.checkpoint)  # bounds the WAL; its fsyncs block no commit
            self._step("pods", self.deleted_pods)
            self._step("retries", self.retry_dirty)
            self._step("resync", self.verify_due)
            if node_seconds() >= self.next_prune:
                self.next_prune = node_seconds() + PRUNE_INTERVAL
                self._step("prune", self._prune)
            if self.windows is not None:
                self.windows.sweep()
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
            delay = max(getattr(exc, "retry_after", 0.0), delay)  # never sooner than a Retry-After
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
        due = [self.spool_interval, self.next_prune - now]
        try:
            dirty = self.journal.next_dirty()
        except Exception:  # noqa: BLE001 - the retries step reports the journal's trouble
            dirty = None
        verify = self.safety.next_due()
        if verify is not None:  # not before the step's own backoff ends
            verify = max(verify, self.steps.get("resync", StepState()).next_try)
        for when in (dirty, verify, self.windows.next_deadline() if self.windows else None):
            if when is not None:
                due.append(when - now)
        return max(0.05, min(due))

    def retry_dirty(self, everything: bool = False) -> None:
        for ns, name, _ in self.journal.dirty_claims(None if everything else node_seconds()):
            if self.stopping.is_set():
                return
            key = f"{ns}/{name}"
            try:
                wrote = self.reconciler.reconcile(ns, name)
            except TransientError as exc:
                self.claim_retry(ns, name, exc)
                continue
            finally:
                self.health.beat("housekeeping")
            with self._guard:
                cause = self._causes.pop(key, "outcome")
            if wrote and cause != "held":
                self.metrics.drift_repaired.labels(cause).inc()

    def deleted_pods(self) -> None:
        """Claims of attachments whose pod the watch saw deleted: reconcile them (the pod is gone,
        its entries go) instead of waiting for a DEL that may never come."""
        uids = self.deleted.take()
        if not uids:
            return
        try:
            claims = sorted({(a.claim_namespace, a.claim_name) for a in self.journal.all_attachments()
                             if a.pod_uid in uids})
            if claims:
                with self._guard:
                    for ns, name in claims:
                        self._causes.setdefault(f"{ns}/{name}", "pod_deleted")
                self.journal.finish(None, "", "", dirty=claims)
        except BaseException:
            # The journal failed (the step backs off and tries again): dropped, these deletions would
            # leave their pods' entries shown until a DEL or the safety net, a day later.
            self.deleted.put_back(uids)
            raise

    def verify_due(self) -> None:
        """The safety net: verify the claims whose due time came, a few per iteration."""
        tracked = [f"{ns}/{name}" for ns, name in self.journal.claims()]
        self.safety.track(tracked)
        if self._resync_requested.is_set():
            self._resync_requested.clear()
            self.safety.request_all()
        dirty = {f"{ns}/{name}" for ns, name, _ in self.journal.dirty_claims()} if self.journal.dirty_count() else set()
        for key in self.safety.due(node_seconds()):
            if self.stopping.is_set():
                return
            if key in dirty:  # being retried already; verified when that reconcile succeeds
                self.safety.postpone(key)
                continue
            ns, _, name = key.partition("/")
            self.metrics.claims_verified.inc()
            try:
                wrote = self.reconciler.reconcile(ns, name, purpose="verify")
            except TransientError:
                # The claim stays due; the whole step backs off (1 s doubling to a minute):
                # an unreachable API costs one GET per backoff, not one per claim.
                self.resync_failures += 1
                raise
            finally:
                self.health.beat("housekeeping")
            self.resync_failures = 0
            if wrote:
                self.metrics.drift_repaired.labels("safety_net").inc()
        oldest = self.safety.oldest_verified() if tracked else wall()
        if oldest and oldest > self.last_resync:
            if tracked:
                self.metrics.resyncs.inc()
            self.last_resync = oldest

    def _prune(self) -> None:
        """Old finished events, order marks nothing older can reach, and the bookkeeping of
        claims no longer tracked."""
        self.journal.prune()
        cutoff = min(node_seconds(), self.spool.last_ingest) - limits.ORDER_HORIZON
        self.journal.prune_order_marks(cutoff)
        active = {f"{ns}/{name}" for ns, name in self.journal.claims()}
        self._forget_causes()
        self.writer.forget_inactive(active)
        self.reconciler.forget_inactive(active)
        self.reports.forget_claims(active)

    def _forget_causes(self) -> None:
        """A cause whose claim a worker reconciled first (no mark left) is stale: kept, it would
        credit a later, unrelated repair of that claim to `window` or `pod_deleted`."""
        dirty = {f"{ns}/{name}" for ns, name, _ in self.journal.dirty_claims()}
        with self._guard:
            for key in [k for k in self._causes if k not in dirty]:
                del self._causes[key]


@dataclass
class StepState:
    """Backoff of one housekeeping step."""

    failures: int = 0
    next_try: float = 0.0  # node time
    error: str = ""
