"""The loop: journal -> resolve -> map -> apply, on worker threads, plus resync and GC.

Workers are sharded by containerID, so the events of one attachment are
handled by one thread in journal order; events of other sandboxes run in
parallel (the API round trips, not the CPU, bound throughput). Applies for
one claim are serialized by a per-claim lock held from reading the claim's
desired state to committing the change.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cni_plugin.wire import Event

from . import logs
from .events import EventRecorder, ObjectRef, claim_ref, pod_ref
from .journal import Attachment, Journal, Pending
from .kube import Kube, NotFound, PermanentError, TransientError
from .limits import InvalidEntry
from .mapper import map_event
from .metrics import Metrics
from .podcache import PodCache
from .resolver import NotYet, Resolver, Target, Unresolvable
from .writer import Writer, backoff_delay


STATUS_MAX_CLAIMS = 500


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


CLAIM_STATE_RETENTION = 3600.0  # seconds an untracked claim's state stays in `status`


@dataclass
class ClaimState:
    state: str = "ok"
    error: str = ""
    updated: float = field(default_factory=time.time)
    devices: list[str] = field(default_factory=list)


def result_hash(event: Event) -> str:
    """What makes an ADD the same ADD again: same result, network, request and pod."""
    basis = [event.result, event.network, event.request, event.pod.uid if event.pod else ""]
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()


class Service:
    def __init__(self, settings: Settings, kube: Kube, metrics: Metrics) -> None:
        self.settings = settings
        self.kube = kube
        self.metrics = metrics
        self.log = logs.get()
        self.stopping = threading.Event()
        self.journal = Journal(settings.state_dir)
        self.pods = PodCache(kube, settings.node_name, self.stopping)
        self.resolver = Resolver(kube, settings.node_name, self.pods)
        self.writer = Writer(kube, settings.node_name, self.stopping, metrics.apply_skips.inc,
                             settings.retry_base, settings.retry_cap,
                             applied=self.journal.applied_hashes(), remember=self.journal.set_applied)
        self.events = EventRecorder(kube, settings.node_name, lambda result: metrics.k8s_events.labels(result).inc(),
                                    enabled=settings.emit_events)
        self._wake = [threading.Event() for _ in range(settings.workers)]
        self._threads: list[threading.Thread] = []
        self._claims: dict[str, ClaimState] = {}
        self._claims_lock = threading.Lock()
        self.last_error: dict[str, Any] | None = None
        self.started = False

    # ------------------------------------------------------------ intake

    def submit(self, event: Event) -> tuple[bool, str]:
        """Called by the socket server: commit the event, then it may be acked.

        An ADD/CHECK without pod identity (a runtime that passes no K8S_POD_* in
        CNI_ARGS) can never be resolved to a claim. It is acknowledged without
        being journaled: the publisher has decided, so the plugin must not spool
        it and have it come back. The decision is logged, counted and shown by
        `status` as the last error.
        """
        self.metrics.events_received.labels(event.op).inc()
        if event.op in ("ADD", "CHECK") and not event.has_pod_identity:
            error = "event has no pod identity (K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS): not published"
            self.metrics.events_rejected.labels("no_pod_identity").inc()
            self.last_error = {"time": time.time(), "error": error, "containerID": event.container_id,
                               "claim": "", "op": event.op}
            self.log.warning("event rejected: no pod identity", extra={
                "op": event.op, **logs.attachment_fields(container_id=event.container_id, ifname=event.ifname)})
            return True, event.event_id
        new = self.journal.append(event)
        if new:
            self.metrics.events_acked.labels(event.op).inc()
            self._notify(event)
        else:
            self.metrics.events_duplicate.inc()
        return True, event.event_id

    def _notify(self, event: Event) -> None:
        from .journal import shard_key

        self._wake[shard_key(event.container_id) % len(self._wake)].set()

    def ingest_spool(self) -> int:
        added, bad = self.journal.ingest_spool(self.settings.spool_dir)
        for problem in bad:
            self.metrics.events_rejected.labels("bad_spool_file").inc()
            self.log.error("spool file unreadable, renamed to .bad", extra={"detail": problem})
        if added:
            self.metrics.events_spooled.inc(added)
            self.log.info("spooled events ingested", extra={"count": added})
            for w in self._wake:
                w.set()
        return added

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.ingest_spool()
        self.events.start()
        self.pods.start()
        for shard in range(self.settings.workers):
            t = threading.Thread(target=self._worker, args=(shard,), name=f"worker-{shard}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._housekeeping, name="resync", daemon=True)
        t.start()
        self._threads.append(t)
        self.started = True

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        for w in self._wake:
            w.set()
        for t in self._threads:
            t.join(timeout)
        self.events.stop()
        self.journal.close()

    # ------------------------------------------------------------ workers

    def _worker(self, shard: int) -> None:
        n = self.settings.workers
        # A replay right after start would otherwise GET every pod the watch is
        # about to deliver anyway; wait a little for the first listing.
        self.pods.synced.wait(5.0)
        while not self.stopping.is_set():
            self._wake[shard].clear()
            try:
                batch = self.journal.ready(shard, n, time.time())
            except Exception:
                self.log.exception("journal read failed")
                self.stopping.wait(1.0)
                continue
            if not batch:
                due = self.journal.next_due(shard, n)
                wait = 5.0 if due is None else max(0.0, min(5.0, due - time.time()))
                self._wake[shard].wait(wait)
                continue
            for pending in batch:
                if self.stopping.is_set():
                    return
                try:
                    self._process(pending)
                except TransientError:
                    # Only on shutdown: the event stays pending and is replayed on start.
                    return
                except Exception as exc:  # a bug must not stop the node's publishing
                    self.log.exception("event handling failed", extra=self._fields(pending.event))
                    self._fail(pending, f"internal error: {exc}", "internal")
            self._gauges()

    def _gauges(self) -> None:
        self.metrics.journal_depth.set(self.journal.depth())
        self.metrics.attachments.set(self.journal.attachment_count())

    @staticmethod
    def _fields(event: Event, claim: str = "") -> dict[str, Any]:
        return {"op": event.op, "event_id": event.event_id,
                **logs.attachment_fields(event.pod, claim, event.container_id, event.ifname)}

    def _process(self, p: Pending) -> None:
        op = p.event.op
        if op == "ADD":
            self._handle_add(p)
        elif op == "DEL":
            self._handle_del(p)
        elif op == "CHECK":
            self._handle_check(p)
        elif op == "GC":
            self._handle_gc(p)

    def _fail(self, p: Pending, error: str, reason: str, claim: str = "", event_reason: str = "",
              claim_uid: str = "") -> None:
        """Give up on an event: journal, count, log, and (with `event_reason`) tell kubectl users."""
        self.journal.finish(p.seq, "failed", error)
        self.metrics.events_failed.labels(reason).inc()
        self.last_error = {"time": time.time(), "error": error, "containerID": p.event.container_id,
                           "claim": claim, "op": p.event.op}
        self.log.error("event dropped", extra={"reason": reason, "error": error, **self._fields(p.event, claim)})
        if event_reason:
            self._warn(p.event, event_reason, error, claim, claim_uid)

    def _warn(self, ev: Event, reason: str, error: str, claim: str = "", claim_uid: str = "") -> None:
        """One Warning Event about the claim (the pod related), or about the pod when no claim is known."""
        pod = pod_ref(ev.pod.namespace, ev.pod.name, ev.pod.uid) if ev.pod and ev.pod.name else None
        regarding: ObjectRef | None = pod
        related = None
        if claim:
            ns, _, name = claim.partition("/")
            regarding, related = claim_ref(ns, name, claim_uid), pod
        if regarding is None or not regarding.namespace:
            return  # nothing namespaced to attach it to (no pod identity): the log line must do
        where = f"pod {pod.namespace}/{pod.name}" if pod else "attachment"
        note = f"{where} interface {ev.ifname} (containerID {ev.container_id[:12]}): {error}"
        self.events.warn(regarding, reason, note, related, self._fields(ev, claim))

    def _retry_later(self, p: Pending, error: str, transient: bool) -> None:
        age = time.time() - p.received
        if not transient and age > self.settings.resolve_timeout:
            self._fail(p, f"unresolved after {age:.0f}s: {error}", "unresolved", event_reason="Unresolvable")
            return
        delay = backoff_delay(p.attempts, 0.25, self.settings.retry_cap if transient else 10.0)
        self.journal.reschedule(p.seq, time.time() + delay, error)
        if transient:
            self.last_error = {"time": time.time(), "error": error, "containerID": p.event.container_id,
                               "op": p.event.op}
        if p.attempts in (0, 1, 3) or p.attempts % 10 == 0:
            self.log.info("event not resolvable yet, retrying", extra={
                "error": error, "retry_in": round(delay, 3), "attempt": p.attempts + 1, **self._fields(p.event)})

    def _bound_devices(self, event: Event) -> Any:
        """Devices other attachments of a claim hold (an older sandbox of this pod does not count)."""
        def bound(claim_key: str) -> set[tuple[str, str, str, str]]:
            ns, _, name = claim_key.partition("/")
            out = set()
            for att in self.journal.for_claim(ns, name):
                same_pod = event.pod and att.pod_namespace == event.pod.namespace and att.pod_name == event.pod.name
                if att.key == event.attachment or (same_pod and att.ifname == event.ifname):
                    continue
                out.add(att.device_key)
            return out
        return bound

    def _resolve(self, p: Pending) -> Target | None:
        try:
            return self.resolver.resolve(p.event, self._bound_devices(p.event))
        except NotYet as exc:
            self._retry_later(p, str(exc), transient=False)
        except TransientError as exc:
            self._retry_later(p, f"API unavailable: {exc}", transient=True)
        except Unresolvable as exc:
            claim = f"{exc.claim_namespace}/{exc.claim_name}" if exc.claim_name else ""
            self._fail(p, str(exc), "unresolvable", claim, exc.reason, exc.claim_uid)
        except PermanentError as exc:
            self._fail(p, str(exc), "unresolvable", event_reason="Unresolvable")
        return None

    def _handle_add(self, p: Pending, previous: Attachment | None = None) -> None:
        ev = p.event
        rhash = result_hash(ev)
        current = self.journal.attachment(ev.container_id, ev.ifname)
        if current is not None and current.result_hash == rhash and ev.op == "ADD":
            # The same ADD again (runtime retry, replay): re-publish, which the
            # writer skips as identical unless the claim's status needs repair.
            self._publish(p, current.claim_namespace, current.claim_name, [], [], ev)
            return
        target = self._resolve(p)
        if target is None:
            return
        with self.writer.claim_lock(target.claim_key):
            siblings = self.journal.for_claim(target.claim_namespace, target.claim_name)
            replace: list[tuple[str, str]] = []
            prev_entry = current.entry if current is not None and current.device_key == target.device_key else None
            for att in siblings:
                if att.key == ev.attachment or att.device_key != target.device_key:
                    continue
                same_pod = ev.pod and att.pod_namespace == ev.pod.namespace and att.pod_name == ev.pod.name
                if not same_pod:
                    self._fail(p, f"device {target.pool}/{target.device} is already published for pod "
                                  f"{att.pod_namespace}/{att.pod_name} (containerID {att.container_id})",
                               "device_taken", target.claim_key, "DeviceTaken", target.claim_uid)
                    return
                if att.event_ts > ev.timestamp:
                    self.log.info("stale ADD ignored: a newer sandbox of the pod holds the device",
                                  extra={"newer_containerID": att.container_id, **self._fields(ev, target.claim_key)})
                    self.journal.finish(p.seq, "done", "stale ADD")
                    return
                replace.append(att.key)
                prev_entry = prev_entry or att.entry
            if current is not None and current.claim_key != target.claim_key:
                replace.append(current.key)  # moved to another claim: the old claim is fixed by resync
            try:
                entry = map_event(ev, target.pool, target.device, prev_entry, target.share_id)
            except InvalidEntry as exc:
                self._fail(p, f"entry rejected locally: {exc}", "invalid_entry", target.claim_key, "InvalidEntry",
                           target.claim_uid)
                return
            pod = ev.pod
            att = Attachment(
                container_id=ev.container_id, ifname=ev.ifname, driver=ev.driver, network=ev.network,
                pod_namespace=pod.namespace if pod else "", pod_name=pod.name if pod else "",
                pod_uid=pod.uid if pod else "", claim_namespace=target.claim_namespace,
                claim_name=target.claim_name, claim_uid=target.claim_uid, pool=target.pool,
                device=target.device, share_id=target.share_id, entry=entry, result_hash=rhash,
                event_ts=ev.timestamp)
            self._publish_locked(p, target.claim_namespace, target.claim_name, [att], replace, ev)

    def _handle_del(self, p: Pending) -> None:
        ev = p.event
        current = self.journal.attachment(ev.container_id, ev.ifname)
        if current is None:
            # Nothing was published by this sandbox (or it was replaced by a
            # newer sandbox of the pod): a DEL must not touch anything else.
            self.journal.finish(p.seq, "done", "nothing to remove")
            self.log.info("DEL: no entry written by this containerID", extra=self._fields(ev))
            return
        self._publish(p, current.claim_namespace, current.claim_name, [], [current.key], ev)

    def _handle_check(self, p: Pending) -> None:
        ev = p.event
        current = self.journal.attachment(ev.container_id, ev.ifname)
        if current is None:
            if ev.result:
                self._handle_add(p)
            else:
                self.journal.finish(p.seq, "done", "CHECK of an unknown attachment")
            return
        with self.writer.claim_lock(current.claim_key):
            try:
                entry = map_event(ev, current.pool, current.device, current.entry, current.share_id)
            except InvalidEntry as exc:
                self._fail(p, f"entry rejected locally: {exc}", "invalid_entry", current.claim_key, "InvalidEntry",
                           current.claim_uid)
                return
            current.entry = entry
            if ev.result:
                current.result_hash = result_hash(ev)
            self._publish_locked(p, current.claim_namespace, current.claim_name, [current], [], ev)

    def _handle_gc(self, p: Pending) -> None:
        ev = p.event
        valid = {(a["containerID"], a["ifname"]) for a in ev.valid_attachments or []}
        stale = [a for a in self.journal.all_attachments()
                 if a.driver == ev.driver and (not ev.network or a.network == ev.network) and a.key not in valid]
        by_claim: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for att in stale:
            by_claim.setdefault((att.claim_namespace, att.claim_name), []).append(att.key)
        for (ns, name), keys in by_claim.items():
            self.log.info("GC removes attachments not in the runtime's valid list",
                          extra={"claim": f"{ns}/{name}", "containerIDs": [k[0] for k in keys]})
            self._reapply(ns, name, remove=keys)
        self.journal.finish(p.seq, "done", f"removed {len(stale)}")

    # ------------------------------------------------------------ publish

    def _publish(self, p: Pending, ns: str, name: str, upsert: list[Attachment], remove: list[tuple[str, str]],
                 ev: Event) -> None:
        with self.writer.claim_lock(f"{ns}/{name}"):
            self._publish_locked(p, ns, name, upsert, remove, ev)

    def _publish_locked(self, p: Pending, ns: str, name: str, upsert: list[Attachment],
                        remove: list[tuple[str, str]], ev: Event) -> None:
        key = f"{ns}/{name}"
        drop = set(remove) | {a.key for a in upsert}
        desired = [a for a in self.journal.for_claim(ns, name) if a.key not in drop] + upsert
        try:
            wrote = self.writer.apply(ns, name, [a.entry for a in desired],
                                      on_retry=lambda exc, n: self._api_retry(exc, n, ev, key))
        except NotFound as exc:
            self.journal.finish(p.seq, "failed", f"claim gone: {exc.message}",
                                delete=[a.key for a in self.journal.for_claim(ns, name)])
            self._claim_state(key, "gone", exc.message, [])
            self.metrics.events_failed.labels("claim_gone").inc()
            self.log.warning("claim is gone, its attachments are forgotten", extra=self._fields(ev, key))
            return
        except PermanentError as exc:
            self.metrics.apply_errors.labels(str(exc.code)).inc()
            self._claim_state(key, "error", f"{exc.code}: {exc.message}", [])
            self._fail(p, f"apply rejected ({exc.code}): {exc.message}", f"api_{exc.code}", key, "ApplyRejected",
                       _claim_uid(desired))
            if remove and not upsert:
                self.journal.forget(list(remove))
            return
        self.journal.finish(p.seq, "done", "", upsert=upsert, delete=list(remove))
        self._claim_state(key, "published", "", [f"{a.pool}/{a.device}" for a in desired])
        if wrote and ev.op == "ADD":
            self.metrics.publish_latency.observe(max(0.0, time.time() - ev.timestamp))
        self.log.info("published" if wrote else "unchanged, apply skipped",
                      extra={"entries": len(desired), **self._fields(ev, key)})

    def _api_retry(self, exc: Exception, attempt: int, ev: Event | None, claim: str) -> None:
        self.last_error = {"time": time.time(), "error": str(exc), "claim": claim}
        if attempt in (0, 1, 3) or attempt % 10 == 0:
            fields = self._fields(ev, claim) if ev else {"claim": claim}
            self.log.warning("API unavailable, apply retrying", extra={"error": str(exc), "attempt": attempt, **fields})

    def _claim_state(self, key: str, state: str, error: str, devices: list[str]) -> None:
        with self._claims_lock:
            cs = self._claims.setdefault(key, ClaimState())
            cs.state, cs.error, cs.updated = state, error, time.time()
            if devices or state == "published":
                cs.devices = devices
            if error:
                self.last_error = {"time": cs.updated, "error": error, "claim": key}

    def _reapply(self, ns: str, name: str, remove: list[tuple[str, str]] | None = None, repair: bool = False) -> None:
        """Apply a claim's desired state outside of an event (GC, resync, start-up)."""
        key = f"{ns}/{name}"
        with self.writer.claim_lock(key):
            drop = set(remove or [])
            desired = [a for a in self.journal.for_claim(ns, name) if a.key not in drop]
            if repair:
                self.writer.invalidate(key)
            try:
                self.writer.apply(ns, name, [a.entry for a in desired],
                                  on_retry=lambda exc, n: self._api_retry(exc, n, None, key))
            except NotFound as exc:
                self.journal.forget([a.key for a in self.journal.for_claim(ns, name)])
                self._claim_state(key, "gone", exc.message, [])
                return
            except PermanentError as exc:
                self.metrics.apply_errors.labels(str(exc.code)).inc()
                self._claim_state(key, "error", f"{exc.code}: {exc.message}", [])
                self.log.error("apply rejected", extra={"claim": key, "code": exc.code, "error": exc.message})
                self.events.warn(claim_ref(ns, name, _claim_uid(desired)), "ApplyRejected",
                                 f"re-apply of this node's entries rejected ({exc.code}): {exc.message}",
                                 fields={"claim": key})
                if remove:
                    self.journal.forget(list(remove))
                return
            if remove:
                self.journal.forget(list(remove))
            self._claim_state(key, "published", "", [f"{a.pool}/{a.device}" for a in desired])

    # ------------------------------------------------------------ resync

    def _housekeeping(self) -> None:
        """Start-up apply of the whole desired state, then periodic resync and spool ingestion."""
        try:
            self.resync(first=True)
        except TransientError:
            pass
        except Exception:
            self.log.exception("initial resync failed")
        next_resync = time.time() + self.settings.resync_interval
        while not self.stopping.wait(min(self.settings.spool_interval, max(0.1, next_resync - time.time()))):
            try:
                self.ingest_spool()
                if time.time() >= next_resync:
                    self.resync()
                    self.journal.prune()
                    self._forget_inactive_claims()
                    next_resync = time.time() + self.settings.resync_interval
                self._gauges()
            except TransientError:
                pass
            except Exception:
                self.log.exception("housekeeping failed")

    def _forget_inactive_claims(self) -> None:
        """Bound memory under pod churn: forget claims that no attachment refers to.

        Their state stays visible in `status` for CLAIM_STATE_RETENTION after the
        last change, so an operator still sees why a claim failed.
        """
        active = {f"{ns}/{name}" for ns, name in self.journal.claims()}
        self.writer.forget_inactive(active)
        horizon = time.time() - CLAIM_STATE_RETENTION
        with self._claims_lock:
            for key in [k for k, v in self._claims.items() if k not in active and v.updated < horizon]:
                del self._claims[key]

    def resync(self, first: bool = False) -> None:
        """Drop attachments whose claim or pod is gone; re-apply claims whose status differs."""
        self.metrics.resyncs.inc()
        for ns, name in self.journal.claims():
            if self.stopping.is_set():
                return
            if first:
                self._reapply(ns, name)  # skipped when the journal says it was applied as is
                continue
            self._resync_claim(ns, name)

    def _resync_claim(self, ns: str, name: str) -> None:
        key = f"{ns}/{name}"
        atts = self.journal.for_claim(ns, name)
        try:
            claim = self.kube.get_claim(ns, name)
        except NotFound:
            self.log.info("resync: claim gone, forgetting its attachments", extra={"claim": key})
            self.journal.forget([a.key for a in atts])
            self.writer.invalidate(key)
            return
        uid = (claim.get("metadata") or {}).get("uid", "")
        gone = [a.key for a in atts if a.claim_uid and a.claim_uid != uid]
        pods: dict[tuple[str, str], str | None] = {}
        for a in atts:
            pk = (a.pod_namespace, a.pod_name)
            if pk not in pods:
                cached = self.pods.get(*pk)
                if cached is not None and cached.uid == a.pod_uid:
                    pods[pk] = cached.uid
                else:
                    try:
                        pods[pk] = (self.kube.get_pod(*pk).get("metadata") or {}).get("uid", "")
                    except NotFound:
                        pods[pk] = None
            if pods[pk] is None or (a.pod_uid and pods[pk] != a.pod_uid):
                gone.append(a.key)
        if gone:
            self.log.info("resync: pod or claim gone, removing entries",
                          extra={"claim": key, "containerIDs": sorted({k[0] for k in gone})})
        live = [a for a in atts if a.key not in set(gone)]
        on_server = {(e.get("driver"), e.get("pool"), e.get("device"), e.get("shareID", "") or ""): e
                     for e in (claim.get("status") or {}).get("devices") or []}
        drift = any(not _contains(on_server.get(a.device_key), a.entry) for a in live)
        if gone or drift:
            if drift:
                self.log.info("resync: status differs from desired state, re-applying", extra={"claim": key})
            self._reapply(ns, name, remove=gone, repair=drift)

    # ------------------------------------------------------------ status

    def ready(self) -> tuple[bool, str]:
        if not self.started:
            return False, "starting"
        if self.stopping.is_set():
            return False, "stopping"
        return True, ""

    def status(self) -> dict[str, Any]:
        with self._claims_lock:
            claims = {k: {"state": v.state, "error": v.error, "devices": v.devices,
                          "updated": round(v.updated, 3)} for k, v in sorted(self._claims.items())}
        for ns, name in self.journal.claims():
            claims.setdefault(f"{ns}/{name}", {"state": "pending", "error": "", "devices": [], "updated": None})
        total = len(claims)
        if total > STATUS_MAX_CLAIMS:  # keep the answer well inside one frame: errors first
            keys = sorted(claims, key=lambda k: (claims[k]["state"] == "published", k))[:STATUS_MAX_CLAIMS]
            claims = {k: claims[k] for k in sorted(keys)}
        return {
            "claims_total": total,
            "node": self.settings.node_name,
            "journal_depth": self.journal.depth(),
            "oldest_pending": self.journal.oldest_pending(),
            "attachments": self.journal.attachment_count(),
            "last_error": self.last_error,
            "failed_events": self.journal.failed(),
            "claims": claims,
        }


def _claim_uid(attachments: list[Attachment]) -> str:
    """The claim's uid as recorded when its attachments were resolved ('' if none recorded it)."""
    return next((a.claim_uid for a in attachments if a.claim_uid), "")


def _contains(server: dict[str, Any] | None, desired: dict[str, Any]) -> bool:
    """True when the server's entry holds every field we apply with the same value."""
    if server is None:
        return False
    return all(server.get(k) == v for k, v in desired.items())

