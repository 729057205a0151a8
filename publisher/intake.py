"""Intake: events from the socket and the spool into the journal, and the spool's overflow report.

An event is acknowledged only after its journal commit (publisher/journal.py),
so once the plugin's ADD returned the event survives a crash. A journal that
cannot be written is remembered (the health check reports it) and the plugin
gets an error, so it spools the event instead.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from cni_plugin.wire import Event, take_overflow

from . import logs
from .journal import Journal
from .report import Reporter


class Intake:
    def __init__(self, journal: Journal, spool_dir: str, node: str, reporter: Reporter,
                 notify: Callable[[Event | None], None]) -> None:
        self.journal = journal
        self.spool_dir = spool_dir
        self.node = node
        self.report = reporter
        self.metrics = reporter.metrics
        self.notify = notify
        self.log = logs.get()
        self.journal_error = ""  # set while the journal cannot be written
        self.last_ingest = 0.0  # when the spool was last read to the end
        self.overflow: dict[str, Any] = {"dropped": 0, "reports": 0, "last": None}

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
            self.metrics.events_rejected.labels("no_pod_identity").inc()
            self.report.error("event has no pod identity (K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS): "
                              "not published", event)
            self.log.warning("event rejected: no pod identity", extra={
                "op": event.op, **logs.attachment_fields(container_id=event.container_id, ifname=event.ifname)})
            return True, event.event_id
        new = self._guarded(lambda: self.journal.append(event))
        if new:
            self.metrics.events_acked.labels(event.op).inc()
            self.notify(event)
        else:
            self.metrics.events_duplicate.inc()
        return True, event.event_id

    def _guarded(self, write: Callable[[], Any]) -> Any:
        """Run a journal write, remembering whether the journal is writable (for /readyz)."""
        try:
            out = write()
        except Exception as exc:
            self.journal_error = f"journal not writable: {exc}"
            raise
        self.journal_error = ""
        return out

    def ingest_spool(self) -> int:
        started = time.time()
        added, bad = self._guarded(lambda: self.journal.ingest_spool(self.spool_dir))
        self.last_ingest = started
        for problem in bad:
            self.metrics.events_rejected.labels("bad_spool_file").inc()
            self.log.error("spool file unreadable, renamed to .bad", extra={"detail": problem})
        if added:
            self.metrics.events_spooled.inc(added)
            self.log.info("spooled events ingested", extra={"count": added})
            self.notify(None)
        self._report_overflow()
        return added

    def _report_overflow(self) -> None:
        """Events the plugin could not spool (spool at its cap): counted, shown, warned about."""
        marker = take_overflow(self.spool_dir)
        if not marker or not marker.get("dropped"):
            return
        dropped = int(marker["dropped"])
        self.metrics.spool_overflow.inc(dropped)
        self.overflow["dropped"] += dropped
        self.overflow["reports"] += 1
        self.overflow["last"] = marker
        note = (f"the netclaim spool was full: {dropped} event(s) were not recorded (last {marker.get('lastCommand')}"
                f" at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(marker.get('lastDroppedAt', 0)))}); "
                "the next resync repairs what they would have changed")
        self.report.error(note)
        self.log.error("spool overflow: events were dropped by the plugin", extra={"marker": marker})
        self.report.warn_node(self.node, "SpoolOverflow", note)
