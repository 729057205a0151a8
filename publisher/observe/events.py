"""Kubernetes Events for permanent failures: where `kubectl describe` users look.

Logs and `netclaim-publisher status` stay on the node; a user who wonders why
their claim has no network data runs `kubectl describe resourceclaim` (or pod).
So when the publisher gives up on an attachment it also posts one Warning
Event (events.k8s.io/v1) about the claim, or about the pod when no claim is
known.

Events must never cost publishing anything: `warn()` only puts the Event on a
small bounded queue (a full queue drops it), one daemon thread posts them with
a short timeout, and every outcome is counted instead of raised. The same
(object, reason) is posted at most once per DEDUP_WINDOW, so a failure loop
cannot flood the API server. Repeats within the window are not dropped: they
are counted into the Event's `series` (count, lastObservedTime), which the
same thread patches at most once per SERIES_FLUSH per Event, the way
client-go's events.k8s.io recorder keeps a series instead of new Events.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from publisher import logs
from publisher.kube.calls import ApiError, Kube

DEDUP_WINDOW = 600.0  # seconds: one Event per (object, reason) per 10 minutes
NOTE_LIMIT = 1024  # bytes: the API server refuses a longer events.k8s.io/v1 note
QUEUE_SIZE = 256
DEDUP_MAX_KEYS = 4096
SERIES_FLUSH = 30.0  # seconds: at most one series update per Event this often
REPORTING_CONTROLLER = "netclaim.dev/publisher"
ACTION = "PublishDeviceStatus"


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about (becomes `regarding` / `related`).

    The uid matters: `kubectl describe` lists only Events whose uid matches.
    """

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def to_api(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name}
        if self.uid:
            ref["uid"] = self.uid
        return ref


def claim_ref(namespace: str, name: str, uid: str = "") -> ObjectRef:
    return ObjectRef("resource.k8s.io/v1", "ResourceClaim", namespace, name, uid)


def pod_ref(namespace: str, name: str, uid: str = "") -> ObjectRef:
    return ObjectRef("v1", "Pod", namespace, name, uid)


def node_ref(name: str) -> ObjectRef:
    """A Node, the way the kubelet refers to it (uid = the node's name; `kubectl describe node` looks for both)."""
    return ObjectRef("v1", "Node", "", name, name)


def trim_note(note: str, limit: int = NOTE_LIMIT) -> str:
    """Cut to `limit` UTF-8 bytes (the API counts bytes), marking the cut."""
    raw = note.encode()
    if len(raw) <= limit:
        return note
    return raw[: limit - 3].decode(errors="ignore") + "..."


def micro_time(ts: float) -> str:
    """RFC 3339 with microseconds: the MicroTime format eventTime requires."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(regarding: ObjectRef, reason: str, note: str, node_name: str,
               related: ObjectRef | None, now: float, action: str = ACTION) -> dict[str, Any]:
    """An events.k8s.io/v1 Warning as the API server validates it (reason/action <= 128, note <= 1 KiB)."""
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # The name scheme of client-go's recorders (generateName ending in "."
        # is refused for Events); 200 keeps it under the 253 limit.
        # A cluster-scoped object's (a Node's) Events live in "default", as the kubelet's do.
        "metadata": {"name": f"{regarding.name[:200]}.{time.time_ns():x}",
                     "namespace": regarding.namespace or "default"},
        "eventTime": micro_time(now),
        "type": "Warning",
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": f"netclaim/{node_name}"[:128],
        "action": action[:128],
        "reason": reason[:128],
        "note": trim_note(note),
        "regarding": regarding.to_api(),
    }
    if related is not None:
        body["related"] = related.to_api()
    return body


@dataclass
class _Slot:
    """One (object, reason) within its window: the Event posted and its repeats."""

    opened: float  # recorder clock at the first occurrence
    namespace: str
    name: str  # the Event's metadata.name
    count: int = 1  # occurrences, the first included (series.count)
    last_observed: float = 0.0  # wall time of the latest repeat
    dirty: bool = False  # repeats not yet written into the Event's series
    posted: bool = False  # the Event exists (a series can only be patched onto it)


class EventRecorder:
    """Posts Warning Events off the workers' path, deduplicated, best effort.

    `count(result)` is told every outcome: created, failed, deduplicated (a
    repeat, counted into the series), series_updated, dropped (queue full or
    stopping) or disabled.
    """

    def __init__(self, kube: Kube, node_name: str, count: Callable[[str], None] = lambda result: None,
                 enabled: bool = True, window: float = DEDUP_WINDOW,
                 clock: Callable[[], float] = time.monotonic, series_flush: float = SERIES_FLUSH,
                 action: str = ACTION) -> None:
        self.kube = kube
        self.action = action
        self.node_name = node_name
        self.count = count
        self.enabled = enabled
        self.window = window
        self.clock = clock
        self.series_flush = series_flush
        self.log = logs.get()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_SIZE)
        self._last: dict[tuple[str, ...], _Slot] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="k8s-events", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Post what is queued if it is quick; a stuck API must not delay shutdown."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def warn(self, regarding: ObjectRef, reason: str, note: str, related: ObjectRef | None = None,
             fields: dict[str, Any] | None = None) -> bool:
        """Queue one Warning; never blocks, never raises. True when queued."""
        if not self.enabled:
            self.count("disabled")
            return False
        body = event_body(regarding, reason, note, self.node_name, related, time.time(), self.action)
        slot = self._first_in_window(regarding, reason, body)
        if slot is None:
            self.count("deduplicated")
            return False
        try:
            self._queue.put_nowait({"body": body, "fields": dict(fields or {}), "slot": slot})
        except queue.Full:
            self.count("dropped")
            self.log.warning("kubernetes event dropped: queue full", extra={"reason": reason, **(fields or {})})
            return False
        return True

    def _first_in_window(self, regarding: ObjectRef, reason: str, body: dict[str, Any]) -> _Slot | None:
        """Open the (object, reason) slot for this window, or count a repeat into the open one (None)."""
        key = (regarding.kind, regarding.namespace, regarding.name, regarding.uid, reason)
        now = self.clock()
        with self._lock:
            slot = self._last.get(key)
            if slot is not None and now - slot.opened < self.window:
                slot.count += 1
                slot.last_observed = time.time()
                slot.dirty = True
                return None
            if len(self._last) >= DEDUP_MAX_KEYS:
                self._prune(now)
            slot = _Slot(now, body["metadata"]["namespace"], body["metadata"]["name"])
            self._last[key] = slot
        return slot

    def _prune(self, now: float) -> None:
        """Forget expired slots; if all are fresh, the oldest half (memory stays bounded)."""
        expired = [k for k, s in self._last.items() if now - s.opened >= self.window]
        for k in expired:
            del self._last[k]
        if len(self._last) >= DEDUP_MAX_KEYS:
            for k in sorted(self._last, key=lambda k: self._last[k].opened)[: DEDUP_MAX_KEYS // 2]:
                del self._last[k]

    def _run(self) -> None:
        next_flush = self.clock() + self.series_flush
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_flush - self.clock()))
            except queue.Empty:
                item = {}
            if item is None:
                self.flush_series()
                return
            if item:
                if self._post(item["body"], item["fields"]):
                    item["slot"].posted = True
            if self.clock() >= next_flush:
                self.flush_series()
                next_flush = self.clock() + self.series_flush

    def flush_series(self) -> None:
        """Write the repeats counted since the last flush into each posted Event's series."""
        with self._lock:
            due = [(s.namespace, s.name, s.count, s.last_observed) for s in self._last.values()
                   if s.dirty and s.posted]
            for s in self._last.values():
                if s.posted:
                    s.dirty = False
        for namespace, name, count, observed in due:
            series = {"series": {"count": count, "lastObservedTime": micro_time(observed)}}
            try:
                self.kube.patch_event(namespace, name, series)
            except Exception as exc:  # noqa: BLE001 - best effort, like the Event itself
                self.count("failed")
                self.log.warning("kubernetes event series not updated",
                                 extra={"event": f"{namespace}/{name}", "error": str(exc)})
                continue
            self.count("series_updated")

    def _post(self, body: dict[str, Any], fields: dict[str, Any]) -> bool:
        regarding = body["regarding"]
        extra = {"reason": body["reason"], "regarding": f"{regarding['kind']} {regarding['namespace']}/"
                 f"{regarding['name']}", **fields}
        try:
            self.kube.create_event(body["metadata"]["namespace"], body)
        except ApiError as exc:
            self.count("failed")
            self.log.warning("kubernetes event not created", extra={"code": exc.code, "error": exc.message, **extra})
            return False
        except Exception as exc:  # noqa: BLE001 - best effort: a bug here must not kill the thread
            self.count("failed")
            self.log.warning("kubernetes event not created", extra={"error": f"{type(exc).__name__}: {exc}", **extra})
            return False
        self.count("created")
        self.log.info("kubernetes event created", extra=extra)
        return True
