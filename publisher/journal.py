"""The journal: SQLite (WAL) holding pending events and every attachment's desired state.

An event is acknowledged to the plugin only after `append` committed it and
`flush` made that commit durable (publisher/walsync.py: one fsync for all the
commits waiting), so once the plugin's ADD has returned, the event survives a
publisher crash or a node reboot. `attachments` is the desired state: what this node wants each
claim's status to say. Applies are computed from it, resync re-applies it, and
a restart re-applies it, so the API server converges to it whatever happened.
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

from . import limits, logs
from .clock import node_seconds, wall
from .journal_schema import (MIGRATIONS, META_SCHEMA, SCHEMA, _ATT_COLUMNS, Attachment,  # noqa: F401
                             Pending, shard_key)
from .order import BootOrder
from .walsync import GroupSync
from cni_plugin.wire import Event, WireError, _boot_id, legacy_order


class JournalBusy(sqlite3.OperationalError):
    """The publisher's own write slot (or read connection) was not free within its bound."""


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
                 on_recover: Callable[[], None] | None = None) -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(state_dir, "journal.db")
        self.log = logs.get()
        self.writes = WriteState()
        self._on_fault = on_fault or (lambda _msg: None)
        self._on_recover = on_recover or (lambda: None)
        self._lock = threading.RLock()
        self._rlock = threading.Lock()
        _create_private(self.path)  # SQLite gives -wal and -shm the database file's mode
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a commit writes the WAL without fsync; `flush` makes it durable (group commit),
        # so no lock is ever held across an fsync. Checkpoints (which fsync) run from
        # housekeeping on their own connection, never inside a commit.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.execute(f"PRAGMA journal_size_limit={limits.JOURNAL_WAL_KEEP}")
        self._sync = GroupSync(self.path + "-wal", self.path)
        self._ckpt_lock = threading.Lock()
        self._ckpt: sqlite3.Connection | None = None
        self._sync_failing = False  # the last fsync failed: a commit alone does not clear the fault
        self._db.execute(f"PRAGMA busy_timeout={int(limits.JOURNAL_BUSY_TIMEOUT * 1000)}")
        self._db.executescript(SCHEMA + META_SCHEMA)
        for table, column, decl in MIGRATIONS:
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        self._rdb = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._rdb.execute("PRAGMA busy_timeout=1000")
        self._rdb.execute("PRAGMA query_only=1")
        self._rebase_clock()
        self.protect()

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
        self._sync.close()

    def _tx(self) -> "_Tx":
        """One write transaction; durable only after `flush` (an ack depends on it). Other
        commits can be lost in a crash without harm: replaying the events redoes them."""
        return _Tx(self)

    def flush(self) -> None:
        """Wait until every commit made so far is on disk (shared fsync); raise if it cannot be."""
        try:
            self._sync.wait(limits.JOURNAL_LOCK_WAIT)
        except OSError as exc:
            self._sync_failing = True  # commits still succeed, but nothing is durable: stay faulty
            self._wrote(exc)
            raise
        if self._sync_failing:
            self._sync_failing = False
            self._wrote(None)

    def checkpoint(self) -> None:
        """Copy the WAL into the database (PASSIVE: never blocks a writer), from housekeeping.

        With auto-checkpoint off this is what bounds the WAL; SQLite fsyncs the WAL
        before and the database after, on this connection, so no commit waits for it.
        """
        with self._ckpt_lock:
            if self._ckpt is None:
                self._ckpt = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
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
            if w.failing_since and not self._sync_failing:
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
        if self._sync.syncing_since and now - self._sync.syncing_since > limits.JOURNAL_WEDGED:
            return f"journal: an fsync has been in flight for {now - self._sync.syncing_since:.0f}s"
        if w.failing_since and now - w.failing_since > limits.JOURNAL_WEDGED:
            return f"journal: writes failing for {now - w.failing_since:.0f}s: {w.last_error}"
        return ""

    def probe(self) -> None:
        """An empty write transaction that waits at most JOURNAL_PROBE_WAIT for SQLite's lock.

        Run by housekeeping on every pass, so another process holding the journal's write
        lock (a backup tool, `sqlite3` left in a transaction, a second publisher) shows in
        health within seconds even when no event happens to need a write; an empty
        transaction writes nothing to the WAL. The flush after it keeps a failed fsync
        (EIO) in health until an fsync succeeds again.
        """
        with self._lock:
            self._db.execute(f"PRAGMA busy_timeout={int(limits.JOURNAL_PROBE_WAIT * 1000)}")
            try:
                with self._tx():
                    pass
            finally:
                self._db.execute(f"PRAGMA busy_timeout={int(limits.JOURNAL_BUSY_TIMEOUT * 1000)}")
        self.flush()  # no fsync when every commit is already durable; retries one that failed

    def _rebase_clock(self) -> None:
        """Times stored on another boot's CLOCK_BOOTTIME mean nothing now: make them "now".

        Due times become due at once; receive/record/finish times become now,
        which keeps marks and finished events one more retention period and gives
        pending events a full resolve timeout again: late, never early. A journal
        from before the boot id was stored (wall-clock times) is rebased too.
        """
        boot = _boot_id()
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
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('boot_id', ?)", (boot,))
        self.flush()

    # ------------------------------------------------------------ events

    def append(self, event: Event, wait: bool = True) -> bool:
        """Commit one event; False when its event_id was seen before (a duplicate).

        wait=False returns once committed but not yet durable: the caller must
        `flush` before it acks (intake wakes the worker in between).
        """
        return self.append_many([event], wait)[0]

    def append_many(self, events: list[Event], wait: bool = True) -> list[bool]:
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
        if wait:
            self.flush()
        return added

    def _supersede(self, db: sqlite3.Connection, dele: Event, now: float) -> None:
        """A DEL retires the pending ADD/CHECK of its attachment that happened before it.

        Without this a DEL queued behind an ADD that is backing off (claim not
        allocated yet) would wait up to the resolve timeout; the tombstone the
        DEL leaves would make the ADD a no-op anyway. "Before" is the boot order
        (publisher/order.py), never the wall clock across boots.
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
    ) -> None:
        """Mark an event handled and change the desired state, in one transaction.

        `dirty` claims are the ones whose status must be reconciled with the new
        desired state; they stay marked until a reconcile succeeds, so a crash
        between this commit and the apply loses nothing.
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
                db.execute("INSERT OR IGNORE INTO dirty(claim_namespace, claim_name) VALUES (?,?)", (ns, name))
            if seq is not None:
                db.execute("UPDATE events SET state=?, error=?, finished=? WHERE seq=?", (state, error, now, seq))

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
        """Forget tombstones and GC fences recorded before `cutoff`, unless an event that
        could still be older than them is pending (received up to `cutoff` + the horizon).

        The caller picks `cutoff` = min(now, last complete spool ingestion) minus
        limits.ORDER_HORIZON: by then any event stamped before the mark has reached
        the journal (socket or spool), see docs/design.md "Order".
        """
        with self._tx() as db:
            waiting = db.execute("SELECT COUNT(*) FROM events WHERE state='pending' AND received <= ?",
                                 (cutoff + limits.ORDER_HORIZON,)).fetchone()[0]
            if waiting:
                return 0
            n = db.execute("DELETE FROM tombstones WHERE recorded < ?", (cutoff,)).rowcount
            n += db.execute("DELETE FROM fences WHERE recorded < ?", (cutoff,)).rowcount
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

    def settle(self, ns: str, name: str, delete: list[tuple[str, str]], upsert: list[Attachment],
               applied: str | None) -> None:
        """After a successful reconcile, in one transaction: forget/move attachments, remember
        the applied body's hash, and clear the claim's dirty mark."""
        now = node_seconds()
        with self._tx() as db:
            for key in delete:
                db.execute("DELETE FROM attachments WHERE container_id=? AND ifname=?", key)
            for att in upsert:
                self._put(db, att, now)
            if applied is not None:
                db.execute("INSERT OR REPLACE INTO applied(claim, body_hash) VALUES (?,?)", (f"{ns}/{name}", applied))
            db.execute("DELETE FROM dirty WHERE claim_namespace=? AND claim_name=?", (ns, name))

    def clean(self, ns: str, name: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM dirty WHERE claim_namespace=? AND claim_name=?", (ns, name))

    def retry_dirty(self, ns: str, name: str, next_try: float) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO dirty(claim_namespace, claim_name) VALUES (?,?)", (ns, name))
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
        values = [getattr(att, c) for c in _ATT_COLUMNS]
        values[_ATT_COLUMNS.index("entry")] = json.dumps(att.entry, separators=(",", ":"), sort_keys=True)
        values[_ATT_COLUMNS.index("stamp")] = json.dumps(att.stamp or legacy_order(att.event_ts))
        values[_ATT_COLUMNS.index("added")] = json.dumps(att.added or att.stamp or legacy_order(att.event_ts))
        db.execute(
            f"INSERT OR REPLACE INTO attachments({','.join(_ATT_COLUMNS)}) VALUES ({','.join('?' * len(_ATT_COLUMNS))})",
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

    # ------------------------------------------------------------ boots (ranked by publisher/order.py)

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
        """This journal's BootOrder (publisher/order.py); the first call registers the current boot."""
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
        if not exc_type:
            self.journal._sync.committed()
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
