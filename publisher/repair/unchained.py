"""Pods that started while netclaim was not in the chain: found, reported, counted.

The runtime runs netclaim only while it is chained into the node's primary
conflist. A pod whose sandbox was created while it was not (netclaim not
installed yet, a primary CNI that rewrote its conflist, a contest the keeper
backs off from) never sends an ADD, so its claim never gets a network status,
and nothing else says why. This module tells the operator: a pod that

- runs on this node (phase Running) and is not hostNetwork (those have no CNI ADD),
- declares a claim (spec.resourceClaims or a DRA extended-resource claim),
- sent no ADD that this publisher handled, and has no attachment in the journal,
- and, read last, has a claim allocated to one of netclaim's drivers (the flags' and the
  installer's drivers file's: publisher/repair/drivers.py), reserved for it (or for its
  PodGroup: publisher/reconcile/reservation.py), with no entry of those drivers in its status,

gets one Warning Event (reason NetclaimNotChained) and counts in
netclaim_pods_unchained (now) and netclaim_pods_unchained_reported_total (ever).

A pod whose sandbox did run netclaim, but not for every device of netclaim's drivers
its claims hold (a secondary network whose chain does not end in netclaim, a
NetworkAttachmentDefinition that names another request), gets one Warning (reason
NetclaimDeviceNotChained) naming the devices left without an ADD, and counts in
netclaim_devices_unchained_reported_total. That costs no request either: every
reconcile of a claim tells `covered` which of its devices have an entry, from the
copy of the claim it planned with.

When: a grace period (`grace`, default 30 s) after the pod is first seen
Running (or after the publisher started, for pods that ran before it). A pod
the API still shows Running with containers started before this boot is not
judged at all until the kubelet has run it again in this boot (the boot rule
retired its attachments, and its new sandbox's ADD may take minutes): the
ADD precedes Running (the sandbox's network comes before its containers), and
an ADD spooled while the publisher was down is ingested within seconds. While
the journal holds a pending event received before the pod's grace ended, the
pod waits: its ADD may be that event.

Cost, and why it is bounded: the pod watch already delivers every pod of the
node; a pod without claims, a hostNetwork pod and a pod whose ADD was seen is
decided from the watch alone, with no request. Only a claimed pod without an
ADD costs one GET per claim, once per pod (claims found not to be netclaim's
are remembered, so pods sharing a claim cost it once). While netclaim is
chained that is no pod at all. Memory is bounded: MAX_TRACKED pods, the last
MAX_ADDS pods with an ADD, MAX_CLAIMS claims remembered, and at most
EVENTS_PER_MINUTE Events a minute (beyond that, the pod is counted and logged).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from publisher import logs
from publisher.clock import boot_began_wall, node_seconds
from publisher.kube.calls import ApiError, Kube, NotFound
from publisher.observe.events import claim_ref, pod_ref
from publisher.reconcile.reservation import Reservations, admits, pod_group_name, reservations
from publisher.reconcile.resolver import device_key, pod_claim_names
from publisher.repair.drivers import DriverNames

if TYPE_CHECKING:
    from publisher.journal.store import Attachment
    from publisher.observe.events import ObjectRef

REASON = "NetclaimNotChained"
DEVICE_REASON = "NetclaimDeviceNotChained"
DEFAULT_GRACE = 30.0
MAX_TRACKED = 4096
MAX_ADDS = 8192
MAX_CLAIMS = 1024
EVENTS_PER_MINUTE = 30
SWEEP_EVERY = 2.0


@dataclass
class Candidate:
    """A claimed pod seen Running, waiting for its grace period to end."""

    namespace: str
    name: str
    uid: str
    claims: tuple[str, ...]
    due: float
    flagged: bool = False
    attempts: int = 0
    pod_group: str = ""  # spec.schedulingGroup.podGroupName


@dataclass
class _Bucket:
    """At most `rate` Events a minute: a wave of unchained pods must not flood the API server."""

    rate: int
    tokens: float = 0.0
    at: float = field(default_factory=node_seconds)

    def take(self) -> bool:
        now = node_seconds()
        self.tokens = min(float(self.rate), self.tokens + (now - self.at) * self.rate / 60.0)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def declares_claims(pod: dict[str, Any]) -> bool:
    """The pod can hold a claim at all (spec.resourceClaims is immutable; see resolver.PodInfo)."""
    return bool((pod.get("spec") or {}).get("resourceClaims")
                or ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))


def claim_is_ours(claim: dict[str, Any], drivers: frozenset[str], pod_namespace: str, pod_uid: str,
                  pod_group: str = "") -> tuple[bool, bool, bool]:
    """(allocated with a result of one of `drivers`, and reserved for the pod or its PodGroup, and has a
    status entry of them)."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    ours = any(r.get("driver") in drivers for r in results)
    reserved = admits(claim, pod_namespace, pod_uid, pod_group)
    published = any(d.get("driver") in drivers for d in status.get("devices") or [])
    return ours, reserved, published


def started_before_this_boot(pod: dict[str, Any], boot_wall: float | None = None) -> bool:
    """Whether the pod's latest running container started before this boot: stale status."""
    latest = None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
        try:
            at = datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp() if started else None
        except ValueError:
            at = None
        if at is not None and (latest is None or at > latest):
            latest = at
    if latest is None:
        return False
    return latest < (boot_began_wall() if boot_wall is None else boot_wall)


class Warnings(Protocol):
    """Where a Warning Event is queued (publisher/observe/events.py EventRecorder)."""

    def warn(self, regarding: ObjectRef, reason: str, note: str, related: ObjectRef | None = None,
             fields: dict[str, Any] | None = None) -> bool: ...


class AttachedView(Protocol):
    """What the check reads of the journal (publisher/journal/store.py Journal), only for suspects."""

    def all_attachments(self) -> list[Attachment]: ...

    def oldest_received(self) -> float | None: ...


class UnchainedPods:
    """Fed by the pod watch (`observe`) and the workers (`saw_add`); `run()` judges the due pods."""

    def __init__(self, *, kube: Kube, drivers: Iterable[str], events: Warnings, journal: AttachedView,
                 metrics: Any = None, grace: float = DEFAULT_GRACE, drivers_file: str = "") -> None:
        self.kube = kube
        # netclaim's drivers: the given ones and the installer's drivers file (read again when it changes)
        self.names = DriverNames(tuple(drivers), drivers_file)
        self.drivers = self.names.current()
        self.warn = events.warn
        self.journal = journal
        self.metrics = metrics
        self.grace = grace
        self.started = node_seconds()
        self.log = logs.get()
        self._lock = threading.Lock()
        self._tracked: OrderedDict[str, Candidate] = OrderedDict()  # by pod UID, in due order
        self._adds: OrderedDict[str, None] = OrderedDict()  # pod UIDs (and ns/name) with an ADD handled
        self._judged: OrderedDict[str, None] = OrderedDict()  # pod UIDs already decided (never again)
        self._not_ours: OrderedDict[tuple[str, str], None] = OrderedDict()  # (ns, name) of others' claims
        # "ns/claim" -> (devices of netclaim's drivers without an entry, the pods and PodGroups the
        # claim is reserved for), as the claim's last reconcile planned it (`covered`); claims with
        # none are not kept.
        self._uncovered: OrderedDict[str, tuple[tuple[str, ...], Reservations]] = OrderedDict()
        self._bucket = _Bucket(EVENTS_PER_MINUTE, float(EVENTS_PER_MINUTE))

    def attached_pods(self) -> set[str]:
        """Pod UIDs with an attachment in the journal (asked only for suspects)."""
        return {a.pod_uid for a in self.journal.all_attachments()}

    def pending_since(self) -> float | None:
        """Node time the oldest pending journal event was received, or None."""
        return self.journal.oldest_received()

    @property
    def enabled(self) -> bool:
        """Pods are watched for: drivers are known, or a drivers file may name some later."""
        return bool(self.drivers) or bool(self.names.path)

    def refresh(self) -> frozenset[str]:
        """The driver names now (the drivers file may have changed: a network installed or removed)."""
        names = self.names.current()
        with self._lock:
            before, self.drivers = self.drivers, names
        if names != before:
            self.log.info("driver names changed", extra={"drivers": sorted(names), "before": sorted(before),
                                                         "drivers_file": self.names.path})
        return names

    def off_reason(self) -> str:
        """Why pods started without netclaim are not reported now ("" when they are)."""
        return self.names.off_reason()

    def state(self) -> dict[str, Any]:
        """For `status`: the drivers looked for, where they come from, and why the check is off."""
        return {"driver_names": sorted(self.refresh()), "drivers_file": self.names.path or None,
                "off_reason": self.off_reason()}

    # ------------------------------------------------------------ inputs

    def observe(self, pod: dict[str, Any] | None, namespace: str, name: str, uid: str = "") -> None:
        """One pod from the watch (None: deleted). O(1), no request: most pods return at the first test."""
        if not self.enabled:
            return
        if pod is None or not declares_claims(pod) or (pod.get("spec") or {}).get("hostNetwork") \
                or (pod.get("status") or {}).get("phase") != "Running":
            uid = uid or ((pod or {}).get("metadata") or {}).get("uid", "")
            if uid:
                self._forget(uid)
            return
        uid = (pod.get("metadata") or {}).get("uid", "")
        if started_before_this_boot(pod):
            return  # its sandbox died with the last boot: judged once the kubelet runs it again
        with self._lock:
            if not uid or uid in self._tracked or uid in self._judged:
                return
            if len(self._tracked) >= MAX_TRACKED:
                self._tracked.popitem(last=False)
            due = max(node_seconds(), self.started) + self.grace
            self._tracked[uid] = Candidate(namespace, name, uid, tuple(pod_claim_names(pod)), due,
                                           pod_group=pod_group_name(pod))

    def saw_add(self, pod_uid: str, namespace: str, name: str) -> None:
        """A worker handles an ADD: that pod is chained, whatever its claims resolve to."""
        with self._lock:
            for key in filter(None, (pod_uid, f"{namespace}/{name}" if name else "")):
                self._adds.pop(key, None)
                self._adds[key] = None
            while len(self._adds) > MAX_ADDS:
                self._adds.popitem(last=False)

    def covered(self, claim_key: str, claim: dict[str, Any], shown: set[tuple[str, str, str, str]]) -> None:
        """A reconcile of the claim planned to show the entries of `shown` (device keys)."""
        if not self.enabled:
            return
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        missing = tuple(f"{r.get('pool', '')}/{r.get('device', '')} (request {r.get('request', '')})"
                        for r in results if r.get("driver") in self.drivers and device_key(r) not in shown)
        reserved = reservations(claim)
        with self._lock:
            self._uncovered.pop(claim_key, None)
            if missing:
                self._uncovered[claim_key] = (missing, reserved)
                while len(self._uncovered) > MAX_CLAIMS:
                    self._uncovered.popitem(last=False)

    def _gap(self, cand: Candidate) -> tuple[str, tuple[str, ...]] | None:
        """(claim, devices) of the pod's first claim with devices of netclaim's drivers no ADD attached."""
        with self._lock:
            for claim_name in cand.claims:
                found = self._uncovered.get(f"{cand.namespace}/{claim_name}")
                if found is not None and found[1].admits(cand.namespace, cand.uid, cand.pod_group):
                    return claim_name, found[0]
        return None

    def _forget(self, uid: str) -> None:
        with self._lock:
            cand = self._tracked.pop(uid, None)
        if cand is not None and cand.flagged:
            self._gauge()

    # ------------------------------------------------------------ judging

    def run(self, stopping: threading.Event) -> None:
        """Sweep until stopped; a failed sweep (journal busy, say) is logged and tried again.

        A report must never take the publisher's readiness with it, so nothing escapes.
        """
        while not stopping.wait(min(SWEEP_EVERY, self.grace / 2)):
            try:
                self.sweep()
            except Exception as exc:  # noqa: BLE001 - see the docstring
                self.log.warning("unchained check failed, will retry", extra={"error": f"{type(exc).__name__}: {exc}"})

    def sweep(self) -> int:
        """Judge every pod whose grace period is over; the number of pods reported."""
        if not self.refresh():
            return 0  # no driver yet (an empty drivers file): the suspects wait for one
        now = node_seconds()
        with self._lock:
            due = [c for c in self._tracked.values() if not c.flagged and c.due <= now]
        if not due:
            return 0
        pending = self.pending_since()
        attached: set[str] | None = None
        reported = 0
        for cand in sorted(due, key=lambda c: c.due):
            if pending is not None and pending <= cand.due:
                continue  # its ADD may still be in the journal's backlog: judge once that is handled
            if attached is None and not self._added(cand):
                attached = self.attached_pods()
            if self._added(cand) or cand.uid in (attached or set()):
                gap = self._gap(cand)  # chained, but maybe not on every network
                if gap is not None:
                    self._report_devices(cand, *gap)
                    reported += 1
                self._done(cand.uid)
                continue
            reported += self._judge(cand)
        return reported

    def _added(self, cand: Candidate) -> bool:
        with self._lock:
            return cand.uid in self._adds or f"{cand.namespace}/{cand.name}" in self._adds

    def _done(self, uid: str, flagged: bool = False) -> None:
        with self._lock:
            self._judged[uid] = None
            while len(self._judged) > MAX_TRACKED * 2:
                self._judged.popitem(last=False)
            if flagged:
                cand = self._tracked.get(uid)
                if cand is not None:
                    cand.flagged = True
            else:
                self._tracked.pop(uid, None)

    def _judge(self, cand: Candidate) -> int:
        """Read the pod's claims (only now); report when one is netclaim's and unpublished."""
        for claim_name in cand.claims:
            try:
                verdict = self._claim(cand, claim_name)
            except ApiError as exc:
                cand.attempts += 1
                cand.due = node_seconds() + min(60.0, 2.0 ** cand.attempts)
                self.log.info("unchained check postponed", extra={"pod": f"{cand.namespace}/{cand.name}",
                                                                  "claim": claim_name, "error": str(exc)[:200]})
                return 0
            if verdict:
                self._report(cand, claim_name, verdict)
                return 1
        self._done(cand.uid)
        return 0

    def _claim(self, cand: Candidate, claim_name: str) -> dict[str, Any] | None:
        """The claim when it is netclaim's, reserved for the pod and unpublished; else None.

        A claim allocated without a result of netclaim's drivers is remembered by name: a
        Running pod's claim stays allocated as it is, so the other pods sharing it cost no GET.
        """
        key = (cand.namespace, claim_name)
        with self._lock:
            if key in self._not_ours:
                return None
        try:
            claim = self.kube.get_claim(cand.namespace, claim_name)
        except NotFound:
            return None
        ours, reserved, published = claim_is_ours(claim, self.drivers, cand.namespace, cand.uid, cand.pod_group)
        if ours and reserved and not published:
            return claim
        if not ours and (claim.get("status") or {}).get("allocation"):
            with self._lock:
                self._not_ours[key] = None
                while len(self._not_ours) > MAX_CLAIMS:
                    self._not_ours.popitem(last=False)
        return None

    def _report(self, cand: Candidate, claim_name: str, claim: dict[str, Any]) -> None:
        self._done(cand.uid, flagged=True)
        if self.metrics is not None:
            self.metrics.pods_unchained_reported.inc()
        self._gauge()
        fields = {"pod": f"{cand.namespace}/{cand.name}", "pod_uid": cand.uid,
                  "claim": f"{cand.namespace}/{claim_name}"}
        self.log.warning("pod started while netclaim was not chained", extra=fields)
        if not self._bucket.take():
            self.log.warning("NetclaimNotChained Event not posted: rate limit", extra=fields)
            return
        drivers = sorted({r.get("driver") for r in ((claim.get("status") or {}).get("allocation") or {})
                          .get("devices", {}).get("results", []) if r.get("driver") in self.drivers})
        note = (f"Pod runs with claim {claim_name} allocated to {', '.join(drivers)}, but netclaim saw no CNI ADD "
                f"for it: its sandbox was created while netclaim was not in this node's CNI chain, or netclaim ran "
                f"where it cannot reach this publisher (likely cause with Multus: Multus thick without chrootDir, "
                f"which runs the delegates in multus-daemon's mount namespace), so the claim gets no network "
                f"status. Check the chain keeper (its /readyz, ChainContested Events on the Node) and Multus "
                f"thick's daemon config (chrootDir: /hostroot); the status appears once the pod is re-created "
                f"while netclaim is chained and reaches the publisher.")
        self.warn(pod_ref(cand.namespace, cand.name, cand.uid), REASON, note,
                  related=claim_ref(cand.namespace, claim_name, (claim.get("metadata") or {}).get("uid", "")),
                  fields=fields)

    def _report_devices(self, cand: Candidate, claim_name: str, devices: tuple[str, ...]) -> None:
        if self.metrics is not None:
            self.metrics.devices_unchained_reported.inc(len(devices))
        fields = {"pod": f"{cand.namespace}/{cand.name}", "pod_uid": cand.uid,
                  "claim": f"{cand.namespace}/{claim_name}", "devices": list(devices)}
        self.log.warning("devices of the pod's claim got no CNI ADD of netclaim", extra=fields)
        if not self._bucket.take():
            self.log.warning(f"{DEVICE_REASON} Event not posted: rate limit", extra=fields)
            return
        note = (f"netclaim ran in this pod's sandbox, but no network attached {', '.join(devices)} of claim "
                f"{claim_name} through it: the network that attaches it does not end in netclaim (check that "
                f"network's NetworkAttachmentDefinition or conflist), or its netclaim names another request. "
                f"That device gets no network status.")
        self.warn(pod_ref(cand.namespace, cand.name, cand.uid), DEVICE_REASON, note,
                  related=claim_ref(cand.namespace, claim_name), fields=fields)

    def flagged(self) -> int:
        with self._lock:
            return sum(1 for c in self._tracked.values() if c.flagged)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.pods_unchained.set(self.flagged())
