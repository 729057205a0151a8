"""Intake: events from the socket and the spool into the journal, and the spool's overflow report.

An event is acknowledged as soon as its journal commit is done
(publisher/journal/store.py): from then on it survives a crash of the publisher, and
the ADD waits for no disk. What an OS crash could still take belongs to
sandboxes that crash destroyed, which the boot rule retires at the next start
(docs/publisher.md "What an ack means"). A journal that cannot be written is
reported by the journal (health: `journal: ...`) and the plugin gets an error,
so it spools the event instead.

Spool files are deleted only after their events are committed. A file that
cannot be deleted then (read-only remount, EACCES/EPERM without capabilities)
is remembered and skipped: reading it again would only bring duplicates,
which the journal drops by event id anyway. Its deletion is tried again on
every pass, so readiness comes back as soon as the spool is writable again.
A file that cannot be read is retried later; neither stops ingestion of the
other files, and both make readiness say `spool: ...` until the spool is
healthy again.

A file that does not parse is quarantined (renamed `.bad`, counted
`bad_spool_file`) when it was written in this boot: without an OS crash a
plugin never leaves one. One written before this boot started is a write the
crash tore (the plugin does not fsync): it is deleted and counted
`earlier_boot`, with one info line and no fault. A file of a newer wire
version (cni_plugin/wire/event.py NewerVersion) is neither: it is kept for a newer
publisher, counted `newer_version` once, and skipped by this process, which
cannot learn that version while it runs; the next start reads it again.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Protocol

from cni_plugin.wire.event import Event, NewerVersion, WireError, on_unknown_fields
from cni_plugin.wire.spool import list_spool, read_spool, take_overflow
from publisher import limits, logs
from publisher.clock import boot_began_wall, node_seconds, wall
from publisher.journal.store import Journal
from publisher.observe.health import Health
from publisher.observe.report import Reporter

UNREADABLE_RETRY = 5.0  # seconds before a spool file that could not be read is tried again
UNKNOWN_FIELD_NAMES = 32  # distinct unknown field names logged and labelled; more are counted as "(other)"
_FIELD_NAME_CHARS = 64


class UnknownFields:
    """Event fields a newer plugin sent that this publisher ignores: each name logged once per
    process and counted (netclaim_wire_unknown_fields_total{field}), whichever channel brought it.

    The names come from peers, so at most UNKNOWN_FIELD_NAMES of them become labels.
    """

    _lock = threading.Lock()
    _seen: set[str] = set()  # per process, like the log line it guards

    def __init__(self, metrics: Any, log: Any) -> None:
        self.metrics = metrics
        self.log = log

    def __call__(self, names: list[str]) -> None:
        for raw in names:
            name = raw[:_FIELD_NAME_CHARS]
            with self._lock:
                first = name not in self._seen and len(self._seen) < UNKNOWN_FIELD_NAMES
                if first:
                    self._seen.add(name)
                label = name if name in self._seen else "(other)"
            self.metrics.wire_unknown_fields.labels(label).inc()
            if first:
                self.log.info("unknown event field ignored", extra={
                    "field": name, "hint": "sent by a newer plugin; this publisher does not read it"})


class Notifier(Protocol):
    """Told of each committed event (None: several, after a spool ingestion) so its worker wakes
    (publisher/reconcile/workers.py ShardWake)."""

    def notify(self, event: Event | None) -> None: ...


class _Asleep:
    """A notifier for an intake without workers (a tool reading the spool): nobody to wake."""

    def notify(self, event: Event | None) -> None:
        pass


class Intake:
    def __init__(self, *, journal: Journal, spool_dir: str, node: str, reporter: Reporter,
                 workers: Notifier | None = None, health: Health | None = None) -> None:
        self.journal = journal
        self.spool_dir = spool_dir
        self.node = node
        self.report = reporter
        self.metrics = reporter.metrics
        self.notify = (workers or _Asleep()).notify
        self.log = logs.get()
        self.health = health or Health()
        self.last_ingest = 0.0  # node time the spool was last read to the end (order horizon)
        self.last_ingest_wall = 0.0  # the same, for people (status)
        self.stuck: set[str] = set()  # files whose events are journaled but that cannot be deleted or renamed
        self.quarantine: set[str] = set()  # of those, unparseable ones: renamed .bad when possible, never deleted
        self.stuck_error = ""
        self.overflow_error = ""
        self.unreadable: dict[str, float] = {}  # files that could not be read -> node time of the next try
        self.newer: set[str] = set()  # files of a newer wire version: kept, not read again by this process
        self._newly_kept: list[tuple[str, str]] = []  # (file, why) found newer in this pass
        self._earlier_boot = 0  # unparseable files of an earlier boot dropped in this pass
        self.overflow: dict[str, Any] = {"dropped": 0, "reports": 0, "last": None}
        on_unknown_fields(UnknownFields(self.metrics, self.log))  # socket and spool alike

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
        new = self.journal.append(event)
        if new:
            self.notify(event)
            self.metrics.events_acked.labels(event.op).inc()
        else:
            self.metrics.events_duplicate.inc()
        return True, event.event_id

    def pending_files(self) -> list[str]:
        """Spool files not ingested yet (the remembered undeletable ones are not pending)."""
        try:
            return [p for p in list_spool(self.spool_dir) if p not in self.stuck]
        except OSError:
            return []

    def spooled_times(self) -> list[float]:
        """Write times (wall seconds, from the names) of the pending spool files."""
        out = []
        for path in self.pending_files():
            stamp = os.path.basename(path).partition("-")[0]
            if stamp.isdigit():
                out.append(int(stamp) / 1e9)
        return out

    def ingest_spool(self) -> int:
        """Move spooled events into the journal in bounded batches; files go only after the commit.

        Raises only when the journal cannot be written (it reports itself);
        spool problems are faults of the `spool` component, not exceptions.
        """
        started, started_wall = node_seconds(), wall()
        try:
            listed = list_spool(self.spool_dir)
        except OSError as exc:
            self._spool_fault(f"cannot list {self.spool_dir}: {exc}")
            return 0
        listed_set = set(listed)
        self.stuck &= listed_set  # removed by someone else: forget it
        self.quarantine &= listed_set
        self.newer &= listed_set
        self._retry_stuck()
        for path in [p for p in self.unreadable if p not in listed_set]:
            del self.unreadable[path]
        todo = [p for p in listed if p not in self.stuck and p not in self.newer
                and self.unreadable.get(p, 0.0) <= started]
        added = 0
        try:  # each batch commits on its own: an ack never waits behind a whole spool
            for first in range(0, len(todo), limits.INGEST_BATCH):
                added += self._ingest_batch(todo[first:first + limits.INGEST_BATCH])
        finally:
            if added:
                self.metrics.events_spooled.inc(added)
                self.log.info("spooled events ingested", extra={"count": added})
                self.notify(None)
            self._tell_pass()
        if not self.unreadable:  # a complete pass: every listed event is in the journal
            self.last_ingest, self.last_ingest_wall = started, started_wall
        self._report_overflow()
        self._spool_health()
        return added

    def _ingest_batch(self, paths: list[str]) -> int:
        events: list[Event] = []
        done: list[str] = []
        for path in paths:
            event = self._read(path)
            if event is not None:
                events.append(event)
                done.append(path)
        if not events:
            return 0
        added = self.journal.append_many(events)
        for path in done:
            self._remove(path)
        return sum(added)

    def _read(self, path: str) -> Event | None:
        """One spool file's event; None for a file that cannot be used (now or ever)."""
        try:
            event = read_spool(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if path not in self.unreadable:
                self.log.error("spool file unreadable, will retry", extra={"file": os.path.basename(path),
                                                                          "error": str(exc)})
            self.unreadable[path] = node_seconds() + UNREADABLE_RETRY
            return None
        except NewerVersion as exc:
            self._keep_newer(path, str(exc))
            return None
        except (WireError, ValueError, TypeError) as exc:
            if self._written_before_boot(path):
                self._drop_earlier_boot(path)
                return None
            self.metrics.events_rejected.labels("bad_spool_file").inc()
            self.log.error("spool file unreadable, renamed to .bad", extra={
                "detail": f"{os.path.basename(path)}: {exc}"})
            try:
                os.rename(path, path + ".bad")
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.stuck.add(path)  # kept for a person to look at; not read again
                self.quarantine.add(path)  # renamed .bad, not deleted, once the spool allows it
                self.stuck_error = str(exc)
            return None
        self.unreadable.pop(path, None)
        return event

    def _keep_newer(self, path: str, why: str) -> None:
        """A newer plugin's event: left where it is for a newer publisher, counted once."""
        self.newer.add(path)
        self.metrics.events_rejected.labels("newer_version").inc()
        self._newly_kept.append((os.path.basename(path), why))

    @staticmethod
    def _written_before_boot(path: str) -> bool:
        """Written before this boot started, by both its name's wall stamp (when it has one) and
        its mtime: a file of this boot is never taken for a torn one of an earlier boot unless
        the wall clock was stepped forward past both since."""
        started = boot_began_wall()
        stamp = os.path.basename(path).partition("-")[0]
        if stamp.isdigit() and int(stamp) / 1e9 >= started:
            return False
        try:
            return os.stat(path, follow_symlinks=False).st_mtime < started
        except OSError:
            return False

    def _drop_earlier_boot(self, path: str) -> None:
        """A torn write of an earlier boot (no fsync; the crash destroyed its sandbox): deleted."""
        self.metrics.events_rejected.labels("earlier_boot").inc()
        self._earlier_boot += 1
        self._remove(path)  # one that cannot be deleted now is retried like an ingested file

    def _tell_pass(self) -> None:
        """One line per pass for what the pass kept or dropped, however many files it was."""
        if self._earlier_boot:
            self.log.info("unparseable spool files of an earlier boot dropped", extra={
                "count": self._earlier_boot, "hint": "writes torn by the crash that ended that boot"})
            self._earlier_boot = 0
        if self._newly_kept:
            first, why = self._newly_kept[0]
            self.log.warning("spool files kept for a newer publisher", extra={
                "count": len(self._newly_kept), "file": first, "error": why, "kept_total": len(self.newer)})
            self.report.error(f"{len(self.newer)} spool file(s) of a newer wire version kept for a newer "
                              f"publisher (not published by this one): {why}")
            self._newly_kept = []

    def _retry_stuck(self) -> None:
        """Files that could not be deleted (or renamed .bad) are tried again on every pass: the
        spool may be writable again (a read-only remount undone, a capability restored), and
        readiness must come back with it, not wait for a person to clean up."""
        for path in sorted(self.stuck):
            try:
                if path in self.quarantine:
                    os.rename(path, path + ".bad")
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.stuck_error = str(exc)
                continue
            self.stuck.discard(path)
            self.quarantine.discard(path)

    def _remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.stuck.add(path)
            self.stuck_error = str(exc)

    def _spool_health(self) -> None:
        problems = []
        if self.unreadable:
            problems.append(f"{len(self.unreadable)} file(s) cannot be read")
        if self.stuck:
            problems.append(f"{len(self.stuck)} ingested file(s) cannot be deleted: {self.stuck_error}")
        if self.overflow_error:
            problems.append(f"overflow marker cannot be taken: {self.overflow_error}")
        if problems:
            self._spool_fault("; ".join(problems))
        elif self.health.clear("spool"):
            self.log.info("spool healthy again")

    def _spool_fault(self, message: str) -> None:
        if self.health.fault("spool", message):
            self.log.error("spool fault", extra={"error": message})

    def _report_overflow(self) -> None:
        """Events the plugin could not spool (spool at its cap): counted, shown, warned about."""
        try:
            marker = take_overflow(self.spool_dir)
            self.overflow_error = ""
        except OSError as exc:  # a read-only spool: the marker stays until it can be taken
            self.overflow_error = str(exc)
            return
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
