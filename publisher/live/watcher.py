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
one apply per hold, and the latest state always lands at the end of it.

It never keeps a netns alive: every `sync_interval` each netns path is
checked against the inode the sockets were opened on, and a sandbox whose
path is gone has its sockets closed and its attachments retired (the runtime
removed it; a DEL that never came changes nothing). A path that cannot be
opened at all (not visible to the publisher, not a netns) leaves that
attachment as the ADD said, and is tried again later. Without the right to
enter namespaces (CAP_SYS_ADMIN) the watch is off and says why: the
publisher works as it did before.
"""

from __future__ import annotations

import errno
import os
import selectors
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from cni_plugin.netns import CLONE_NEWNET, setns

from publisher import logs
from publisher.journal.livestate import Watched, entry_and_live, record_live, retire_vanished, watched_rows
from publisher.journal.store import Journal
from publisher.live.sandbox import NotANetns, Sandbox
from publisher.live.status import OK, next_live
from publisher.reconcile.mapper import now_rfc3339


@dataclass
class LiveSettings:
    enabled: bool = True
    sync_interval: float = 1.0  # seconds between netns liveness checks (a stat per watched netns)
    journal_interval: float = 10.0  # seconds between full re-reads of the journal (committed events wake it at once)
    settle: float = 0.1  # seconds after a notification before the interface is read
    hold: float = 3.0  # seconds after a write before the same attachment is written again
    retry_unopenable: float = 30.0  # seconds before a netns path that could not be opened is tried again


def change_reason(stored: dict[str, Any], new: dict[str, Any]) -> str:
    """The metric label of a write: the new unready reason, or what changed."""
    if new.get("state", OK) != OK:
        return new["state"]
    if stored.get("state", OK) != OK:
        return "Recovered"
    if stored.get("ips") != new.get("ips"):
        return "AddressesChanged"
    if stored.get("mac") != new.get("mac"):
        return "MacChanged"
    return "Changed"


def can_enter_namespaces() -> str:
    """'' when this process may setns(2) into a network namespace, else why not."""
    try:
        fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open its own netns: {exc.strerror}"
    try:
        setns(fd, CLONE_NEWNET)  # into the namespace it is already in: a no-op that needs the right
    except OSError as exc:
        if exc.errno == errno.EPERM:
            return "setns refused (EPERM): the publisher needs CAP_SYS_ADMIN to enter pods' network namespaces"
        return f"setns failed: {exc}"
    finally:
        os.close(fd)
    return ""


class LiveWatch:
    def __init__(self, journal: Journal, metrics: Any, on_change: Callable[[], None],
                 stopping: threading.Event, settings: LiveSettings | None = None) -> None:
        self.journal = journal
        self.metrics = metrics
        self.on_change = on_change
        self.stopping = stopping
        self.settings = settings or LiveSettings()
        self.log = logs.get()
        self.disabled = "" if self.settings.enabled else "turned off (--no-live-watch)"
        self.spaces: dict[str, Sandbox] = {}
        self.watch: dict[tuple[str, str], Watched] = {}
        self.by_space: dict[str, set[tuple[str, str]]] = {}
        self.due: dict[str, float] = {}  # netns path -> when to read its interfaces
        self.pending: dict[tuple[str, str], float] = {}  # attachment -> when to write it
        self.held: dict[tuple[str, str], float] = {}  # attachment -> end of its hold after a write
        self.unopenable: dict[str, float] = {}  # netns path -> when to try opening it again
        self._selector: selectors.BaseSelector | None = None
        # Attachments committed since the last sync: asked counts calls, synced the count the last sync began at.
        self._asked = 0
        self._asked_lock = threading.Lock()
        self._synced = 0
        self._next_journal_read = 0.0
        self._wakeup: tuple[int, int] | None = None  # a pipe that ends the loop's wait when attachments change

    def attachments_changed(self) -> None:
        """An event was committed: sync now rather than at the next interval (called by the workers).

        Until that sync has run the watch counts as busy, so a publisher is not called quiet
        while a new attachment's interface has not been looked at."""
        with self._asked_lock:  # several workers call this: no increment may be lost
            self._asked += 1
        if self._wakeup is not None:
            try:
                os.write(self._wakeup[1], b"\0")
            except (BlockingIOError, OSError):  # full: a wakeup is pending anyway; closed: stopping
                pass

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        if not self.disabled:
            self.disabled = can_enter_namespaces()
        if self.disabled:
            self.log.warning("live interface watch is off: entries keep what the ADD said",
                             extra={"component": "live-watch", "reason": self.disabled})
            self.stopping.wait()
            return
        self._selector = selectors.DefaultSelector()
        self._wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wakeup[0], selectors.EVENT_READ, None)
        try:
            self._loop()
        finally:
            self.close()

    def _loop(self) -> None:
        assert self._selector is not None
        next_sync = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            wake = min([next_sync, *self.due.values(), *self.pending.values()])
            for key, _mask in self._selector.select(max(0.0, min(wake - now, self.settings.sync_interval))):
                if key.data is None:  # attachments_changed(): drained here, synced below
                    self._drain_wakeup()
                    next_sync = 0.0
                    continue
                space = self.spaces.get(key.data)
                if space is not None and space.drain():
                    self.due[key.data] = min(self.due.get(key.data, float("inf")),
                                             time.monotonic() + self.settings.settle)
            now = time.monotonic()
            if now >= next_sync or self._asked != self._synced:
                self.sync(now)
                next_sync = now + self.settings.sync_interval
            for path in [p for p, t in self.due.items() if t <= now]:
                self.due.pop(path, None)
                self._read_space(path, now)
            for key in [k for k, t in self.pending.items() if t <= now]:
                self.pending.pop(key, None)
                self._write(key)

    def _drain_wakeup(self) -> None:
        assert self._wakeup is not None
        try:
            while os.read(self._wakeup[0], 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for path in list(self.spaces):
            self._close_space(path)
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if self._wakeup is not None:
            wakeup, self._wakeup = self._wakeup, None
            for fd in wakeup:
                os.close(fd)

    # ------------------------------------------------------------ which netns are watched

    def sync(self, now: float) -> None:
        """Follow the journal's attachments; close every sandbox whose netns is gone."""
        asked = self._asked
        if asked != self._synced or now >= self._next_journal_read:
            self._next_journal_read = now + self.settings.journal_interval
            self._follow_journal(now)
        for path in [p for p, s in self.spaces.items() if s.vanished()]:
            self._vanished(path)
        self.metrics.live_watched.set(len(self.watch))
        self.metrics.live_namespaces.set(len(self.spaces))
        self._synced = asked

    def _follow_journal(self, now: float) -> None:
        """Watch what the journal holds now. Events that add or retire attachments wake this at once
        (attachments_changed); what other paths retire (a claim gone, the boot rule) is let go
        within journal_interval, and an observation of a retired row changes nothing meanwhile."""
        current = {w.key: w for w in watched_rows(self.journal)}
        for key in [k for k in self.watch if current.get(k) != self.watch[k]]:
            self._unwatch(key)
        for key, row in current.items():
            if key not in self.watch:
                self._watch(row, now)

    def _watch(self, row: Watched, now: float) -> None:
        path = row.netns
        space = self.spaces.get(path)
        if space is None:
            if self.unopenable.get(path, 0.0) > now:
                return
            try:
                space = Sandbox(path)
            except (NotANetns, OSError) as exc:
                self._unopenable(row, path, exc, now)
                return
            self.unopenable.pop(path, None)
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
        retired = False
        for row in rows:
            self.watch.pop(row.key, None)
            self.pending.pop(row.key, None)
            self.held.pop(row.key, None)
            if retire_vanished(self.journal, row):
                retired = True
                self.metrics.live_vanished.inc()
                self.log.info("sandbox netns removed without DEL: attachment retired", extra={
                    "component": "live-watch", "netns": path, **self._fields(row)})
        if retired:
            self.on_change()

    # ------------------------------------------------------------ reading and writing

    def _read_space(self, path: str, now: float) -> None:
        space = self.spaces.get(path)
        if space is None:
            return
        if space.vanished():
            self._vanished(path)
            return
        for key in sorted(self.by_space.get(path, ())):
            row = self.watch.get(key)
            if row is not None:
                self._consider(row, space, now)

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
        return next_live(entry, stored, seen, now_rfc3339()), stored

    def _write(self, key: tuple[str, str]) -> None:
        row = self.watch.get(key)
        space = self.spaces.get(row.netns) if row is not None else None
        if row is None or space is None:
            return
        new, stored = self._observe(row, space)  # read again: the latest state is what lands
        if new is None or new == stored:
            return
        if not record_live(self.journal, row, new):
            self._unwatch(key)
            return
        self.held[key] = time.monotonic() + self.settings.hold
        reason = change_reason(stored, new)
        self.metrics.interface_changes.labels(reason).inc()
        self.log.info("interface changed in the pod's netns", extra={
            "component": "live-watch", "reason": reason, "state": new.get("state", OK), "ips": new.get("ips", []),
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
        return len(self.due) + len(self.pending) + unsynced

    def state(self) -> dict[str, Any]:
        """For `status` and readiness: is the watch on, and how much does it hold."""
        return {"enabled": not self.disabled, "reason": self.disabled, "attachments": len(self.watch),
                "namespaces": len(self.spaces)}
