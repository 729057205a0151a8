"""What the publisher tells people: per-claim state, the last error, dropped events, Warning Events.

Every decision that gives up on something goes through here, so `status`,
the logs, the metrics and `kubectl describe` say the same thing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cni_plugin.wire.event import Event
from publisher import limits, logs
from publisher.observe.events import EventRecorder, ObjectRef, claim_ref, pod_ref
from publisher.observe.metrics import Metrics


@dataclass
class ClaimState:
    state: str = "ok"
    error: str = ""
    updated: float = field(default_factory=time.time)
    devices: list[str] = field(default_factory=list)


def event_fields(event: Event | None, claim: str = "") -> dict[str, Any]:
    """The log keys of a line about this event's attachment."""
    if event is None:
        return {"claim": claim} if claim else {}
    return {"op": event.op, "event_id": event.event_id,
            **logs.attachment_fields(event.pod, claim, event.container_id, event.ifname)}


class Reporter:
    """Claim states, the last error and Warning Events, shared by intake, rules, reconciler and resync."""

    def __init__(self, metrics: Metrics, events: EventRecorder) -> None:
        self.metrics = metrics
        self.events = events
        self.log = logs.get()
        self.last_error: dict[str, Any] | None = None
        self._claims: dict[str, ClaimState] = {}
        self._lock = threading.Lock()

    def error(self, error: str, event: Event | None = None, claim: str = "") -> None:
        self.last_error = {"time": time.time(), "error": error, "claim": claim,
                           "containerID": event.container_id if event else "", "op": event.op if event else ""}

    def ignored(self, event: Event, reason: str, why: str) -> None:
        """An event with nothing to publish that is no failure (a pod without a claim of the
        driver): one counter and a debug line, never the last error, a failed event or a Warning."""
        self.metrics.events_ignored.labels(reason).inc()
        self.log.debug("event needs no publishing", extra={"reason": reason, "why": why, **event_fields(event)})

    def claim_state(self, key: str, state: str, error: str = "", devices: list[str] | None = None) -> None:
        with self._lock:
            cs = self._claims.setdefault(key, ClaimState())
            cs.state, cs.error, cs.updated = state, error, time.time()
            if devices is not None:
                cs.devices = devices
        if error:
            self.error(error, claim=key)

    def claims(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {k: {"state": v.state, "error": v.error, "devices": v.devices, "updated": round(v.updated, 3)}
                    for k, v in sorted(self._claims.items())}

    def forget_claims(self, active: set[str]) -> None:
        """Bound memory under pod churn; a state stays visible CLAIM_STATE_RETENTION after its last change."""
        horizon = time.time() - limits.CLAIM_STATE_RETENTION
        with self._lock:
            for key in [k for k, v in self._claims.items() if k not in active and v.updated < horizon]:
                del self._claims[key]

    def warn_attachment(self, ev: Event, reason: str, error: str, claim: str = "", claim_uid: str = "") -> None:
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
        self.events.warn(regarding, reason, note, related, event_fields(ev, claim))

    def warn_claim(self, key: str, uid: str, reason: str, note: str, trigger: Event | None = None) -> None:
        if trigger is not None and trigger.has_pod_identity:
            self.warn_attachment(trigger, reason, note, key, uid)
            return
        ns, _, name = key.partition("/")
        self.events.warn(claim_ref(ns, name, uid), reason, note, fields={"claim": key})

    def warn_node(self, node: str, reason: str, note: str) -> None:
        """A Warning about the Node object (cluster-scoped: the Event lives in `default`)."""
        self.events.warn(ObjectRef("v1", "Node", "default", node), reason, note, fields={"node": node})
