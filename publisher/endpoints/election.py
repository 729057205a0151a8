"""One active controller per cluster: leader election on a coordination.k8s.io/v1 Lease.

The rules are client-go's leaderelection package's, so operators read the Lease the same way
as kube-controller-manager's:
- a candidate reads the Lease; it takes it when nobody holds it (no Lease, an empty
  `holderIdentity`) or when the record has not changed for `leaseDurationSeconds` as measured
  on the candidate's own clock since it first saw that record (never by comparing the holder's
  `renewTime` with its own wall clock: two machines' clocks differ);
- every write is a PUT carrying the resourceVersion it read, so two candidates racing for an
  expired Lease cannot both win: one gets 409 and stays a standby;
- the leader renews every `retry` seconds; when it has not renewed for `renew_deadline`
  seconds it has lost, and the program exits (the Deployment restarts it as a standby) rather
  than keep writing beside a new leader;
- the leader writes a slice only while `holds()`: less than `renew_deadline` seconds since the
  start of its last successful renewal. A standby cannot take over before `leaseDurationSeconds`
  from the moment it saw that renewal, which came after that start, so even a leader whose
  renewal hangs (an API server that answers the Lease late) stops writing before another can
  begin (client-go's leader loses the Lease only once its renewal call returns);
- on SIGTERM the leader gives the Lease up (empty holder, duration 1 s), so a standby takes over
  at its next try instead of after a whole lease duration.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from publisher import logs
from publisher.kube.calls import ApiError, Kube, NotFound


def micro_time(at: float | None = None) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(time.time() if at is None else at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Election:
    """Candidate `identity` for the Lease `namespace`/`name`."""

    kube: Kube
    namespace: str
    name: str
    identity: str
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0
    clock: Callable[[], float] = time.monotonic
    on_round: Callable[[], None] = lambda: None  # after every round, won or not (publisher/endpoints/probes.py)
    leading: threading.Event = field(default_factory=threading.Event)
    transitions: int = 0  # how often this candidate took the Lease
    _observed: tuple[str, str] = ("", "")  # (resourceVersion, holder) of the record last seen
    _observed_at: float = 0.0
    _lease: dict[str, Any] | None = None
    renewed_at: float = 0.0  # clock() at the start of the last round that wrote the Lease as this candidate's
    answered_at: float | None = None  # clock() when the API server last answered a round's read (None: never)

    def unanswered_for(self) -> float | None:
        """Seconds since the API server last answered this candidate's election (None: never yet).

        A standby the API server does not answer could never take over: it must not count as ready
        (publisher/endpoints/probes.py), or two Ready replicas would hide that none can lead.
        """
        return None if self.answered_at is None else self.clock() - self.answered_at

    def _spec(self, spec: dict[str, Any], taking: bool) -> dict[str, Any]:
        now = micro_time()
        out = {**spec, "holderIdentity": self.identity, "leaseDurationSeconds": max(1, int(round(self.duration))),
               "renewTime": now}
        if taking:
            out["acquireTime"] = now
            out["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if spec.get("holderIdentity") else 0)
        return out

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this candidate holds the Lease after it."""
        started = self.clock()
        with self.kube.purpose("leader-lease"):
            try:
                lease = self.kube.get_lease(self.namespace, self.name)
            except NotFound:
                lease = None
            self.answered_at = self.clock()
            if lease is None:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec({}, True)}
                self._lease = self.kube.create_lease(self.namespace, body)
                self.transitions += 1
                self.renewed_at = started
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            record = ((lease.get("metadata") or {}).get("resourceVersion", ""), holder)
            if record != self._observed:
                self._observed, self._observed_at = record, self.clock()
            duration = float(spec.get("leaseDurationSeconds") or self.duration)
            if holder and holder != self.identity and self.clock() - self._observed_at < duration:
                logs.get().debug("lease held by another candidate", extra={"holder": holder})
                return False  # not yet expired as seen from here
            taking = holder != self.identity
            lease["spec"] = self._spec(spec, taking)
            self._lease = self.kube.update_lease(self.namespace, self.name, lease)
            self._observed = ((self._lease.get("metadata") or {}).get("resourceVersion", ""), self.identity)
            self._observed_at = self.clock()
            if taking:
                self.transitions += 1
            self.renewed_at = started
            return True

    def _round(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except ApiError as exc:  # a 409 (another candidate won the race), or the API unreachable
            logs.get().info("lease not written", extra={"lease": f"{self.namespace}/{self.name}",
                                                        "error": str(exc)[:200]})
            return False
        finally:
            self.on_round()

    def acquire(self, stopping: threading.Event) -> bool:
        """Wait until this candidate leads (True) or `stopping` (False)."""
        while not stopping.is_set():
            if self._round():
                self.leading.set()
                logs.get().info("became the leader", extra={"lease": f"{self.namespace}/{self.name}",
                                                            "identity": self.identity})
                return True
            stopping.wait(self.retry)
        return False

    def holds(self) -> bool:
        """Whether this candidate may write now: it leads, and its last renewal started less than
        renew_deadline seconds ago (the module docstring says why that is safe while a round hangs)."""
        return self.leading.is_set() and self.clock() - self.renewed_at < self.renew_deadline

    def keep(self, stopping: threading.Event) -> bool:
        """Renew until `stopping` (True) or until no renewal succeeded for renew_deadline seconds (False: lost)."""
        while not stopping.wait(self.retry):
            if not self._round() and self.clock() - self.renewed_at >= self.renew_deadline:
                self.leading.clear()
                logs.get().error("lost the lease: stopping", extra={"lease": f"{self.namespace}/{self.name}"})
                return False
        return True

    def release(self) -> None:
        """Give the Lease up so a standby takes over at once (only if this candidate still holds it)."""
        if not self.leading.is_set() or self._lease is None:
            return
        self.leading.clear()
        lease = self._lease
        lease["spec"] = {**(lease.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1,
                         "renewTime": micro_time()}
        try:
            with self.kube.purpose("leader-lease"):
                self.kube.update_lease(self.namespace, self.name, lease)
            logs.get().info("released the lease", extra={"lease": f"{self.namespace}/{self.name}"})
        except ApiError as exc:
            logs.get().warning("could not release the lease; a standby takes over when it expires",
                               extra={"error": str(exc)[:200]})
