"""The journal: SQLite (WAL) holding pending events and every attachment's desired state.

An event is acknowledged to the plugin once `append` has committed it: a
commit survives a crash of the publisher process (SQLite WAL), and nothing on
the ADD path waits for an fsync. An OS crash or power loss can lose the last
commits, and exactly those belong to sandboxes the same crash destroyed: at
the first start of a new boot the journal retires every attachment of an
earlier boot (`retire_earlier_boots`, "the boot rule"), and from then on events
of earlier boots change nothing (publisher/reconcile/rules.py). Checkpoints, run by
housekeeping on their own connection, fsync the WAL and the database and so
bound what a power loss can take. `attachments` is the desired state: what this
node wants each claim's status to say. Applies are computed from it, the safety
net and a restart re-apply it, so the API server converges to it whatever happened.

The one deployment where an unsynced commit can outlive its sandboxes' kernel
is a journal the sandboxes' kernel does not hold in its own page cache (a
network or FUSE state directory, a publisher inside a VM-isolated runtime):
there `durable_commits` (publisher/journal/durability.py decides) makes every commit
fsync, as SQLite's synchronous=FULL does.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

from cni_plugin.wire.event import Event, WireError, boot_id, legacy_order
from publisher import limits, logs
from publisher.clock import node_seconds, wall
from publisher.journal import compat
from publisher.journal.order import BootOrder
from publisher.journal.schema import (
    _ATT_COLUMNS,
    META_SCHEMA,
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
    Attachment,
    Pending,
    shard_key,
)


class JournalBusy(sqlite3.OperationalError):
    """The publisher's own write slot (or read connection) was not free within its bound."""


@dataclass(frozen=True)
class DirtyMark:
    """A claim's dirty mark as a reconcile read it before planning (Journal.dirty_mark).

    `gen` 0: not marked. `next_try` is what the mark said then; the reconcile's settle compares
    it to tell its own lease, which it ends, from a schedule someone set since (_clear_dirty).
    """

    gen: int = 0
    next_try: float = 0.0


@dataclass
class WriteState:
    """How the journal's writes are going, read by the probes without any lock."""

    busy_since: float = 0.0  # node time the write in flight began (0: none)
    failing_since: float = 0.0  # node time of the first failure since the last success (0: fine)
    last_error: str = ""


def _create_private(path: str) -> None:
    """Create the database file 0600 before SQLite does (its -wal and -shm copy this mode)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.close(fd)


def _connect(path: str) -> sqlite3.Connection:
    """A journal connection with a bounded page cache (limits.JOURNAL_PAGE_CACHE_KIB)."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute(f"PRAGMA cache_size=-{limits.JOURNAL_PAGE_CACHE_KIB}")
    return db


class Journal:
    """SQLite in WAL mode: one write connection behind a lock, one read connection beside it.

    Readers (workers looking for work, status, /metrics) use their own
    connection, which WAL lets read while a write is in flight, so they never
    queue behind a commit, a prune or another process holding the write lock.
    Writes are short transactions; a write that cannot start (SQLite's busy
    timeout, or our own slot busy past its bound) fails instead of waiting
    forever, and the write state (`writes`) tells health what is going on.
    Times that schedule or prune are node time (clock.node_seconds).
    """

    def __init__(self, state_dir: str, on_fault: Callable[[str], None] | None = None,
                 on_recover: Callable[[], None] | None = None, durable_commits: bool = False) -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(state_dir, "journal.db")
        self.log = logs.get()
        self.writes = WriteState()
        self._on_fault = on_fault or (lambda _msg: None)
        self._on_recover = on_recover or (lambda: None)
        self._lock = threading.RLock()
        self._rlock = threading.Lock()
        _create_private(self.path)  # SQLite gives -wal and -shm the database file's mode
        self._db = _connect(self.path)
        # Another release's journal (a rollback): read what it says before anything writes it.
        self.opening = compat.examine(self._db, self.path)
        if not self.opening.usable:  # a newer schema this release must not write: set aside, start anew
            self._db.close()
            self.opening.set_aside = compat.set_aside(self.path, self.opening.found)
            _create_private(self.path)
            self._db = _connect(self.path)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a commit writes the WAL without fsync (it survives a process crash; the boot
        # rule covers an OS crash). Checkpoints (which fsync) run from housekeeping on their own
        # connection, never inside a commit. FULL only where the journal may outlive the kernel.
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable_commits else 'NORMAL'}")
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.execute(f"PRAGMA journal_size_limit={limits.JOURNAL_WAL_KEEP}")
        self._ckpt_lock = threading.Lock()
        self._ckpt: sqlite3.Connection | None = None
        self._db.execute(f"PRAGMA busy_timeout={int(limits.JOURNAL_BUSY_TIMEOUT * 1000)}")
        self._db.executescript(SCHEMA + META_SCHEMA)
        for table, column, decl in MIGRATIONS:
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        self._take_over()
        self._rdb = _connect(self.path)
        self._rdb.execute("PRAGMA busy_timeout=1000")
        self._rdb.execute("PRAGMA query_only=1")
        self.retired: list[tuple[str, str]] = []  # claims whose attachments the boot rule retired at open
        self.retired_attachments = 0
        self._rebase_clock()
        self.protect()

    def _take_over(self) -> None:
        """Record this release's schema facts, and notice rows an older release wrote.

        A row whose `writer` is below the journal's high-water mark was written by an older
        release after this one (or a newer one) had opened the journal: a rollback and an
        upgrade again. Its claim is marked dirty, so the start-up reconcile checks it against
        the live cluster (pod, reservation, device) again. Every row older than this release is
        then taken over (`writer` set to this schema), so an ordinary upgrade notices nothing
        the next time. One transaction: a crash repeats it all.
        """
        limit = None if self.opening.set_aside else compat.older_writer_limit(self.opening)
        with self._tx() as db:
            if limit is not None:
                rows = db.execute("SELECT claim_namespace, claim_name FROM attachments WHERE writer < ?",
                                  (limit,)).fetchall()
                claims = sorted(set(rows))
                for ns, name in claims:
                    _mark_dirty(db, ns, name, 0.0, keep_later=True)
                self.opening.older_rows, self.opening.older_claims = len(rows), claims
            db.execute("UPDATE attachments SET writer=? WHERE writer < ?", (SCHEMA_VERSION, SCHEMA_VERSION))
            compat.stamp(db, self.opening)
        if self.opening.event:
            self.log.warning("journal written by another release", extra={
                "event": self.opening.event, "found_version": self.opening.found,
                "schema_version": SCHEMA_VERSION, "compatible_since": self.opening.compatible_since,
                "set_aside_to": self.opening.set_aside, "older_rows": self.opening.older_rows,
                "claims": len(self.opening.older_claims)})

    def protect(self) -> None:
        """The database, its WAL and shared-memory file: readable by the owner only."""
        for suffix in ("", "-wal", "-shm"):
            try:
                os.chmod(self.path + suffix, 0o600)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        with self._ckpt_lock:
            if self._ckpt is not None:
                self._ckpt.close()
        with self._lock:
            self._db.close()
        with self._rlock:
            self._rdb.close()

    def _tx(self) -> "_Tx":
        """One write transaction: once committed it survives a crash of this process."""
        return _Tx(self)

    def checkpoint(self) -> None:
        """Copy the WAL into the database (PASSIVE: never blocks a writer), from housekeeping.

        With auto-checkpoint off this is what bounds the WAL; SQLite fsyncs the WAL
        before and the database after, on this connection, so no commit waits for it.
        """
        with self._ckpt_lock:
            if self._ckpt is None:
                self._ckpt = _connect(self.path)
                self._ckpt.execute("PRAGMA busy_timeout=0")
            self._ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """One query on the read connection (fully fetched: no read transaction stays open)."""
        if not self._rlock.acquire(timeout=limits.JOURNAL_READ_WAIT):
            raise JournalBusy(f"journal read connection busy for {limits.JOURNAL_READ_WAIT:.0f}s")
        try:
            return self._rdb.execute(sql, params).fetchall()
        finally:
            self._rlock.release()

    def _wrote(self, exc: BaseException | None) -> None:
        """Track write health; tell the owner on the transitions only (one log line each)."""
        w = self.writes
        if exc is None:
            if w.failing_since:
                w.failing_since, w.last_error = 0.0, ""
                self.log.info("journal writable again")
                self._on_recover()
            return
        w.last_error = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
        if not w.failing_since:
            w.failing_since = node_seconds()
            self.log.error("journal write failed", extra={"error": w.last_error})
        self._on_fault(w.last_error)

    def wedged(self) -> str:
        """Why the journal cannot make progress (liveness), or ""; reads attributes only."""
        now, w = node_seconds(), self.writes
        if w.busy_since and now - w.busy_since > limits.JOURNAL_WEDGED:
            return f"journal: a write has been in flight for {now - w.busy_since:.0f}s"
        if w.failing_since and now - w.failing_since > limits.JOURNAL_WEDGED:
            return f"journal: writes failing for {now - w.failing_since:.0f}s: {w.last_error}"
        return ""

    def probe(self) -> None:
        """An empty write transaction that waits at most JOURNAL_PROBE_WAIT for SQLite's lock.

        Run by housekeeping on every pass, so another process holding the journal's write
        lock (a backup tool, `sqlite3` left in a transaction, a second publisher) shows in
        health within seconds even when no event happens to need a write; an empty
        transaction writes nothing to the WAL and syncs nothing.
        """
        with self._lock:
            self._db.execute(f"PRAGMA busy_timeout={int(limits.JOURNAL_PROBE_WAIT * 1000)}")
            try:
                with self._tx():
                    pass
            finally:
                self._db.execute(f"PRAGMA busy_timeout={int(limits.JOURNAL_BUSY_TIMEOUT * 1000)}")

    def _rebase_clock(self) -> None:
        """At the first open of a boot: rebase stored times, and apply the boot rule.

        Times stored on another boot's CLOCK_BOOTTIME mean nothing now: due times
        become due at once; receive/record/finish times become now, which keeps
        finished events one more retention period and gives pending events a full
        resolve timeout again: late, never early. A journal from before the boot id
        was stored (wall-clock times) is rebased too. The boot rule runs in the same
        transaction, so a crash half-way through repeats both.
        """
        boot = boot_id()
        rows = self._read("SELECT value FROM meta WHERE key='boot_id'")
        if boot and rows and rows[0][0] == boot:
            return
        now = node_seconds()
        with self._tx() as db:
            db.execute("UPDATE events SET next_try=0, received=?,"
                       " finished=CASE WHEN finished IS NULL THEN NULL ELSE ? END", (now, now))
            db.execute("UPDATE dirty SET next_try=0")
            db.execute("UPDATE tombstones SET recorded=?", (now,))
            db.execute("UPDATE fences SET recorded=?", (now,))
            db.execute("UPDATE attachments SET updated=?", (now,))
            if boot:
                self.retired, self.retired_attachments = self._retire_earlier_boots(db, boot)
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('boot_id', ?)", (boot,))
        if self.retired:
            self.log.info("new boot: attachments of earlier boots retired", extra={
                "attachments": self.retired_attachments, "claims": len(self.retired), "boot_id": boot})

    @staticmethod
    def _retire_earlier_boots(db: sqlite3.Connection, boot: str) -> tuple[list[tuple[str, str]], int]:
        """The boot rule: every sandbox of an earlier boot died with that boot.

        Each attachment whose ADD was stamped in another boot (or before stamps
        existed) is removed as its DEL would remove it, and its claim is marked
        dirty, so the start-up retry reconciles it once and the dead sandbox's
        IP/MAC leave the claim. Tombstones and GC fences are of earlier boots too:
        events of earlier boots change nothing any more (publisher/reconcile/rules.py), so
        they protect nothing and go. Returns the claims marked dirty and how many
        attachments went.
        """
        claims: set[tuple[str, str]] = set()
        retired = 0
        for cid, ifname, added, stamp, ns, name in db.execute(
                "SELECT container_id, ifname, added, stamp, claim_namespace, claim_name FROM attachments").fetchall():
            if stamp_boot(added or stamp) == boot:
                continue
            db.execute("DELETE FROM attachments WHERE container_id=? AND ifname=?", (cid, ifname))
            claims.add((ns, name))
            retired += 1
        for ns, name in sorted(claims):
            _mark_dirty(db, ns, name, 0.0, keep_later=True)
        db.execute("DELETE FROM tombstones")
        db.execute("DELETE FROM fences")
        return sorted(claims), retired

    # ------------------------------------------------------------ events

    def append(self, event: Event) -> bool:
        """Commit one event; False when its event_id was seen before (a duplicate).

        Once this returns the event survives a crash of the publisher: the plugin may be acked.
        """
        return self.append_many([event])[0]

    def append_many(self, events: list[Event]) -> list[bool]:
        now = node_seconds()
        added = []
        with self._tx() as db:
            for ev in events:
                cur = db.execute(
                    "INSERT OR IGNORE INTO events(event_id, container_id, ifname, op, shard_key, received, body)"
                    " VALUES (?,?,?,?,?,?,?)",
                    (ev.event_id, ev.container_id, ev.ifname, ev.op, shard_key(ev.container_id), now,
                     json.dumps(ev.to_dict(), separators=(",", ":"))),
                )
                added.append(cur.rowcount == 1)
                if cur.rowcount == 1 and ev.op == "DEL":
                    self._supersede(db, ev, now)
        return added

    def _supersede(self, db: sqlite3.Connection, dele: Event, now: float) -> None:
        """A DEL retires the pending ADD/CHECK of its attachment that happened before it.

        Without this a DEL queued behind an ADD that is backing off (claim not
        allocated yet) would wait up to the resolve timeout; the tombstone the
        DEL leaves would make the ADD a no-op anyway. "Before" is the boot order
        (publisher/journal/order.py), never the wall clock across boots.
        """
        order = self.ordering()
        rows = db.execute(
            "SELECT seq, body FROM events WHERE state='pending' AND container_id=? AND ifname=?"
            " AND op IN ('ADD','CHECK')", (dele.container_id, dele.ifname)).fetchall()
        for seq, body in rows:
            try:
                older = order.before(Event.from_dict(json.loads(body)).order, dele.order)
            except (WireError, ValueError, TypeError, RecursionError):
                continue  # unreadable: the worker fails it (ready); the DEL's ack must not depend on it
            if older:
                db.execute("UPDATE events SET state='done', error='superseded by a later DEL', finished=?"
                           " WHERE seq=?", (now, seq))

    def ready(self, shard: int, shards: int, now: float, limit: int = 64) -> list[Pending]:
        """Pending events of a shard due at `now` (node time), oldest first, one per attachment.

        An event waits while an older event of the same attachment is still
        pending (e.g. backing off), so events of one attachment apply in order.
        """
        rows = self._read(
            "SELECT seq, body, attempts, received FROM events e WHERE state='pending'"
            " AND shard_key % ? = ? AND next_try <= ? AND NOT EXISTS ("
            "  SELECT 1 FROM events p WHERE p.state='pending' AND p.container_id=e.container_id"
            "  AND p.ifname=e.ifname AND p.seq < e.seq)"
            " ORDER BY seq LIMIT ?",
            (shards, shard, now, limit))
        out = []
        for seq, body, attempts, received in rows:
            try:
                out.append(Pending(seq, Event.from_dict(json.loads(body)), attempts, received))
            except (WireError, ValueError, TypeError, RecursionError) as exc:
                self._poisoned(seq, exc)
        return out

    def _poisoned(self, seq: int, exc: Exception) -> None:
        """A journaled event that no longer parses (journaled by a release with looser input
        checks) is failed at once: left pending it would hold its shard's queue forever."""
        logs.get().error("journaled event unreadable, failed", extra={"seq": seq, "error": str(exc)[:300]})
        self.finish(seq, "failed", f"journaled event unreadable: {exc}"[:500])

    def next_due(self, shard: int, shards: int) -> float | None:
        """When the next event of the shard may run: only the head of each attachment's
        queue counts (an event waiting behind a backing-off one is not due, or the
        worker would spin on it)."""
        return self._read(
            "SELECT MIN(next_try) FROM events e WHERE state='pending' AND shard_key % ? = ? AND NOT EXISTS ("
            "  SELECT 1 FROM events p WHERE p.state='pending' AND p.container_id=e.container_id"
            "  AND p.ifname=e.ifname AND p.seq < e.seq)", (shards, shard))[0][0]

    def reschedule(self, seq: int, next_try: float, error: str) -> None:
        """Try the event again at `next_try` (node time)."""
        with self._tx() as db:
            db.execute("UPDATE events SET attempts=attempts+1, next_try=?, error=? WHERE seq=?", (next_try, error, seq))

    def finish(
        self,
        seq: int | None,
        state: str = "done",
        error: str = "",
        upsert: list[Attachment] | None = None,
        delete: list[tuple[str, str]] | None = None,
        tombstone: tuple[tuple[str, str], list] | None = None,
        fence: tuple[str, str, list, list] | None = None,
        dirty: list[tuple[str, str]] | None = None,
        lease: float = 0.0,
    ) -> None:
        """Mark an event handled and change the desired state, in one transaction.

        `dirty` claims are the ones whose status must be reconciled with the new
        desired state; they stay marked until a reconcile that planned after this
        commit succeeds, so a crash between this commit and the apply loses nothing.
        `lease` (seconds): the calling thread reconciles these claims itself right
        after the commit (or holds the apply that long, publisher/reconcile/rules.py),
        so housekeeping leaves the marks alone for that long instead of reading the
        same claim a second time; a mark that outlives the lease (the thread died, or
        its reconcile failed) is retried by housekeeping. Without a lease the change is
        only recorded for housekeeping: due now, unless the mark is already due later
        (a sibling hold, a backoff with its Retry-After floor), which it keeps.
        """
        now = node_seconds()
        with self._tx() as db:
            for key in delete or []:
                db.execute("DELETE FROM attachments WHERE container_id=? AND ifname=?", key)
            for att in upsert or []:
                self._put(db, att, now)
            if tombstone is not None:
                (cid, ifname), stamp = tombstone
                db.execute("INSERT OR REPLACE INTO tombstones(container_id, ifname, stamp, recorded) VALUES (?,?,?,?)",
                           (cid, ifname, json.dumps(stamp), now))
            if fence is not None:
                driver, network, stamp, valid = fence
                db.execute("INSERT INTO fences(driver, network, stamp, valid, recorded) VALUES (?,?,?,?,?)",
                           (driver, network, json.dumps(stamp), json.dumps(valid), now))
            for ns, name in dirty or []:
                _mark_dirty(db, ns, name, now + lease if lease else 0.0, keep_later=not lease)
            if seq is not None:
                db.execute("UPDATE events SET state=?, error=?, finished=? WHERE seq=?", (state, error, now, seq))

    def adopt(self, atts: list[Attachment], claims: list[tuple[str, str]]) -> int:
        """Attachments rebuilt from the live cluster after a set-aside (publisher/repair/rebuild.py).

        In one transaction: each is written unless the journal already has its row or a DEL's
        tombstone (an event handled since is newer than anything rebuilt), and every claim is
        marked dirty, so the start-up reconcile shows the rebuilt entries and removes the rest
        of this node's. Returns how many were written.
        """
        now, written = node_seconds(), 0
        with self._tx() as db:
            for att in atts:
                if db.execute("SELECT 1 FROM attachments WHERE container_id=? AND ifname=? UNION ALL"
                              " SELECT 1 FROM tombstones WHERE container_id=? AND ifname=?",
                              (*att.key, *att.key)).fetchone():
                    continue
                self._put(db, att, now)
                written += 1
            for ns, name in claims:
                _mark_dirty(db, ns, name, 0.0, keep_later=True)
        return written

    def forget(self, keys: list[tuple[str, str]]) -> None:
        with self._tx() as db:
            for key in keys:
                db.execute("DELETE FROM attachments WHERE container_id=? AND ifname=?", key)

    def prune(self, now: float | None = None) -> int:
        """Drop events finished DONE_RETENTION ago, in small transactions: an ack waiting for
        the write slot never waits behind a whole day of events being deleted."""
        cutoff = (node_seconds() if now is None else now) - limits.DONE_RETENTION
        total = 0
        while True:
            with self._tx() as db:
                n = db.execute("DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE state != 'pending'"
                               " AND finished < ? LIMIT ?)", (cutoff, limits.PRUNE_BATCH)).rowcount
            total += n
            if n < limits.PRUNE_BATCH:
                return total
            time.sleep(0)  # let a waiting writer (an ack) take the slot between batches

    # ------------------------------------------------------------ tombstones, fences, dirty claims

    def tombstone(self, container_id: str, ifname: str) -> list | None:
        """The stamp of the latest DEL of this attachment, if one is remembered."""
        rows = self._read("SELECT stamp FROM tombstones WHERE container_id=? AND ifname=?", (container_id, ifname))
        return json.loads(rows[0][0]) if rows else None

    def fences(self, driver: str) -> list[tuple[str, list, set[tuple[str, str]]]]:
        """(network, stamp, valid keys) of the remembered GCs of this driver."""
        rows = self._read("SELECT network, stamp, valid FROM fences WHERE driver=? ORDER BY id", (driver,))
        return [(net, json.loads(stamp), {(a["containerID"], a["ifname"]) for a in json.loads(valid)})
                for net, stamp, valid in rows]

    def prune_order_marks(self, cutoff: float) -> int:
        """Forget tombstones and GC fences recorded before `cutoff` that no pending event can
        still need, and keep at most MAX_FENCES fences per driver and network in any case.

        The caller picks `cutoff` = min(now, last complete spool ingestion) minus
        limits.ORDER_HORIZON: by then any event stamped before the mark has reached
        the journal (socket or spool), see docs/design.md "Order". A pending event
        received within the horizon after a mark may be older than it, so that mark
        stays; one event retried for hours holds back only the marks recorded before
        it arrived, never the cap.
        """
        with self._tx() as db:
            oldest = db.execute("SELECT MIN(received) FROM events WHERE state='pending'").fetchone()[0]
            keep_after = cutoff if oldest is None else min(cutoff, oldest - limits.ORDER_HORIZON)
            n = db.execute("DELETE FROM tombstones WHERE recorded < ?", (keep_after,)).rowcount
            n += db.execute("DELETE FROM fences WHERE recorded < ?", (keep_after,)).rowcount
            # A flood of GCs: keep the newest few per driver and network, whatever their age.
            n += db.execute(
                "DELETE FROM fences WHERE id NOT IN (SELECT id FROM fences f WHERE"
                " (SELECT COUNT(*) FROM fences g WHERE g.driver=f.driver AND g.network=f.network AND g.id > f.id) < ?)",
                (limits.MAX_FENCES,)).rowcount
            return n

    def order_marks(self) -> tuple[int, int]:
        [(t, f)] = self._read("SELECT (SELECT COUNT(*) FROM tombstones), (SELECT COUNT(*) FROM fences)")
        return t, f

    def dirty_claims(self, now: float | None = None) -> list[tuple[str, str, int]]:
        """(ns, name, attempts) of the claims to reconcile due at `now` (node time; all with now=None)."""
        if now is None:
            return self._read("SELECT claim_namespace, claim_name, attempts FROM dirty ORDER BY 1, 2")
        return self._read("SELECT claim_namespace, claim_name, attempts FROM dirty WHERE next_try <= ?"
                          " ORDER BY next_try", (now,))

    def next_dirty(self) -> float | None:
        return self._read("SELECT MIN(next_try) FROM dirty")[0][0]

    def dirty_mark(self, ns: str, name: str) -> DirtyMark:
        """The claim's dirty mark (generation 0: not marked); read before planning a reconcile."""
        rows = self._read("SELECT gen, next_try FROM dirty WHERE claim_namespace=? AND claim_name=?", (ns, name))
        return DirtyMark(*rows[0]) if rows else DirtyMark()

    def settle(self, ns: str, name: str, delete: list[tuple[str, str]], upsert: list[Attachment],
               applied: str | None, mark: DirtyMark | None = None) -> None:
        """After a successful reconcile, in one transaction: forget/move attachments, remember
        the applied body's hash, and clear the claim's dirty mark, unless it was marked again
        after the reconcile read `mark` (dirty_mark): that change is not in what was applied."""
        now = node_seconds()
        with self._tx() as db:
            for key in delete:
                db.execute("DELETE FROM attachments WHERE container_id=? AND ifname=?", key)
            for att in upsert:
                self._put(db, att, now)
            if applied is not None:
                db.execute("INSERT OR REPLACE INTO applied(claim, body_hash) VALUES (?,?)", (f"{ns}/{name}", applied))
            _clear_dirty(db, ns, name, mark, now)

    def clean(self, ns: str, name: str, mark: DirtyMark | None = None) -> None:
        """Clear the claim's dirty mark (only up to the generation of `mark`, when given)."""
        with self._tx() as db:
            _clear_dirty(db, ns, name, mark, node_seconds())

    def retry_dirty(self, ns: str, name: str, next_try: float) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO dirty(claim_namespace, claim_name, gen) VALUES (?,?,1)", (ns, name))
            db.execute("UPDATE dirty SET attempts=attempts+1, next_try=? WHERE claim_namespace=? AND claim_name=?",
                       (next_try, ns, name))

    def depth(self) -> int:
        return self._read("SELECT COUNT(*) FROM events WHERE state='pending'")[0][0]

    def oldest_received(self) -> float | None:
        """Node time the oldest pending event was received (for its age), or None."""
        rows = self._read("SELECT received FROM events WHERE state='pending' ORDER BY seq LIMIT 1")
        return rows[0][0] if rows else None

    def oldest_pending(self) -> dict[str, Any] | None:
        """The oldest pending event for people: its age by node time, `received` as wall time."""
        rows = self._read(
            "SELECT event_id, op, container_id, ifname, received, attempts, error FROM events"
            " WHERE state='pending' ORDER BY seq LIMIT 1")
        if not rows:
            return None
        keys = ("event_id", "op", "containerID", "ifname", "received", "attempts", "last_error")
        out = dict(zip(keys, rows[0]))
        age = max(0.0, node_seconds() - out["received"])
        out["age_seconds"] = round(age, 3)
        out["received"] = round(wall() - age, 3)
        return out

    def failed(self, limit: int = 20) -> list[dict[str, Any]]:
        """Recently dropped events; `finished` is shown as wall time."""
        rows = self._read(
            "SELECT event_id, op, container_id, ifname, finished, error FROM events"
            " WHERE state='failed' ORDER BY seq DESC LIMIT ?", (limit,))
        keys = ("event_id", "op", "containerID", "ifname", "finished", "error")
        now, node = wall(), node_seconds()
        return [dict(zip(keys, r[:4] + (round(now - (node - (r[4] or node)), 3),) + r[5:])) for r in rows]

    # ------------------------------------------------------------ attachments

    @staticmethod
    def _put(db: sqlite3.Connection, att: Attachment, now: float) -> None:
        att.updated = now
        att.writer = SCHEMA_VERSION
        values = [getattr(att, c) for c in _ATT_COLUMNS]
        values[_ATT_COLUMNS.index("entry")] = json.dumps(att.entry, separators=(",", ":"), sort_keys=True)
        values[_ATT_COLUMNS.index("stamp")] = json.dumps(att.stamp or legacy_order(att.event_ts))
        values[_ATT_COLUMNS.index("added")] = json.dumps(att.added or att.stamp or legacy_order(att.event_ts))
        live = json.dumps(att.live, separators=(",", ":"), sort_keys=True) if att.live else ""
        values[_ATT_COLUMNS.index("live")] = live
        db.execute(
            f"INSERT OR REPLACE INTO attachments({','.join(_ATT_COLUMNS)}) "
            f"VALUES ({','.join('?' * len(_ATT_COLUMNS))})",
            values,
        )

    def _rows(self, where: str, params: tuple[Any, ...]) -> list[Attachment]:
        rows = self._read(
            f"SELECT {','.join(_ATT_COLUMNS)} FROM attachments {where} ORDER BY claim_namespace, claim_name,"
            " driver, pool, device", params)
        out = []
        for row in rows:
            att = Attachment(*row)
            att.entry = json.loads(att.entry)  # type: ignore[arg-type]
            raw = att.stamp
            att.stamp = json.loads(raw) if raw else legacy_order(att.event_ts)  # type: ignore[arg-type]
            raw = att.added
            att.added = json.loads(raw) if raw else att.stamp  # type: ignore[arg-type]
            att.live = json.loads(att.live) if att.live else {}  # type: ignore[arg-type]
            out.append(att)
        return out

    def attachment(self, container_id: str, ifname: str) -> Attachment | None:
        rows = self._rows("WHERE container_id=? AND ifname=?", (container_id, ifname))
        return rows[0] if rows else None

    def for_claim(self, claim_namespace: str, claim_name: str) -> list[Attachment]:
        return self._rows("WHERE claim_namespace=? AND claim_name=?", (claim_namespace, claim_name))

    def all_attachments(self) -> list[Attachment]:
        return self._rows("", ())

    def attachment_count(self) -> int:
        return self._read("SELECT COUNT(*) FROM attachments")[0][0]

    def claims(self) -> list[tuple[str, str]]:
        """Every claim with an attachment or still to be reconciled."""
        return self._read("SELECT claim_namespace, claim_name FROM attachments UNION"
                          " SELECT claim_namespace, claim_name FROM dirty ORDER BY 1, 2")

    def dirty_count(self) -> int:
        return self._read("SELECT COUNT(*) FROM dirty")[0][0]

    def claim_count(self) -> int:
        """How many claims claims() would list, without listing them (the node's heartbeat reads it)."""
        return self._read("SELECT COUNT(*) FROM (SELECT claim_namespace, claim_name FROM attachments UNION"
                          " SELECT claim_namespace, claim_name FROM dirty)")[0][0]

    # ------------------------------------------------------------ applied bodies

    def applied_hashes(self) -> dict[str, str]:
        return dict(self._read("SELECT claim, body_hash FROM applied"))

    def set_applied(self, claim: str, body_hash: str | None) -> None:
        """Remember what was last applied, so a restart does not re-send unchanged claims."""
        with self._tx() as db:
            if body_hash is None:
                db.execute("DELETE FROM applied WHERE claim=?", (claim,))
            else:
                db.execute("INSERT OR REPLACE INTO applied(claim, body_hash) VALUES (?,?)", (claim, body_hash))

    # ------------------------------------------------------------ boots (ranked by publisher/journal/order.py)

    _boot_order: BootOrder | None = None

    def boot_seq(self, boot_id: str) -> tuple[int, bool]:
        """The sequence number of a boot id, given the next one when it is first seen.

        Returns (seq, committed): inside the write transaction of a DEL's intake
        (_supersede) the new row commits or rolls back with it, so the caller must
        not cache it; otherwise it is committed in its own transaction.
        """
        with self._lock:
            if self._db.in_transaction:
                return _boot_row(self._db, boot_id), False
        with self._tx() as db:
            return _boot_row(db, boot_id), True

    def ordering(self) -> BootOrder:
        """This journal's BootOrder (publisher/journal/order.py); the first call registers the current boot."""
        with self._lock:
            if self._boot_order is None:
                self._boot_order = BootOrder(self)
            return self._boot_order

    def atomically(self) -> AbstractContextManager[Any]:
        """Held around a read-check-commit sequence (an ordering rule checks staleness and
        commits): no other journal reader or writer runs in between."""
        return self._lock


class _Tx:
    """One write transaction. Whatever fails (our slot busy, BEGIN refused after SQLite's busy
    timeout, COMMIT failing), the slot is released and the connection is out of any
    transaction afterwards: one failure never wedges the journal."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def __enter__(self) -> sqlite3.Connection:
        j = self.journal
        if not j._lock.acquire(timeout=limits.JOURNAL_LOCK_WAIT):
            exc = JournalBusy(f"journal write slot busy for {limits.JOURNAL_LOCK_WAIT:.0f}s")
            j._wrote(exc)
            raise exc
        try:
            j.writes.busy_since = node_seconds()
            j._db.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            self._end(exc)
            raise
        return j._db

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        db = self.journal._db
        try:
            db.execute("ROLLBACK" if exc_type else "COMMIT")
        except BaseException as end_exc:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            self._end(end_exc)
            raise
        self._end(exc if isinstance(exc, sqlite3.Error) else None)

    def _end(self, exc: BaseException | None) -> None:
        j = self.journal
        j.writes.busy_since = 0.0
        try:
            j._wrote(exc if exc is None or isinstance(exc, (sqlite3.Error, OSError)) else None)
        finally:
            j._lock.release()

def _boot_row(db: sqlite3.Connection, boot_id: str) -> int:
    """The boots row of `boot_id`, inserted with the next sequence number when new."""
    db.execute("INSERT OR IGNORE INTO boots(boot_id, first_seen) VALUES (?,?)", (boot_id, time.time()))
    return db.execute("SELECT seq FROM boots WHERE boot_id=?", (boot_id,)).fetchone()[0]


def stamp_boot(raw: str) -> str:
    """The boot id of a stored stamp ('' for a legacy one or one that does not parse)."""
    try:
        stamp = json.loads(raw) if raw else None
    except ValueError:
        return ""
    return stamp[0] if isinstance(stamp, list) and stamp and isinstance(stamp[0], str) else ""


def _mark_dirty(db: sqlite3.Connection, ns: str, name: str, next_try: float, keep_later: bool = False) -> None:
    """Mark a claim to reconcile, with a new generation: a reconcile that planned with an older
    generation must not clear the mark (Journal.settle), the change came after its plan.

    The mark is due at `next_try`. With `keep_later` (a change recorded for housekeeping: the
    live watch, a claim window, a deleted pod, the boot rule) a mark already due later keeps its
    time: a sibling hold (one apply per sandbox), a backoff and its Retry-After floor (the server
    asked for that wait), or the lease of a thread reconciling the claim right now, which ends the
    lease when it settles (_clear_dirty). Without it (the thread that committed the change
    reconciles or holds the claim itself) `next_try` replaces the mark's time.
    """
    when = "MAX(dirty.next_try, excluded.next_try)" if keep_later else "excluded.next_try"
    db.execute("INSERT INTO dirty(claim_namespace, claim_name, next_try, gen) VALUES (?,?,?,1)"
               f" ON CONFLICT(claim_namespace, claim_name) DO UPDATE SET gen=gen+1, next_try={when}",
               (ns, name, next_try))


def _clear_dirty(db: sqlite3.Connection, ns: str, name: str, mark: DirtyMark | None, now: float) -> None:
    """Clear the mark a reconcile planned with (all of it without `mark`).

    A mark made after the plan stays. If it still carries the time the plan saw and that is
    later than now, that time is the reconciling thread's own lease (a change recorded since
    keeps it, _mark_dirty): the lease ends here and the change is due now, instead of when the
    lease would have run out. A time set since (another thread's lease, a hold, a retry) stays.
    """
    if mark is None:
        db.execute("DELETE FROM dirty WHERE claim_namespace=? AND claim_name=?", (ns, name))
        return
    db.execute("DELETE FROM dirty WHERE claim_namespace=? AND claim_name=? AND gen<=?", (ns, name, mark.gen))
    if mark.next_try > now:
        db.execute("UPDATE dirty SET next_try=0 WHERE claim_namespace=? AND claim_name=? AND next_try=?",
                   (ns, name, mark.next_try))
