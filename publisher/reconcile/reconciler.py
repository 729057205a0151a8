"""The per-claim reconciler: the ONLY code that writes a claim's status.

Desired state = journal ∩ live cluster. For one claim it reads the live claim
(or takes the copy just read to resolve an ADD), keeps the journal's
attachments of that claim that are still live, and applies their entries in
one server-side apply (publisher/reconcile/writer.py). ADD, DEL, CHECK, GC, resync and
start-up all end here, so there is one apply path with one error policy:

- transient (no answer, 429, 5xx, 401, 403): raised to the caller, who leaves the
  claim marked dirty in the journal and retries it with backoff;
- 404: the claim is gone, its attachments are forgotten;
- other 4xx: reported (claim state `error`, Warning `ApplyRejected`), not
  retried until the claim or the desired entries change.

An attachment is shown only while (see docs/design.md "Desired state"):
the claim has the UID it was resolved against, is allocated to this node,
still lists the attachment's device in its allocation results, and reserves
it for the attachment's pod (its UID, or its PodGroup as the pod watch shows it:
publisher/reconcile/reservation.py); and the pod exists. A pod that is gone or a
claim that was recreated drops the attachment from the journal for good, shown
or hidden (a hidden row of a deleted pod would otherwise cost a claim GET per
safety-net pass forever); the other conditions only hide it (a later
allocation may show it again). When
the claim is allocated again, to this node and for the same pod, but with
other devices, the device is chosen again by the resolver's rule
(publisher/reconcile/resolver.py choose_device) and the attachment moves to it.
Several live attachments on one device (a shared claim, or an older and a
newer sandbox of a pod): the entry carries the latest sandbox, the one whose ADD
has the latest order stamp (a CHECK of an older sandbox does not make it latest).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from cni_plugin.wire.event import Event, PodRef
from publisher import logs
from publisher.journal.order import BootOrder
from publisher.journal.store import Attachment, DirtyMark, Journal
from publisher.kube.calls import Kube, NotFound, PermanentError
from publisher.live.status import shown_entry
from publisher.observe.report import Reporter, event_fields
from publisher.reconcile.mapper import current_form
from publisher.reconcile.reservation import Reservations, reservations
from publisher.reconcile.resolver import PodInfo, Unresolvable, allocated_node, choose_device, device_key
from publisher.reconcile.sharing import shared_entry, without_attachments
from publisher.reconcile.slices import SliceFacts
from publisher.reconcile.writer import Writer, body_hash, owned_keys, sort_entries


@dataclass
class Desired:
    """One claim's reconcile plan."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    shown: list[Attachment] = field(default_factory=list)
    hidden: list[tuple[Attachment, str]] = field(default_factory=list)
    dropped: list[tuple[Attachment, str]] = field(default_factory=list)
    moved: list[Attachment] = field(default_factory=list)  # re-chosen onto a newly allocated device
    # device -> its live attachments, when the entries list every pod of a shared device
    # (--shared-attachments, publisher/reconcile/sharing.py); None when they do not.
    sharers: dict[tuple[str, str, str, str], list[Attachment]] | None = None


ClaimFacts = tuple[str, str | None, set[tuple[str, str, str, str]], Reservations]


def claim_facts(claim: dict[str, Any]) -> ClaimFacts:
    """(uid, allocated node, allocated device keys, reservations) of a live claim."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    node = allocated_node(claim) if status.get("allocation") else None
    return (claim.get("metadata") or {}).get("uid", ""), node, {device_key(r) for r in results}, reservations(claim)


DEVICE_GONE = "is no longer allocated"


def _no_group(att: Attachment) -> str:
    """The pod group of a plan made without a pod watch: none known."""
    return ""


def _no_mapping(att: Attachment) -> frozenset[str] | None:
    """The extended resource's requests, for a plan made without a pod watch: none known."""
    return None


def hidden_reason(att: Attachment, node: str, facts: ClaimFacts,
                  pod_group: Callable[[Attachment], str] = _no_group) -> str:
    """Why a journaled attachment is not shown on the live claim ('' when it is).

    `pod_group(att)` is the attachment's pod's PodGroup, asked only when the claim is reserved
    for a PodGroup and not for the pod's UID.
    """
    _, alloc_node, devices, reserved = facts
    if alloc_node is None:
        return "claim is not allocated to a single node"
    if alloc_node != node:
        return f"claim is allocated to node {alloc_node!r}"
    if not reserved.admits(att.pod_namespace, att.pod_uid, lambda: pod_group(att)):
        return f"claim is not reserved for pod {att.pod_namespace}/{att.pod_name}"
    if att.device_key not in devices:
        return f"device {att.pool}/{att.device} {DEVICE_GONE}"
    return ""


SliceLookup = Callable[[str, list[tuple[str, str]]], dict[tuple[str, str], Any]]


def rechoose(att: Attachment, claim: dict[str, Any], bound: set[tuple[str, str, str, str]],
             slice_facts: SliceLookup | None = None,
             extended: frozenset[str] | None = None) -> Attachment | None:
    """The attachment on the device the resolver's rule picks in the claim as it is now, or None.

    With the ADD's request, extended resource (`extended`: the requests the pod's
    requestMappings give it in this claim, or None) and device ID: an interface on a VF stays
    on the allocated device that carries the VF's ID (`slice_facts(driver, keys)`, publisher/reconcile/slices.py).
    While the driver republishes the pool, SlicesUnsettled (a TransientError) goes to the
    reconcile's caller, which keeps the claim dirty and retries it: no choice from old slices.
    """
    ev = Event(op="ADD", container_id=att.container_id, ifname=att.ifname, driver=att.driver,
               network=att.network, request=att.request, device_id=att.device_id, order=att.stamp,
               extended_resource=att.extended_resource,
               pod=PodRef(att.pod_namespace, att.pod_name, att.pod_uid))
    lookup = (lambda keys: slice_facts(att.driver, keys)) if slice_facts else None
    try:
        result = choose_device(claim, ev, bound, lookup, extended)
    except Unresolvable:
        return None
    if result is None:
        return None
    share = result.get("shareID", "") or ""
    entry = {**att.entry, "pool": result.get("pool", ""), "device": result.get("device", "")}
    entry.pop("shareID", None)
    if share:
        entry["shareID"] = share
    return dataclasses.replace(att, pool=entry["pool"], device=entry["device"], share_id=share, entry=entry)


def newest_sandbox(atts: list[Attachment], order: BootOrder) -> Attachment:
    """The attachment a device's one entry shows: the sandbox whose ADD is the latest.

    By the ADD's stamp, not the latest event's: a CHECK of an older sandbox must
    not make it the one shown (tests/model/test_regressions.py, finding F4). By
    the boot order: a sandbox of this boot outranks one of a previous boot
    whatever the wall clocks say.
    """
    return order.latest(atts, lambda a: a.added)


def plan(claim: dict[str, Any], atts: list[Attachment], node: str,
         pod_alive: Callable[[Attachment], bool], order: BootOrder,
         slice_facts: SliceLookup | None = None, pod_group: Callable[[Attachment], str] = _no_group,
         extended: Callable[[Attachment], frozenset[str] | None] = _no_mapping,
         shared_attachments: bool = False) -> Desired:
    """Which attachments the claim's status shows, hides, or forgets (pure but for pod_alive,
    pod_group and extended, which read the pod watch). `shared_attachments`: a device several
    pods use lists them all in its entry's data (publisher/reconcile/sharing.py)."""
    facts = claim_facts(claim)
    out = Desired()
    by_device: dict[tuple[str, str, str, str], list[Attachment]] = {}
    live: list[Attachment] = []
    homeless: list[Attachment] = []
    for att in atts:
        if att.claim_uid and att.claim_uid != facts[0]:
            out.dropped.append((att, "claim was recreated (uid differs)"))
            continue
        why = hidden_reason(att, node, facts, pod_group)
        if why.endswith(DEVICE_GONE):
            homeless.append(att)
        elif why:
            if not pod_alive(att):
                out.dropped.append((att, f"pod {att.pod_namespace}/{att.pod_name} is gone"))
            else:
                out.hidden.append((att, why))
        else:
            live.append(att)
    for att in homeless:  # reallocated with other devices: choose again, as for a new ADD
        others = {a.device_key for a in live if (a.pod_namespace, a.pod_name) != (att.pod_namespace, att.pod_name)}
        moved = rechoose(att, claim, others, slice_facts, extended(att))
        if moved is None:
            if not pod_alive(att):
                out.dropped.append((att, f"pod {att.pod_namespace}/{att.pod_name} is gone"))
            else:
                out.hidden.append((att, f"device {att.pool}/{att.device} {DEVICE_GONE}"))
            continue
        out.moved.append(moved)
        live.append(moved)
    for att in live:
        if not pod_alive(att):
            out.dropped.append((att, f"pod {att.pod_namespace}/{att.pod_name} is gone"))
            continue
        by_device.setdefault(att.device_key, []).append(att)
    out.shown = [newest_sandbox(by_device[k], order) for k in sorted(by_device)]
    out.sharers = by_device if shared_attachments else None
    out.entries = applied_entries(out.shown, out.sharers, order)
    return out


def applied_entries(shown: list[Attachment],
                    sharers: dict[tuple[str, str, str, str], list[Attachment]] | None = None,
                    order: BootOrder | None = None) -> list[dict[str, Any]]:
    """The apply body's entries: each as the live watch shows it, in this release's form
    (an entry an older release journaled is rewritten, publisher/reconcile/mapper.py current_form).

    With `sharers` (and the `order` that picked each device's newest sandbox), a device several
    pods use lists them in its data; without, no entry carries such a list, not even one adopted
    from the API after the option was turned off."""
    entries = []
    for att in shown:
        entry = current_form(shown_entry(att.entry, att.live))
        if sharers is not None and order is not None:
            entry = shared_entry(entry, att, sharers.get(att.device_key, [att]),
                                 lambda atts: newest_sandbox(atts, order))
        elif isinstance(entry.get("data"), dict):
            data = without_attachments(entry["data"])
            entry = entry if data is entry["data"] else {**entry, "data": data}
        entries.append(entry)
    return sort_entries(entries)


def allocation_fingerprint(claim: dict[str, Any]) -> str:
    """What must change before a refused driver is tried again: allocation and reservations."""
    status = claim.get("status") or {}
    return body_hash([status.get("allocation") or {}, status.get("reservedFor") or []])


def server_devices(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return (claim.get("status") or {}).get("devices") or []


class ClaimChanges:
    """When each claim last changed in the journal or was reconciled, on one counter (ticks).

    An ADD reconciles with the copy of the claim the resolver read, to save a
    GET. That copy may be stale by the time the ADD holds the claim's lock:
    another ADD of a shared claim may have been committed and applied with a
    newer copy (e.g. one that reserves its pod). The copy is used only when no
    other change of the claim was recorded between the read and the reconcile;
    otherwise the claim is read again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tick = 0
        self._last: dict[str, int] = {}

    def now(self) -> int:
        """The tick to take before reading a claim copy."""
        with self._lock:
            return self._tick

    def record(self, keys: Iterable[str], read_at: int | None = None) -> int | None:
        """Record a change of `keys`; returns its tick when a copy read at `read_at` was
        still current before it (no other change of these claims since), else None."""
        with self._lock:
            fresh = read_at is not None and all(self._last.get(k, 0) <= read_at for k in keys)
            self._tick += 1
            for key in keys:
                self._last[key] = self._tick
            return self._tick if fresh else None

    def unchanged(self, key: str, tick: int | None) -> bool:
        """True when the change recorded at `tick` is still the claim's last one."""
        with self._lock:
            return tick is not None and self._last.get(key) == tick

    def forget_inactive(self, active: set[str]) -> None:
        with self._lock:
            for key in [k for k in self._last if k not in active]:
                del self._last[key]


class Covered(Protocol):
    """Told, after each reconcile, which of the claim's devices its entries show
    (publisher/repair/unchained.py UnchainedPods.covered): devices of netclaim's drivers left
    without an entry are the ones a pod started without netclaim in its chain would explain."""

    def __call__(self, claim_key: str, claim: dict[str, Any], shown: set[tuple[str, str, str, str]]) -> None: ...


def _not_told(claim_key: str, claim: dict[str, Any], shown: set[tuple[str, str, str, str]]) -> None:
    """The `covered` of a reconciler nobody asked (no unchained check)."""


class Reconciler:
    def __init__(self, *, kube: Kube, journal: Journal, writer: Writer, pods: Any, node: str,
                 reporter: Reporter, order: BootOrder | None = None, windows: Any = None,
                 verified: Callable[[str], None] = lambda key: None, slices: SliceFacts | None = None,
                 covered: Covered | None = None, shared_attachments: bool = False) -> None:
        self.kube = kube
        self.shared_attachments = shared_attachments  # --shared-attachments (publisher/reconcile/sharing.py)
        self.slices = slices or SliceFacts(kube, node)
        # Told which of the claim's devices each reconcile shows (publisher/repair/unchained.py).
        self.covered: Covered = covered or _not_told
        self.windows = windows  # publisher/repair/claimwatch.py ClaimWindows, told of every settled claim
        self.verified = verified  # told when a claim was compared with the live cluster and settled
        self.journal = journal
        self.order = order or journal.ordering()
        self.changes = ClaimChanges()
        self.writer = writer
        self.pods = pods
        self.node = node
        self.report = reporter
        self.metrics = reporter.metrics
        self.log = logs.get()
        # claim -> (body hash, resourceVersion) of an apply the API refused: not
        # repeated until the claim or our entries change.
        self._rejected: dict[str, tuple[str, str]] = {}
        # claim -> (driver, allocation fingerprint): a driver whose entries the API refuses
        # on this claim, left out until the claim's allocation or reservations change.
        self._quarantine: dict[str, tuple[str, str]] = {}

    def forget_inactive(self, active: set[str]) -> None:
        """Bound memory: refusals of claims no attachment refers to any more are forgotten."""
        for key in [k for k in self._rejected if k not in active]:
            self._rejected.pop(key, None)
        for key in [k for k in self._quarantine if k not in active]:
            self._quarantine.pop(key, None)
        self.changes.forget_inactive(active)

    def _pod_alive(self, att: Attachment) -> bool:
        if self.pods is None:
            return True
        return self.pods.alive(att.pod_namespace, att.pod_name, att.pod_uid)

    def _pod_of(self, att: Attachment) -> PodInfo | None:
        """The attachment's pod as the pod watch shows it (one GET when it does not show the pod,
        which then remembers it); None when unknown or another pod of that name."""
        if self.pods is None or not att.pod_uid:
            return None
        info = self.pods.get(att.pod_namespace, att.pod_name)
        if (info is None or info.uid != att.pod_uid) and self.pods.alive(att.pod_namespace, att.pod_name,
                                                                          att.pod_uid):
            info = self.pods.get(att.pod_namespace, att.pod_name)
        return info if info is not None and info.uid == att.pod_uid else None

    def _pod_group(self, att: Attachment) -> str:
        """The attachment's pod's PodGroup: asked only for a claim reserved for a PodGroup."""
        info = self._pod_of(att)
        return info.pod_group if info is not None else ""

    def _extended(self, att: Attachment) -> frozenset[str] | None:
        """The requests of the attachment's claim that back its entry's extended resource (None
        when it names none or the claim is not the pod's extended-resource claim): asked only
        when the claim was reallocated."""
        info = self._pod_of(att) if att.extended_resource else None
        return info.extended_requests(att.claim_name, att.extended_resource) if info is not None else None

    def reconcile(self, ns: str, name: str, claim: dict[str, Any] | None = None,
                  trigger: Event | None = None, copy_tick: int | None = None, purpose: str = "reconcile") -> bool:
        """Make the claim's status show the desired entries; True when an apply was sent.

        `claim` is a copy read earlier (by the resolver); it is used only when the
        change recorded at `copy_tick` is still the claim's last one (ClaimChanges),
        else the claim is read again. Raises TransientError (the claim stays dirty;
        the caller retries later).
        """
        key = f"{ns}/{name}"
        with self.writer.claim_lock(key):
            if claim is not None and not self.changes.unchanged(key, copy_tick):
                claim = None  # another change of the claim came after the copy was read
            self.changes.record([key])  # a copy read before this reconcile is now outdated
            if claim is None:
                try:
                    with self.kube.purpose(purpose):
                        claim = self.kube.get_claim(ns, name)
                except NotFound as exc:
                    self._gone(ns, name, exc.message, trigger)
                    self.verified(key)
                    return False
            mark = self.journal.dirty_mark(ns, name)  # a mark made after this read outlives the reconcile
            atts = [a for a in self.journal.for_claim(ns, name) if not self._quarantined(key, a.driver, claim)]
            desired = plan(claim, atts, self.node, self._pod_alive, self.order, self.slices.facts, self._pod_group,
                           self._extended, self.shared_attachments)
            self.covered(key, claim, {a.device_key for a in desired.shown})
            rv = (claim.get("metadata") or {}).get("resourceVersion", "")
            if self._rejected.get(key) == (body_hash(desired.entries), rv):
                self.journal.clean(ns, name, mark)
                self.verified(key)
                return False
            if self.windows is not None:
                self.windows.writing(key)
            try:
                wrote = self.writer.apply(ns, name, desired.entries, server_devices(claim), record=False,
                                          owned=owned_keys(claim, self.writer.field_manager))
            except NotFound as exc:
                self._gone(ns, name, exc.message, trigger)
                self.verified(key)
                return False
            except PermanentError as exc:
                isolated = self._isolate(ns, name, claim, desired, exc, trigger)
                if isolated is None:
                    self._rejected[key] = (body_hash(desired.entries), rv)
                    self._refused(key, desired, exc, trigger, mark=mark)
                    self.verified(key)
                    return False
                desired, wrote = isolated, True
            self._rejected.pop(key, None)
            # The state is told before the journal calls the claim clean: a status read in
            # between must not show a quiescent publisher with the claim still pending.
            self.report.claim_state(key, "published", "", [f"{a.pool}/{a.device}" for a in desired.shown])
            self._commit(ns, name, desired, self.writer.last_digest(key) if wrote else None, mark)
            self.verified(key)
            if self.windows is not None:
                self.windows.settled(key, desired.entries, claim, self.writer.answered(key) if wrote else rv)
            self.log.info("published" if wrote else "unchanged, apply skipped",
                          extra={"entries": len(desired.entries), **event_fields(trigger, key)})
            return wrote

    def _quarantined(self, key: str, driver: str, claim: dict[str, Any]) -> bool:
        held = self._quarantine.get(key)
        return held is not None and held[0] == driver and held[1] == allocation_fingerprint(claim)

    def _isolate(self, ns: str, name: str, claim: dict[str, Any], desired: Desired, exc: PermanentError,
                 trigger: Event | None) -> Desired | None:
        """A refused apply that carries several drivers' entries: find the driver the API
        refuses (e.g. one this node may not write) by applying without each in turn, so it
        cannot block the others. That driver's attachments are left out of the claim until
        its allocation or reservations change. None when no single driver is to blame."""
        key = f"{ns}/{name}"
        drivers = sorted({a.driver for a in desired.shown})
        if len(drivers) < 2:
            return None
        for driver in drivers:
            rest = [a for a in desired.shown if a.driver != driver]
            entries = applied_entries(rest, desired.sharers, self.order)
            try:
                self.writer.apply(ns, name, entries, None, record=False)
            except PermanentError:
                continue
            self._quarantine[key] = (driver, allocation_fingerprint(claim))
            refused = Desired(shown=[a for a in desired.shown if a.driver == driver])
            self._refused(key, refused, exc, trigger, keep_state=True)
            self.log.warning("entries of one driver left out of the claim after a refusal",
                             extra={"driver": driver, "claim": key})
            return Desired(entries=entries, shown=rest, hidden=desired.hidden, dropped=desired.dropped,
                           moved=desired.moved, sharers=desired.sharers)
        return None

    def _commit(self, ns: str, name: str, desired: Desired, applied: str | None, mark: DirtyMark) -> None:
        """One journal transaction: dropped and moved attachments, the applied hash, not dirty any more."""
        for att, why in desired.dropped:
            self.log.info("attachment dropped", extra={"reason": why, "claim": f"{ns}/{name}",
                                                       **logs.attachment_fields(None, "", *att.key)})
        with self.journal.atomically():  # an event committed since the plan wins over it
            dropped = {a.key for a, _ in desired.dropped if self._as_planned(a)}
            moved = [a for a in desired.moved if a.key not in dropped and self._as_planned(a)]
            self.journal.settle(ns, name, sorted(dropped), moved, applied, mark)

    def _as_planned(self, att: Attachment) -> bool:
        """Whether the journal still holds the attachment this reconcile planned with: a DEL,
        GC or newer ADD committed meanwhile must not be undone by dropping or moving it."""
        row = self.journal.attachment(*att.key)
        return (row is not None and row.stamp == att.stamp and row.added == att.added
                and row.claim_key == att.claim_key)

    def _gone(self, ns: str, name: str, message: str, trigger: Event | None) -> None:
        key = f"{ns}/{name}"
        self.report.claim_state(key, "gone", message, [])
        self.journal.forget([a.key for a in self.journal.for_claim(ns, name)])
        self.journal.clean(ns, name)
        self.writer.invalidate(key)
        self.log.warning("claim is gone, its attachments are forgotten", extra=event_fields(trigger, key))

    def _refused(self, key: str, desired: Desired, exc: PermanentError, trigger: Event | None,
                 keep_state: bool = False, mark: DirtyMark | None = None) -> None:
        ns, _, name = key.partition("/")
        self.metrics.apply_errors.labels(str(exc.code)).inc()
        if keep_state:
            self.report.error(f"{exc.code}: {exc.message}", trigger, key)
        else:
            self.report.claim_state(key, "error", f"{exc.code}: {exc.message}")
        self.log.error("apply rejected", extra={"code": exc.code, "error": exc.message, **event_fields(trigger, key)})
        uid = next((a.claim_uid for a in desired.shown if a.claim_uid), "")
        self.report.warn_claim(key, uid, "ApplyRejected",
                               f"apply of this node's entries rejected ({exc.code}): {exc.message}", trigger)
        if not keep_state:  # a partial refusal: the caller settles the claim with what was applied
            self.journal.clean(ns, name, mark)
