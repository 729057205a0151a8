"""Journals another release wrote: a newer one used or set aside, an older writer noticed.

An upgrade migrates the journal and a `helm rollback` then starts the older release on it on
every node at once, so an older publisher must never refuse the journal and stop (nothing
would be published until someone deleted each node's journal). What this release does:

- a journal of a newer schema that says this release may still write it (`meta`
  `compatible_since` <= SCHEMA_VERSION: every migration since only added columns with a
  default) is opened and used; the newer columns and tables are left as they are and the
  recorded version is never lowered;
- any other newer journal is renamed aside with its -wal and -shm (the newest
  limits.JOURNAL_SET_ASIDE_KEEP kept) and a new one started; the service rebuilds the node's
  attachments from the API (publisher/repair/rebuild.py);
- rows an older release wrote after this one (or a newer one) had opened the journal carry a
  `writer` below the journal's high-water mark: their claims are marked dirty, so the start-up
  reconcile checks them against the live cluster again.

The service tells what happened in status and one `RolledBack` Warning (publisher/service.py).
"""

from __future__ import annotations

import glob
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from publisher import limits
from publisher.journal.schema import COMPATIBLE_SINCE, SCHEMA_VERSION

SET_ASIDE_PATTERN = re.compile(r"^journal-schema(\d+)-(\d{8}T\d{6}Z)(?:-(\d+))?\.db$")


@dataclass
class Opening:
    """What opening the journal found and did: read by status and the start-up Warning."""

    path: str
    found: int = 0  # PRAGMA user_version as found (0: a new journal, or one from before versions)
    compatible_since: int | None = None  # meta, as found (None: not recorded)
    high_water: int | None = None  # the newest schema that opened it before (None: not recorded)
    set_aside: str = ""  # where an unusable newer journal was moved
    older_rows: int = 0  # attachments an older release wrote since a newer one opened the journal
    older_claims: list[tuple[str, str]] = field(default_factory=list)

    @property
    def newer(self) -> bool:
        return self.found > SCHEMA_VERSION

    @property
    def usable(self) -> bool:
        """A newer journal this release may write (its migrations since ours all kept older writers)."""
        return not self.newer or (self.compatible_since is not None and self.compatible_since <= SCHEMA_VERSION)

    @property
    def event(self) -> str:
        """'set_aside', 'kept_newer', 'older_writer' or '' (an ordinary open)."""
        if self.set_aside:
            return "set_aside"
        if self.newer:
            return "kept_newer"
        return "older_writer" if self.older_rows else ""

    def note(self) -> str:
        """One sentence for people: the schema numbers and what was done."""
        since = "not recorded" if self.compatible_since is None else str(self.compatible_since)
        if self.set_aside:
            return (f"journal {self.path} has schema version {self.found} (writable since {since}), newer than "
                    f"this netclaim-publisher's {SCHEMA_VERSION} and not writable by it: set aside as "
                    f"{self.set_aside}; a new journal was started and this node's attachments rebuilt from "
                    "the API, the pods on this node and the spool")
        if self.newer:
            return (f"journal {self.path} has schema version {self.found}, newer than this netclaim-publisher's "
                    f"{SCHEMA_VERSION}, and is writable by it (since {since}): kept and used, its newer "
                    "columns and tables left as they are")
        if self.older_rows:
            return (f"journal {self.path}: an older release wrote this journal since a release of schema "
                    f"{self.high_water} opened it ({self.older_rows} attachment(s) of {len(self.older_claims)} "
                    f"claim(s)); this netclaim-publisher (schema {SCHEMA_VERSION}) re-checks them against the "
                    "live cluster")
        return ""

    def status(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "found_version": self.found,
                "compatible_since": self.compatible_since, "event": self.event or None,
                "set_aside_to": self.set_aside or None, "older_rows": self.older_rows, "note": self.note() or None}


def _meta_int(db: sqlite3.Connection, key: str) -> int | None:
    try:
        rows = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchall()
    except sqlite3.OperationalError:  # no meta table: a new journal, or one of another shape
        return None
    try:
        return int(rows[0][0]) if rows else None
    except (TypeError, ValueError):
        return None


def examine(db: sqlite3.Connection, path: str) -> Opening:
    """Read what the journal says of its schema, before anything writes it."""
    return Opening(path=path, found=db.execute("PRAGMA user_version").fetchone()[0],
                   compatible_since=_meta_int(db, "compatible_since"), high_water=_meta_int(db, "high_water"))


def set_aside(path: str, found: int, now: float | None = None) -> str:
    """Rename the journal and its -wal and -shm to `journal-schema<N>-<UTC time>.db`; returns the new path.

    The three move together, so the moved journal still opens with SQLite (its WAL is found
    by name). Only the newest limits.JOURNAL_SET_ASIDE_KEEP set-aside journals are kept.
    """
    state_dir = os.path.dirname(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = os.path.join(state_dir, f"journal-schema{found}-{stamp}.db")
    n = 1
    while any(os.path.lexists(target + s) for s in ("", "-wal", "-shm")):
        n += 1
        target = os.path.join(state_dir, f"journal-schema{found}-{stamp}-{n}.db")
    for suffix in ("-wal", "-shm", ""):  # the database last: a crash in between leaves it where it was
        try:
            os.rename(path + suffix, target + suffix)
        except FileNotFoundError:
            pass
    prune_set_aside(state_dir, limits.JOURNAL_SET_ASIDE_KEEP)
    return target


def set_aside_journals(state_dir: str) -> list[str]:
    """The set-aside journals in the state directory, oldest first."""
    found = []
    for p in glob.glob(os.path.join(state_dir, "journal-schema*.db")):
        m = SET_ASIDE_PATTERN.match(os.path.basename(p))
        if m:
            found.append((m.group(2), int(m.group(3) or 1), p))
    return [p for _, _, p in sorted(found)]


def prune_set_aside(state_dir: str, keep: int) -> None:
    """Remove all but the newest `keep` set-aside journals (each with its -wal and -shm)."""
    journals = set_aside_journals(state_dir)
    for p in journals[: max(0, len(journals) - keep)]:
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(p + suffix)
            except FileNotFoundError:
                pass


def stamp(db: sqlite3.Connection, opening: Opening) -> None:
    """Record this release's schema facts once the tables and every migration are in place.

    Read from the journal as it is now (after a set-aside: the new one). The version is only
    ever raised (a newer release's stays); `compatible_since` is this release's unless a newer
    release recorded its own; `high_water` is the newest schema that ever opened the journal.
    """
    found = db.execute("PRAGMA user_version").fetchone()[0]
    if found < SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    if found <= SCHEMA_VERSION:
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('compatible_since', ?)", (str(COMPATIBLE_SINCE),))
    high = max(_meta_int(db, "high_water") or 0, SCHEMA_VERSION)
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('high_water', ?)", (str(high),))


def older_writer_limit(opening: Opening) -> int | None:
    """Rows whose `writer` is below this were written by an older release after a release of
    this schema or newer had opened the journal (None: no release that records writers had)."""
    if opening.high_water is None:
        return None
    return min(opening.high_water, SCHEMA_VERSION)
