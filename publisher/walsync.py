"""Group commit for the journal: commits write the WAL, one fsync makes many of them durable.

With `synchronous=FULL` every commit fsyncs the WAL while it holds SQLite's
write lock, so on a disk busy with someone else's writeback each ack waits for
its own fsync and every later writer (the worker's "applied" marks, the next
ack) waits behind it: measured here, hand-off to visible rose to 11x a bare
apply loop under IO pressure. Instead the journal commits with
`synchronous=NORMAL` (consistent, not yet durable) and whoever must be durable
(an ack, a spool file about to be deleted) waits here: the first waiter
fsyncs the WAL for everyone committed so far, later ones ride along on the
next fsync. Nothing waits for an fsync while holding a lock, and the worker
starts resolving and applying while the fsync is in flight.

Why fsync of our own descriptor is enough: in WAL mode a commit is complete
once its frames (and the header) are in the -wal file; SQLite's recovery
replays every frame up to the last valid commit. SQLite itself syncs the WAL
before a checkpoint copies it and the database after, so older, checkpointed
commits stay durable. The -wal file keeps its inode while the publisher holds
its connections open; `_fd` is reopened when the inode changed anyway.
"""

from __future__ import annotations

import os
import threading

from .clock import node_seconds


class DurabilityTimeout(OSError):
    """The WAL could not be synced within the bound: the caller must not ack."""


class GroupSync:
    def __init__(self, wal_path: str, db_path: str) -> None:
        self.wal_path = wal_path
        self.db_path = db_path
        self._cond = threading.Condition()
        self._written = 0  # commits whose frames are in the WAL (page cache)
        self._synced = 0  # commits known to be on disk
        self._syncing = False
        self._fd = -1
        self.syncing_since = 0.0  # node time the fsync in flight began (0: none), for liveness

    def committed(self) -> None:
        """Called right after each COMMIT, under the journal's write slot (so in commit order)."""
        with self._cond:
            self._written += 1

    def wait(self, timeout: float) -> None:
        """Return once every commit made before the call is on disk; raise otherwise."""
        deadline = node_seconds() + timeout
        with self._cond:
            ticket = self._written
            while self._synced < ticket:
                if not self._syncing:
                    self._lead()
                    continue
                left = deadline - node_seconds()
                if left <= 0:
                    raise DurabilityTimeout(f"journal fsync did not finish within {timeout:.0f}s")
                self._cond.wait(left)

    def _lead(self) -> None:
        """Sync for everyone committed so far (called with the condition held; releases it meanwhile)."""
        target = self._written
        self._syncing, self.syncing_since = True, node_seconds()
        self._cond.release()
        try:
            self._fsync()
        finally:
            self._cond.acquire()
            self._syncing, self.syncing_since = False, 0.0
            self._cond.notify_all()
        self._synced = max(self._synced, target)

    def _fsync(self) -> None:
        """fsync the WAL; with no WAL (all checkpointed and removed) the database file itself."""
        path = self.wal_path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            path = self.db_path
            st = os.stat(path)
        if self._fd < 0 or os.fstat(self._fd).st_ino != st.st_ino:
            self._reset()
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        os.fsync(self._fd)

    def _reset(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        with self._cond:
            self._reset()

