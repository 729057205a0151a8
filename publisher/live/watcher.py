"""The live-interface watch: one thread that keeps each entry equal to its netns.

    journal (attachments with a netns) ─▶ sync: open / close sandboxes ─▶ netlink
    notifications ─▶ read the interface ─▶ next_live (publisher/live/status.py)
    ─▶ conditional journal write + dirty mark (publisher/journal/livestate.py)
    ─▶ housekeeping's reconcile applies it

Runtimes never call CNI CHECK on running sandboxes, so without this an entry
says what the ADD said for the pod's whole life. The thread subscribes to
link and address changes in each sandbox's netns (no polling of interfaces:
0 requests and a few syscalls per second at rest), re-reads the interface a
moment after a change (`settle`: a burst of notifications is one read), and
writes at most once per attachment per `hold` seconds: a flapping link costs
one claim read and one apply per hold (housekeeping's reconcile), and the latest
state always lands at the end of it.

It never keeps a netns alive: every `sync_interval` each netns path is
checked against the inode the sockets were opened on, and a sandbox whose
path is gone has its sockets closed and its attachments retired (the runtime
removed it; a DEL that never came changes nothing). Reads run between those
checks on this same thread, and each is bounded whatever the netns holds (at
most limits.LIVE_MAX_ADDRESSES addresses, about a millisecond: sandbox.py), so
a pod that fills its netns with addresses delays another netns's release by
its reads of one pass, not by seconds. A path already gone
when the watch first opens it (the sandbox died while the publisher was
down and its DEL was lost) is retired the same way, provided its directory
is visible (a netns directory not mounted into the publisher's container
proves nothing). A path that cannot be opened otherwise (not visible to the
publisher, not a netns, not a name in a configured netns directory: a
`/proc/<pid>/ns/net` path, publisher/nsopen/netnsfile.py) leaves that attachment as
the ADD said, and is tried again later. Without the right to enter namespaces (CAP_SYS_ADMIN)
the watch is off and says why: the publisher works as it did before.

Nothing the thread knows outlives one run of it: the supervisor
(publisher/service.py) restarts a crashed thread on this same object, and
`close()` forgets every attachment, socket, schedule and hold, so the first
sync of the next run watches every journaled attachment anew. A journal step
that fails (another process holds the write lock, a full disk, a busy read)
fails alone, inside the loop: a write stays pending and is tried again after
a backoff, a retire of a vanished netns is kept and tried again, a failed
read skips that pass. Each failure streak is logged once when it starts and
once when it ends, and counted in netclaim_interface_watch_journal_errors_total.
"""

from __future__ import annotations

import errno
import os
import selectors
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from cni_plugin.lean.netns import CLONE_NEWNET, setns
from publisher import logs
from publisher.clock import backoff_delay, now_rfc3339
from publisher.journal.livestate import Watched, entry_and_live, record_live, retire_vanished, watched_rows
from publisher.journal.store import Journal
from publisher.live.sandbox import NotANetns, Sandbox
from publisher.live.status import OK, next_live
from publisher.nsopen.access import NetnsAccess

# What a journal step of the watch may raise when the journal cannot serve it (JournalBusy is a
# sqlite3.OperationalError): caught around that step, never allowed to end the thread.
JOURNAL_ERRORS = (sqlite3.Error, OSError)


@dataclass
class LiveSettings:
    enabled: bool = True
    sync_interval: float = 1.0  # seconds between netns liveness checks (a stat per watched netns)
    journal_interval: float = 10.0  # seconds between full re-reads of the journal (committed events wake it at once)
    settle: float = 0.1  # seconds after a notification before the interface is read
    hold: float = 3.0  # seconds after a write before the same attachment is written again
    retry_unopenable: float = 30.0  # seconds before a netns path that could not be opened is tried again
    retry_journal: float = 0.5  # seconds before a failed journal step is tried again, doubling per failure ...
    retry_journal_cap: float = 10.0  # ... up to this
    # CNI networks whose interfaces' addresses gained after the ADD are published (SLAAC/DHCP networks;
    # --live-added-addresses). Elsewhere the netns only takes away: publisher/live/status.py says why.
    report_added: frozenset[str] = frozenset()
    netns: NetnsAccess = field(default_factory=NetnsAccess)  # which paths may be opened, and by whom


@dataclass
class Streak:
    """Consecutive failures of one journal step: logged when it starts and when it ends, not per try."""

    failures: int = 0
    error: str = ""


def change_reason(stored: dict[str, Any], new: dict[str, Any]) -> str:
    """The metric label of a write: the new unready reason, or what changed."""
    if new.get("state", OK) != OK:
        return new["state"]
    if stored.get("state", OK) != OK:
        return "Recovered"
    if stored.get("ips") != new.get("ips") or stored.get("added") != new.get("added"):
        return "AddressesChanged"
    if stored.get("mac") != new.get("mac"):
        return "MacChanged"
    return "Changed"


NO_RIGHT = ("setns refused (EPERM): the publisher needs CAP_SYS_ADMIN to enter pods' network namespaces, "
            "or a netns opener that has it (--netns-opener)")
TURNED_OFF = "turned off (--no-live-watch)"


def can_enter_namespaces() -> str:
    """'' when this process may setns(2) into a network namespace, else why not (NO_RIGHT: for good)."""
    try:
        fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open its own netns: {exc.strerror}"
    try:
        setns(fd, CLONE_NEWNET)  # into the namespace it is already in: a no-op that needs the right
    except OSError as exc:
        if exc.errno == errno.EPERM:
            return NO_RIGHT
        return f"setns failed: {exc}"
    finally:
        os.close(fd)
    return ""


class Wake(Protocol):
    """What is told once a live change is journaled, so the claim's reconcile comes soon:
    housekeeping's wake (publisher/repair/resync.py Housekeeping.wake, a threading.Event)."""

    def set(self) -> None: ...


class LiveWatch:
    def __init__(self, *, journal: Journal, metrics: Any, changed: Wake,
                 stopping: threading.Event, settings: LiveSettings | None = None) -> None:
        self.journal = journal
        self.metrics = metrics
        self.on_change: Callable[[], None] = changed.set
        self.stopping = stopping
        self.settings = settings or LiveSettings()
        self.log = logs.get()
        self.disabled = "" if self.settings.enabled else TURNED_OFF
        self.spaces: dict[str, Sandbox] = {}
        self.watch: dict[tuple[str, str], Watched] = {}
        self.by_space: dict[str, set[tuple[str, str]]] = {}
        self.due: dict[str, float] = {}  # netns path -> when to read its interfaces
        self.pending: dict[tuple[str, str], float] = {}  # attachment -> when to write it
        self.held: dict[tuple[str, str], float] = {}  # attachment -> end of its hold after a write
        self.unopenable: dict[str, float] = {}  # netns path -> when to try opening it again
        # Directories this watch has opened a netns in: the runtime's, mounted where the publisher looks.
        # Knowledge of the node's mounts, not of the journal, so a restart of the loop keeps it.
        self.netns_dirs: set[str] = set()
        # Attachments whose netns is gone and whose retire the journal refused: retired at _retire_at.
        self.retiring: dict[tuple[str, str], Watched] = {}
        self.failing: dict[str, Streak] = {}  # journal step -> its current failure streak
        self._selector: selectors.BaseSelector | None = None
        # Attachments committed since the last sync: asked counts calls, synced the count the last sync began at.
        self._asked = 0
        self._asked_lock = threading.Lock()  # also guards _wakeup: a worker never writes to a closed pipe's fd
        self._synced = 0
        self._next_journal_read = 0.0
        self._read_retry_at = 0.0  # after a failed journal read, not before this
        self._retire_at = 0.0
        self._wakeup: tuple[int, int] | None = None  # a pipe that ends the loop's wait when attachments change

    def attachments_changed(self) -> None:
        """An event was committed: sync now rather than at the next interval (called by the workers).

        Until that sync has run the watch counts as busy, so a publisher is not called quiet
        while a new attachment's interface has not been looked at."""
        with self._asked_lock:  # several workers call this: no increment may be lost
            self._asked += 1
            if self._wakeup is not None:  # under the lock: close() cannot free the fd (and a file reuse it) meanwhile
                try:
                    os.write(self._wakeup[1], b"\0")
                except OSError:  # full (BlockingIOError): a wakeup is pending anyway
                    pass

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        if not self._may_run():
            return
        try:
            self._open()
            self._loop()
        finally:
            self.close()  # and forget: a restart by the supervisor begins from the journal alone

    def _may_run(self) -> bool:
        """Whether the watch can run; False once stopping. Off for good only when turned off or without
        the right to enter namespaces: a check that failed otherwise (a process out of file descriptors)
        is made again every retry_unopenable seconds, so a passing fault cannot leave the watch off."""
        said = ""
        while not self.stopping.is_set():
            if self.disabled != TURNED_OFF:  # with an opener, this process needs no right of its own
                self.disabled = self.settings.netns.ready() if self.settings.netns.opener else can_enter_namespaces()
            if not self.disabled:
                if said:
                    self.log.info("live interface watch is on", extra={"component": "live-watch"})
                return True
            if self.disabled != said:
                said = self.disabled
                self.log.warning("live interface watch is off: entries keep what the ADD said",
                                 extra={"component": "live-watch", "reason": self.disabled})
            if self.disabled in (TURNED_OFF, NO_RIGHT):
                self.stopping.wait()
            else:
                self.stopping.wait(self.settings.retry_unopenable)
        return False

    def _open(self) -> None:
        self._selector = selectors.DefaultSelector()
        wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with self._asked_lock:
            self._wakeup = wakeup
        self._selector.register(wakeup[0], selectors.EVENT_READ, None)

    def _loop(self) -> None:
        assert self._selector is not None
        next_sync = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            wake = min([next_sync, *self.due.values(), *self.pending.values()])
            for ready, _mask in self._selector.select(max(0.0, min(wake - now, self.settings.sync_interval))):
                if ready.data is None:  # attachments_changed(): drained here, synced below
                    self._drain_wakeup()
                    next_sync = 0.0
                    continue
                self._notified(ready.data)
            now = time.monotonic()
            if now >= next_sync or self._asked != self._synced:
                self.sync(now)
                next_sync = now + self.settings.sync_interval
            for path in [p for p, t in self.due.items() if t <= now]:
                self.due.pop(path, None)
                self._read_space(path, now)
            for key in [k for k, t in self.pending.items() if t <= now]:
                self.pending.pop(key, None)
                self._write(key, now)

    def _notified(self, path: str) -> None:
        """The netns's socket has notifications: read the interfaces a moment later."""
        space = self.spaces.get(path)
        if space is None:
            return
        try:
            changed = space.drain()
        except OSError as exc:  # the socket failed: new sockets, opened by the next sync, tell the truth
            self.log.warning("netns notifications failed: its sockets are opened again", extra={
                "component": "live-watch", "netns": path, "error": exc.strerror or str(exc)})
            for key in sorted(self.by_space.get(path, ())):
                self._unwatch(key)
            self._next_journal_read = 0.0
            return
        if changed:
            self.due[path] = min(self.due.get(path, float("inf")), time.monotonic() + self.settings.settle)

    def _drain_wakeup(self) -> None:
        assert self._wakeup is not None
        try:
            while os.read(self._wakeup[0], 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Free every socket and forget everything this run knew (see the module docstring)."""
        for path in list(self.spaces):
            self._close_space(path)
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        with self._asked_lock:
            wakeup, self._wakeup = self._wakeup, None
        for fd in wakeup or ():
            os.close(fd)
        self._forget()

    def _forget(self) -> None:
        """Kept, any of these would outlive the sockets it stood for: an attachment left in `watch`
        is never watched again, since a sync watches only what it does not watch already."""
        for table in (self.spaces, self.watch, self.by_space, self.due, self.pending, self.held, self.unopenable,
                      self.retiring, self.failing):
            table.clear()
        self._synced = -1  # the first sync reads the journal, and the watch counts as busy until it has
        self._next_journal_read = self._read_retry_at = self._retire_at = 0.0
        self.metrics.live_watched.set(0)
        self.metrics.live_namespaces.set(0)

    # ------------------------------------------------------------ which netns are watched

    def sync(self, now: float) -> None:
        """Follow the journal's attachments; close every sandbox whose netns is gone."""
        asked = self._asked
        synced = True
        if (asked != self._synced or now >= self._next_journal_read) and now >= self._read_retry_at:
            self._next_journal_read = now + self.settings.journal_interval
            synced = self._follow_journal(now)
        elif asked != self._synced:
            synced = False  # the read is backing off: still busy
        for path in [p for p, s in self.spaces.items() if s.vanished()]:
            self._vanished(path)
        if self.retiring and now >= self._retire_at:
            self._retire(list(self.retiring.values()))
        self.metrics.live_watched.set(len(self.watch))
        self.metrics.live_namespaces.set(len(self.spaces))
        if synced:
            self._synced = asked

    def _follow_journal(self, now: float) -> bool:
        """Watch what the journal holds now. Events that add or retire attachments wake this at once
        (attachments_changed); what other paths retire (a claim gone, the boot rule) is let go
        within journal_interval, and an observation of a retired row changes nothing meanwhile.
        False when the journal could not be read (this pass is skipped, tried again after a backoff)."""
        try:
            rows = watched_rows(self.journal)
        except JOURNAL_ERRORS as exc:
            self._read_retry_at = now + self._journal_failed("read", exc)
            return False
        self._journal_worked("read")
        current = {w.key: w for w in rows}
        for key in [k for k in self.watch if current.get(k) != self.watch[k]]:
            self._unwatch(key)
        for key in [k for k in self.retiring if current.get(k) != self.retiring[k]]:
            del self.retiring[key]  # a DEL, a GC or a re-ADD got there first
        for key, row in current.items():
            if key not in self.watch and key not in self.retiring:
                self._watch(row, now)
        return True

    def _watch(self, row: Watched, now: float) -> None:
        path = row.netns
        space = self.spaces.get(path)
        if space is None:
            if self.unopenable.get(path, 0.0) > now:
                return
            try:
                space = Sandbox(path, self.settings.netns)
            except (NotANetns, OSError) as exc:
                if gone(path, exc) and os.path.dirname(path) in self.netns_dirs:
                    self._retire([row], at_open=True)
                else:
                    self._unopenable(row, path, exc, now)
                return
            self.unopenable.pop(path, None)
            self.netns_dirs.add(os.path.dirname(path))
            self.spaces[path] = space
            assert self._selector is not None
            self._selector.register(space, selectors.EVENT_READ, path)
        self.watch[row.key] = row
        self.by_space.setdefault(path, set()).add(row.key)
        self.due[path] = now  # read at once: a change between the ADD and the subscription counts too

    def _unopenable(self, row: Watched, path: str, exc: OSError, now: float) -> None:
        first = path not in self.unopenable
        self.unopenable[path] = now + self.settings.retry_unopenable
        if len(self.unopenable) > 4096:  # bounded: the oldest retry is forgotten, tried again next pass
            self.unopenable.pop(next(iter(self.unopenable)))
        if first:
            self.log.info("netns not watchable: the entry keeps what the ADD said", extra={
                "component": "live-watch", "netns": path, "error": exc.strerror or str(exc), **self._fields(row)})

    def _unwatch(self, key: tuple[str, str]) -> None:
        row = self.watch.pop(key, None)
        self.pending.pop(key, None)
        self.held.pop(key, None)
        if row is None:
            return
        keys = self.by_space.get(row.netns, set())
        keys.discard(key)
        if not keys:
            self._close_space(row.netns)

    def _close_space(self, path: str) -> None:
        space = self.spaces.pop(path, None)
        self.by_space.pop(path, None)
        self.due.pop(path, None)
        if space is None:
            return
        if self._selector is not None:
            try:
                self._selector.unregister(space)
            except (KeyError, ValueError):
                pass
        space.close()

    def _vanished(self, path: str) -> None:
        """The runtime removed the sandbox's netns: free it now, retire what it held."""
        rows = [self.watch[k] for k in sorted(self.by_space.get(path, ())) if k in self.watch]
        self._close_space(path)
        for row in rows:
            self.watch.pop(row.key, None)
            self.pending.pop(row.key, None)
            self.held.pop(row.key, None)
        self._retire(rows)

    def _retire(self, rows: list[Watched], at_open: bool = False) -> None:
        """Retire attachments whose netns is gone. Those the journal refuses now are kept in
        `retiring` (never watched again meanwhile) and retried after a backoff by sync."""
        retired, failed = False, False
        for row in rows:
            if failed:  # the journal refused one: the rest wait with it instead of each blocking as long
                self.retiring[row.key] = row
                continue
            try:
                done = retire_vanished(self.journal, row)
            except JOURNAL_ERRORS as exc:
                failed = True
                self.retiring[row.key] = row
                self._retire_at = time.monotonic() + self._journal_failed("retire", exc, netns=row.netns,
                                                                          **self._fields(row))
                continue
            self._journal_worked("retire")
            self.retiring.pop(row.key, None)
            if done:
                retired = True
                self.metrics.live_vanished.inc()
                extra = {"component": "live-watch", "netns": row.netns, **self._fields(row)}
                if at_open:
                    extra["found"] = "gone before the watch opened it"
                self.log.info("sandbox netns removed without DEL: attachment retired", extra=extra)
        if retired:
            self.on_change()

    # ------------------------------------------------------------ journal failures

    def _journal_failed(self, step: str, exc: BaseException, **fields: str) -> float:
        """Count a failed journal step, log it if it starts a streak; the seconds before trying it again."""
        streak = self.failing.setdefault(step, Streak())
        streak.failures += 1
        streak.error = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:300]
        self.metrics.live_journal_errors.labels(step).inc()
        if streak.failures == 1:
            self.log.warning("live watch: journal step failed, retrying", extra={
                "component": "live-watch", "step": step, "error": streak.error, **fields})
        return backoff_delay(streak.failures - 1, self.settings.retry_journal, self.settings.retry_journal_cap)

    def _journal_worked(self, step: str) -> None:
        streak = self.failing.pop(step, None)
        if streak is not None:
            self.log.info("live watch: journal step works again", extra={
                "component": "live-watch", "step": step, "failures": streak.failures})

    # ------------------------------------------------------------ reading and writing

    def _read_space(self, path: str, now: float) -> None:
        space = self.spaces.get(path)
        if space is None:
            return
        if space.vanished():
            self._vanished(path)
            return
        try:
            for key in sorted(self.by_space.get(path, ())):
                row = self.watch.get(key)
                if row is not None:
                    self._consider(row, space, now)
        except JOURNAL_ERRORS as exc:  # read the whole netns again later
            if path in self.spaces:
                self.due[path] = now + self._journal_failed("read", exc, netns=path)
            return
        self._journal_worked("read")

    def _consider(self, row: Watched, space: Sandbox, now: float) -> None:
        """Schedule a write when the netns differs from what is stored: now, or when the hold ends."""
        new, stored = self._observe(row, space)
        if new is None or new == stored:
            self.pending.pop(row.key, None)
            return
        if row.key in self.pending:
            return
        at = max(now, self.held.get(row.key, 0.0))
        if at > now:
            self.metrics.live_debounced.inc()
        self.pending[row.key] = at

    def _observe(self, row: Watched, space: Sandbox) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(live value to store, stored live value); None when the attachment is no longer this row."""
        got = entry_and_live(self.journal, row)
        if got is None:
            self._unwatch(row.key)  # retired or replaced: the next sync watches a replacement
            return None, {}
        entry, stored = got
        try:
            seen = space.observe(row.ifname)
        except OSError as exc:  # the netns is going away under us: its path check decides
            self.log.debug("interface read failed", extra={"component": "live-watch", "error": str(exc),
                                                           **self._fields(row)})
            return None, stored
        return next_live(entry, stored, seen, now_rfc3339(), row.network in self.settings.report_added), stored

    def _write(self, key: tuple[str, str], now: float) -> None:
        row = self.watch.get(key)
        space = self.spaces.get(row.netns) if row is not None else None
        if row is None or space is None:
            return
        try:
            new, stored = self._observe(row, space)  # read again: the latest state is what lands
            if new is None or new == stored:
                return
            written = record_live(self.journal, row, new)
        except JOURNAL_ERRORS as exc:  # still pending: the state the netns shows then is what lands
            if key in self.watch:
                self.pending[key] = now + self._journal_failed("write", exc, **self._fields(row))
            return
        self._journal_worked("write")
        if not written:
            self._unwatch(key)
            return
        self.held[key] = time.monotonic() + self.settings.hold
        reason = change_reason(stored, new)
        self.metrics.interface_changes.labels(reason).inc()
        self.log.info("interface changed in the pod's netns", extra={
            "component": "live-watch", "reason": reason, "state": new.get("state", OK), "ips": new.get("ips", []),
            "added": new.get("added", []),
            **self._fields(row)})
        self.on_change()

    @staticmethod
    def _fields(row: Watched) -> dict[str, str]:
        fields = logs.attachment_fields(claim=row.claim, container_id=row.container_id, ifname=row.ifname)
        if row.pod_name:
            fields["pod"] = f"{row.pod_namespace}/{row.pod_name}"
        return fields

    def busy(self) -> int:
        """Interface reads and writes still to do: a quiet publisher has none (status `quiescent`)."""
        unsynced = 1 if not self.disabled and self._asked != self._synced else 0
        return len(self.due) + len(self.pending) + len(self.retiring) + unsynced

    def state(self) -> dict[str, Any]:
        """For `status` and readiness: is the watch on, and how much does it hold."""
        return {"enabled": not self.disabled, "reason": self.disabled, "attachments": len(self.watch),
                "namespaces": len(self.spaces),
                "journal_errors": {step: streak.error for step, streak in list(self.failing.items())}}


def gone(path: str, exc: OSError) -> bool:
    """The netns path no longer exists, where the publisher sees its directory: the sandbox is gone.

    A path valid at ADD that is missing now was removed by the runtime (a DEL lost while the
    publisher was down). A missing directory says nothing of the sandbox: that netns directory is
    not mounted into the publisher's container, which is a configuration to report, not a removal.
    Nor does an empty directory of the publisher's own image where the runtime's should be mounted:
    the caller retires only in a directory where it has opened a netns (`LiveWatch.netns_dirs`)."""
    return exc.errno == errno.ENOENT and exc.filename == path and os.path.isdir(os.path.dirname(path))
