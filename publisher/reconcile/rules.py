"""Per-verb rules: what one event does to the journal's attachments (then the reconciler runs).

Events are ordered by the stamp the plugin put on them where they happened
(cni_plugin/wire/event.py new_order), never by arrival, so the socket and the spool
give the same answer however late one of them is; stamps of different boots
are ranked by the boot order (publisher/journal/order.py), never by wall clock:

What each verb does to the attachment (containerID + ifname):

- ADD: recorded (resolved to claim + device) unless a DEL, a GC fence or a newer event of the
  attachment is later than it.
- DEL: leaves a tombstone; removes the attachment if it is older than the DEL.
- CHECK: updates the Ready condition (and result) of a known, older attachment; an unknown one with a
  result is an ADD, unless a DEL removed it.
- GC: removes the driver/network's attachments older than the GC that it does not list; leaves a
  fence so a late ADD older than the GC is ignored.
- any verb of an earlier boot: nothing. That boot's sandboxes died with it, and the journal retired
  their attachments at the first start of this boot (Journal._retire_earlier_boots).

Each rule commits its change and marks the claims it touches dirty in one
journal transaction, then asks the reconciler (publisher/reconcile/reconciler.py, the
only writer) to bring those claims to the new desired state. A rule checks
order (tombstone, fences, newer event) and commits while holding the journal
(Journal.atomically): an ADD resolves with API round trips in between, and a
GC or DEL committed meanwhile must still make it stale.

A sandbox with several networks on one claim (Multus runs them one after
another) would cost one apply per network while its pod starts. The ADD rule
holds the claim's apply while the claim has devices of the same driver that
this sandbox has not attached yet, for at most limits.SIBLING_HOLD after its
first ADD: the last ADD applies them all at once. When the hold ends without
that last ADD (a device no network reports on), the worker of the sandbox's
shard applies the claim (Rules.ended_holds, apply_held), with the copy the held
ADDs read while it is still current. The hold is the dirty mark's lease, which
runs DIRTY_LEASE past the hold's end, so a change recorded meanwhile (the live
watch, a claim window) waits for that apply, and after a crash or a worker that
never got to it housekeeping applies.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from cni_plugin.wire.event import Event
from publisher import limits, logs
from publisher.clock import backoff_delay, node_seconds, now_rfc3339
from publisher.journal.order import BootOrder
from publisher.journal.schema import shard_key
from publisher.journal.store import Attachment, Journal, Pending
from publisher.kube.calls import PermanentError, TransientError
from publisher.limits import InvalidEntry
from publisher.live.status import at_add
from publisher.observe.report import Reporter, event_fields
from publisher.reconcile.mapper import map_event
from publisher.reconcile.reconciler import Reconciler, claim_facts, newest_sandbox
from publisher.reconcile.resolver import NotOurs, NotYet, Resolver, Target, Unresolvable, device_key, driver_results


@dataclass
class _Hold:
    """A claim whose apply waits for the rest of one sandbox's ADDs (Rules._hold)."""

    first: float  # node time of the sandbox's first held ADD on the claim
    shard: int  # the sandbox's shard key: its worker applies the claim when the hold ends
    claim: dict[str, Any] | None = None  # the copy that ADD read, while no other change came
    tick: int | None = None  # the ClaimChanges tick that copy is current at


@dataclass
class RuleSettings:
    resolve_timeout: float = 120.0
    retry_cap: float = 5.0
    sibling_hold: float = limits.SIBLING_HOLD


def result_hash(event: Event) -> str:
    """What makes an ADD the same ADD again: same result, network, request and pod."""
    basis = [event.result, event.network, event.request, event.pod.uid if event.pod else ""]
    if event.device_id:  # only then: the hashes of every other attachment stay as journaled
        basis.append(event.device_id)
    if event.extended_resource:  # likewise
        basis.append(event.extended_resource)
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()


def stale_reason(journal: Journal, order: BootOrder, ev: Event, current: Attachment | None) -> str:
    """Why an ADD/CHECK is older than what is known about its attachment ('' when it is not)."""
    tomb = journal.tombstone(ev.container_id, ev.ifname)
    if tomb is not None and not order.before(tomb, ev.order):
        return "a later DEL removed this attachment"
    for network, stamp, valid in journal.fences(ev.driver):
        if (not network or network == ev.network) and ev.attachment not in valid and order.before(ev.order, stamp):
            return "a later GC did not list this attachment"
    if current is not None and order.before(ev.order, current.stamp):
        return "a later event of this attachment was already applied"
    return ""


def gc_victims(atts: list[Attachment], ev: Event, order: BootOrder) -> list[Attachment]:
    """The attachments a GC removes: its driver and network, added before it, not in its valid list."""
    valid = {(a["containerID"], a["ifname"]) for a in ev.valid_attachments or []}
    return [a for a in atts if a.driver == ev.driver and (not ev.network or a.network == ev.network)
            and a.key not in valid and order.before(a.stamp, ev.order)]


class ClaimRetries(Protocol):
    """Where a claim's later apply is left (publisher/repair/resync.py Housekeeping)."""

    def claim_retry(self, ns: str, name: str, exc: Exception) -> None:
        """A reconcile failed transiently: retry the claim with backoff."""

    def held(self, ns: str, name: str) -> None:
        """An ADD holds the claim's apply: the claim's mark is due at the hold's end."""


class Rules:
    """Runs one pending event through its verb's rule; never raises for an expected failure."""

    def __init__(self, *, journal: Journal, resolver: Resolver, reconciler: Reconciler, reporter: Reporter,
                 settings: RuleSettings, retries: ClaimRetries, order: BootOrder | None = None) -> None:
        self.journal = journal
        self.order = order or journal.ordering()
        self.resolver = resolver
        self.reconciler = reconciler
        self.report = reporter
        self.metrics = reporter.metrics
        self.settings = settings
        self.claim_retry = retries.claim_retry
        self.held = retries.held  # housekeeping: a held claim is due at the hold's end
        self.log = logs.get()
        self._holds: OrderedDict[tuple[str, str], _Hold] = OrderedDict()  # (claim, sandbox) -> its hold
        self._holds_lock = threading.Lock()

    def process(self, p: Pending) -> None:
        if self._earlier_boot(p):
            return
        handler = {"ADD": self.add, "DEL": self.delete, "CHECK": self.check, "GC": self.gc}[p.event.op]
        handler(p)

    def _earlier_boot(self, p: Pending) -> bool:
        """An event stamped in an earlier boot (or before stamps existed) changes nothing.

        Its sandbox died with that boot: an ADD or CHECK must not bring its IP/MAC
        back, and a DEL or GC has nothing left to remove (the boot rule did it).
        Events of earlier boots arrive late by nature: spooled before a crash, or
        replayed from a journal whose last commits a power loss kept.
        """
        boot = self.order.boot_id
        if not boot or p.event.order[0] == boot:
            return False
        self.journal.finish(p.seq, "done", "sandbox of an earlier boot")
        self.metrics.events_ignored.labels("earlier_boot").inc()
        self.log.info("event of an earlier boot ignored", extra=event_fields(p.event))
        return True

    # ------------------------------------------------------------ verbs

    def add(self, p: Pending) -> None:
        ev = p.event
        with self.journal.atomically():
            current = self.journal.attachment(ev.container_id, ev.ifname)
            if self._stale(p, current):
                return
            if current is not None and ev.op == "ADD" and current.result_hash == result_hash(ev) and _ready(current):
                # The same ADD again (runtime retry): nothing to write, no API request.
                current.stamp = current.added = ev.order
                self.journal.finish(p.seq, "done", "same ADD again", upsert=[current])
                self.metrics.apply_skips.inc()
                return
        read_at = self.reconciler.changes.now()  # before the resolver reads the claim
        known = self._held_copies(ev.container_id)
        target = self._resolve(p, {key: copy for key, (copy, _tick) in known.items()})
        if target is None:
            return
        if target.claim_key in known and target.claim is known[target.claim_key][0]:
            read_at = known[target.claim_key][1]  # the copy is as current as when the hold took it
        att = self._attachment(p, target, current)
        if att is None:
            return
        committed = self._commit_add(p, att, target, current, read_at)
        if committed is not None:
            dirty, copy_tick, held = committed
            if held:
                self.metrics.apply_holds.inc()
                self.held(target.claim_namespace, target.claim_name)
                return
            self._reconcile(dirty, ev, {target.claim_key: target.claim}, {target.claim_key: copy_tick})

    def _commit_add(self, p: Pending, att: Attachment, target: Target, before: Attachment | None,
                    read_at: int) -> tuple[list[tuple[str, str]], int | None, bool] | None:
        """Check the ADD's order again and commit it, atomically: a DEL or GC committed while it
        was being resolved (API round trips) makes it stale now (None). Returns the dirty claims,
        the change's tick, which is None when the resolver's copy of the claim is already
        outdated (publisher/reconcile/reconciler.py ClaimChanges), and whether the claim's apply
        is held for the sandbox's other ADDs (housekeeping then applies when the hold ends)."""
        ev = p.event
        with self.journal.atomically():
            current = self.journal.attachment(ev.container_id, ev.ifname)
            if self._stale(p, current):
                return None
            dirty = self._add_dirty(target, before, current)
            hold = self._hold(target, ev) if len(dirty) == 1 else 0.0
            # Held: this worker applies at the hold's end (ended_holds); housekeeping only after a lease more.
            self.journal.finish(p.seq, "done", "", upsert=[att], dirty=dirty, lease=hold + limits.DIRTY_LEASE)
            tick = self.reconciler.changes.record([target.claim_key], read_at)
            if hold:
                self._keep_copy(target, ev.container_id, tick)
            return dirty, tick, hold > 0

    def _hold(self, target: Target, ev: Event) -> float:
        """Seconds left to hold the claim's apply for this sandbox's ADDs of its other devices (0: apply now).

        Only for a claim reserved for this pod alone (a shared claim's other devices may be
        other pods' to attach, and so may those of a claim reserved for a PodGroup), and counted
        from the sandbox's first ADD on the claim, so a device no ADD will ever come for delays
        the entry by SIBLING_HOLD at most.
        """
        key = (target.claim_key, ev.container_id)
        if self.settings.sibling_hold <= 0 or ev.pod is None or not ev.pod.uid \
                or claim_facts(target.claim)[3].sole_pod != ev.pod.uid:
            return 0.0
        others = {device_key(r) for r in driver_results(target.claim, target.driver)} - {target.device_key}
        if others:  # a claim of one device (most pods) needs no look at the journal
            others -= {a.device_key for a in self.journal.for_claim(target.claim_namespace, target.claim_name)
                       if a.container_id == ev.container_id}
        now = node_seconds()
        with self._holds_lock:
            if not others:
                self._holds.pop(key, None)
                return 0.0
            if key not in self._holds and len(self._holds) >= limits.MAX_HOLDS:
                return 0.0
            first = self._holds.setdefault(key, _Hold(now, shard_key(ev.container_id))).first
            left = first + self.settings.sibling_hold - now
            if left <= 0:
                del self._holds[key]
                return 0.0
            return left

    def ended_holds(self, shard: int, shards: int) -> list[tuple[str, _Hold]]:
        """The holds of this worker's sandboxes that ended without their last ADD, taken: the
        worker applies their claims (apply_held), and their claim copies go with them.

        Holds are kept in the order they began, so the ended ones are the first few.
        """
        now = node_seconds()
        with self._holds_lock:
            ended = []
            for key, hold in self._holds.items():
                if hold.first + self.settings.sibling_hold > now:
                    break
                if hold.shard % shards == shard:
                    ended.append(key)
            return [(key[0], self._holds.pop(key)) for key in ended]

    def next_hold_end(self, shard: int, shards: int) -> float | None:
        """Node time the first hold of this worker's sandboxes ends (None: it holds nothing)."""
        with self._holds_lock:
            return next((hold.first + self.settings.sibling_hold for hold in self._holds.values()
                         if hold.shard % shards == shard), None)

    def holding(self) -> int:
        """How many holds (each with its claim copy) are kept now."""
        with self._holds_lock:
            return len(self._holds)

    def apply_held(self, claim_key: str, hold: _Hold) -> None:
        """Apply a claim whose hold ended without the sandbox's last ADD (a device no network
        reports on): what its ADDs recorded, with the copy they read while it is current."""
        ns, _, name = claim_key.partition("/")
        if not self.journal.dirty_mark(ns, name).gen:
            return  # applied meanwhile (the sandbox's DEL, a retry): the hold holds nothing any more
        try:
            self.reconciler.reconcile(ns, name, hold.claim, None, hold.tick)
        except TransientError as exc:
            self.claim_retry(ns, name, exc)

    def _keep_copy(self, target: Target, container_id: str, tick: int | None) -> None:
        """The held claim as the resolver read it, and the tick up to which it is known current
        (None: another change of the claim came in between, the next ADD reads it again)."""
        with self._holds_lock:
            hold = self._holds.get((target.claim_key, container_id))
            if hold is not None:
                hold.claim, hold.tick = (target.claim, tick) if tick is not None else (None, None)

    def _held_copies(self, container_id: str) -> dict[str, tuple[dict[str, Any], int]]:
        """The claims this sandbox's earlier ADDs hold, with a copy still current and the hold not
        over, as (copy, tick): its next ADD resolves against that copy instead of reading the claim again."""
        now = node_seconds()
        with self._holds_lock:
            return {claim: (hold.claim, hold.tick) for (claim, cid), hold in self._holds.items()
                    if cid == container_id and hold.claim is not None and hold.tick is not None
                    and now < hold.first + self.settings.sibling_hold}

    @staticmethod
    def _add_dirty(target: Target, *previous: Attachment | None) -> list[tuple[str, str]]:
        """The ADD's claim, and the claim an earlier attachment was on (moved: it loses it)."""
        dirty = [(target.claim_namespace, target.claim_name)]
        for prev in previous:
            if prev is not None and prev.claim_key != target.claim_key:
                dirty.append((prev.claim_namespace, prev.claim_name))
        return list(dict.fromkeys(dirty))

    def delete(self, p: Pending) -> None:
        if self._never_ours(p):
            return
        ev = p.event
        with self.journal.atomically():
            current = self.journal.attachment(ev.container_id, ev.ifname)
            tomb = self.journal.tombstone(ev.container_id, ev.ifname)
            newer_tomb = tomb is None or self.order.before(tomb, ev.order)
            if current is None or not self.order.before(current.stamp, ev.order):
                # Nothing older to remove (never published, or re-added after this DEL).
                self.journal.finish(p.seq, "done", "nothing to remove",
                                    tombstone=(ev.attachment, ev.order) if newer_tomb else None)
                return
            dirty = [(current.claim_namespace, current.claim_name)]
            self.journal.finish(p.seq, "done", "", delete=[current.key],
                                tombstone=(ev.attachment, ev.order) if newer_tomb else None, dirty=dirty,
                                lease=limits.DIRTY_LEASE)
        self._reconcile(dirty, ev)

    def check(self, p: Pending) -> None:
        ev = p.event
        dirty: list[tuple[str, str]] | None = None
        with self.journal.atomically():
            current = self.journal.attachment(ev.container_id, ev.ifname)
            if current is not None:
                dirty = self._commit_check(p, current)
            elif not ev.result or self.journal.tombstone(ev.container_id, ev.ifname) is not None:
                self.journal.finish(p.seq, "done", "CHECK of an unknown attachment")  # never one a DEL removed
                return
        if current is None:
            self.add(p)  # a CHECK that carries a result can publish an attachment we never saw
        elif dirty is not None:
            self._reconcile(dirty, ev)

    def _commit_check(self, p: Pending, current: Attachment) -> list[tuple[str, str]] | None:
        """The CHECK's new Ready condition (and result) on a known attachment, committed; None when
        the CHECK is stale or its entry is refused. Runs while the caller holds the journal."""
        ev = p.event
        if self._stale(p, current):
            return None
        try:
            current.entry = map_event(ev, current.pool, current.device, current.entry, current.share_id)
        except InvalidEntry as exc:
            self._fail(p, f"entry rejected locally: {exc}", "invalid_entry", current.claim_key, "InvalidEntry",
                       current.claim_uid)
            return None
        current.stamp = ev.order
        if ev.result:
            current.result_hash = result_hash(ev)
        dirty = [(current.claim_namespace, current.claim_name)]
        self.journal.finish(p.seq, "done", "", upsert=[current], dirty=dirty, lease=limits.DIRTY_LEASE)
        return dirty

    def gc(self, p: Pending) -> None:
        ev = p.event
        with self.journal.atomically():
            victims = gc_victims(self.journal.all_attachments(), ev, self.order)
            dirty = sorted({(a.claim_namespace, a.claim_name) for a in victims})
            self.journal.finish(p.seq, "done", f"removed {len(victims)}", delete=[a.key for a in victims],
                                fence=(ev.driver, ev.network, ev.order, list(ev.valid_attachments or [])),
                                dirty=dirty, lease=limits.DIRTY_LEASE)
        if victims:
            self.log.info("GC removes attachments added before it and not in the runtime's valid list",
                          extra={"containerIDs": sorted({a.container_id for a in victims}), "claims": len(dirty)})
        self._reconcile(dirty, ev)

    # ------------------------------------------------------------ helpers

    def _stale(self, p: Pending, current: Attachment | None) -> bool:
        why = stale_reason(self.journal, self.order, p.event, current)
        if why:
            self.log.info("event older than what is known, ignored", extra={"why": why, **event_fields(p.event)})
            self.journal.finish(p.seq, "done", f"stale: {why}")
        return bool(why)

    def _attachment(self, p: Pending, target: Target, current: Attachment | None) -> Attachment | None:
        ev = p.event
        previous = self._shown_entry(target, current)
        try:
            entry = map_event(ev, target.pool, target.device, previous, target.share_id)
        except InvalidEntry as exc:
            self._fail(p, f"entry rejected locally: {exc}", "invalid_entry", target.claim_key, "InvalidEntry",
                       target.claim_uid)
            return None
        pod = ev.pod
        return Attachment(
            container_id=ev.container_id, ifname=ev.ifname, driver=ev.driver, network=ev.network,
            pod_namespace=pod.namespace if pod else "", pod_name=pod.name if pod else "",
            pod_uid=pod.uid if pod and pod.uid else target.pod_uid or _target_pod_uid(target, ev),
            claim_namespace=target.claim_namespace,
            claim_name=target.claim_name, claim_uid=target.claim_uid, pool=target.pool, device=target.device,
            share_id=target.share_id, entry=entry, result_hash=result_hash(ev), event_ts=ev.timestamp,
            stamp=ev.order, request=ev.request, added=ev.order, netns=ev.netns, device_id=ev.device_id,
            extended_resource=ev.extended_resource,
            # The plugin's look at the addresses: one not usable yet (IPv6 DAD) is not shown until it is.
            live=at_add(entry, ev.unusable_ips, now_rfc3339()))

    def _shown_entry(self, target: Target, current: Attachment | None) -> dict[str, Any] | None:
        """The entry now published for the device (its Ready lastTransitionTime carries over)."""
        if current is not None and current.device_key == target.device_key and current.claim_key == target.claim_key:
            return current.entry
        same = [a for a in self.journal.for_claim(target.claim_namespace, target.claim_name)
                if a.device_key == target.device_key]
        return newest_sandbox(same, self.order).entry if same else None

    def _bound(self, ev: Event) -> Callable[[str], set[tuple[str, str, str, str]]]:
        """Devices other attachments of a claim hold (an older sandbox of this pod does not count)."""
        def bound(claim_key: str) -> set[tuple[str, str, str, str]]:
            ns, _, name = claim_key.partition("/")
            out = set()
            for att in self.journal.for_claim(ns, name):
                same_pod = ev.pod and att.pod_namespace == ev.pod.namespace and att.pod_name == ev.pod.name
                if att.key == ev.attachment or (same_pod and att.ifname == ev.ifname):
                    continue
                out.add(att.device_key)
            return out
        return bound

    def _resolve(self, p: Pending, known: dict[str, dict[str, Any]] | None = None) -> Target | None:
        try:
            return self.resolver.resolve(p.event, self._bound(p.event), known)
        except NotOurs as exc:  # an ordinary pod (no claim of the driver, or none for the request): done, no Event
            self.journal.finish(p.seq, "done", f"nothing to publish: {exc}")
            self.report.ignored(p.event, exc.reason, str(exc))
        except NotYet as exc:
            self._retry_later(p, str(exc), transient=False)
        except TransientError as exc:
            self._retry_later(p, f"API unavailable: {exc}", transient=True, not_before=exc.retry_after)
        except Unresolvable as exc:
            claim = f"{exc.claim_namespace}/{exc.claim_name}" if exc.claim_name else ""
            if exc.reason == "AmbiguousDevice":
                # Not a guess and not dropped: told at once, retried (the claim or its
                # ResourceSlice may change) until the resolve timeout.
                self.report.warn_attachment(p.event, exc.reason, str(exc), claim, exc.claim_uid)
                self._retry_later(p, str(exc), transient=False, reason=exc.reason, claim=claim,
                                  claim_uid=exc.claim_uid)
            else:
                self._fail(p, str(exc), "unresolvable", claim, exc.reason, exc.claim_uid)
        except PermanentError as exc:
            self._fail(p, str(exc), "unresolvable", event_reason="Unresolvable")
        return None

    def _never_ours(self, p: Pending) -> bool:
        """A DEL of an attachment never recorded whose pod can never have a claim of the driver
        (per the pod watch): done without a tombstone, since no late ADD of it could ever publish."""
        ev = p.event
        if self.journal.attachment(ev.container_id, ev.ifname) is not None or not self.resolver.never_ours(ev):
            return False
        self.journal.finish(p.seq, "done", "no claim of this driver: nothing to remove")
        self.report.ignored(ev, "no_claim", "DEL of a pod without a claim of the driver")
        return True

    def _reconcile(self, claims: list[tuple[str, str]], ev: Event, fresh: dict[str, dict[str, Any]] | None = None,
                   ticks: dict[str, int | None] | None = None) -> None:
        """Reconcile the claims a rule changed; `fresh` are claim copies the resolver read,
        `ticks` their change ticks (the reconciler reads a claim again when its copy is stale)."""
        for ns, name in claims:
            key = f"{ns}/{name}"
            claim = (fresh or {}).get(key) or None
            try:
                wrote = self.reconciler.reconcile(ns, name, claim, ev, (ticks or {}).get(key))
            except TransientError as exc:
                self.claim_retry(ns, name, exc)
                continue
            if wrote and ev.op == "ADD":
                self.metrics.publish_latency.observe(self._age(ev))

    def _age(self, ev: Event) -> float:
        """Seconds since the plugin stamped the event: on CLOCK_BOOTTIME when it is of this boot."""
        since = self.order.seconds_since(ev.order)
        return since if since is not None else max(0.0, time.time() - ev.timestamp)

    def _fail(self, p: Pending, error: str, reason: str, claim: str = "", event_reason: str = "",
              claim_uid: str = "") -> None:
        """Give up on an event: journal, count, log, and (with `event_reason`) tell kubectl users."""
        self.journal.finish(p.seq, "failed", error)
        self.metrics.events_failed.labels(reason).inc()
        self.report.error(error, p.event, claim)
        self.log.error("event dropped", extra={"reason": reason, "error": error, **event_fields(p.event, claim)})
        if event_reason:
            self.report.warn_attachment(p.event, event_reason, error, claim, claim_uid)

    def _retry_later(self, p: Pending, error: str, transient: bool, reason: str = "Unresolvable",
                     claim: str = "", claim_uid: str = "", not_before: float = 0.0) -> None:
        """Try the event again after a backoff, never sooner than `not_before` s (a Retry-After)."""
        age = node_seconds() - p.received
        if not transient and age > self.settings.resolve_timeout:
            self._fail(p, f"unresolved after {age:.0f}s: {error}", "unresolved", claim, reason, claim_uid)
            return
        delay = max(not_before, backoff_delay(p.attempts, 0.25, self.settings.retry_cap if transient else 10.0))
        self.journal.reschedule(p.seq, node_seconds() + delay, error)
        if transient:
            self.report.error(error, p.event)
        if p.attempts in (0, 1, 3) or p.attempts % 10 == 0:
            self.log.info("event not resolvable yet, retrying", extra={
                "error": error, "retry_in": round(delay, 3), "attempt": p.attempts + 1, **event_fields(p.event)})


def _ready(att: Attachment) -> bool:
    """Whether the attachment's entry says Ready=True (an ADD after a drifted CHECK must reset it)."""
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in att.entry.get("conditions") or [])


def _target_pod_uid(target: Target, ev: Event) -> str:
    """The pod UID the claim reserves for this pod, when the runtime passed none and the resolver
    named none (a claim reserved for a PodGroup names no pod: the resolver's UID is the one)."""
    for r in (target.claim.get("status") or {}).get("reservedFor") or []:
        if r.get("resource") == "pods" and ev.pod and r.get("name") == ev.pod.name:
            return r.get("uid", "")
    return ""
