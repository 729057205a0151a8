"""The journal's schema version: stamped on create and migrate; a newer one used or set aside.

A rolled-back publisher opens a newer release's journal. The journal carries its schema
version (SQLite `PRAGMA user_version`, following from MIGRATIONS) and the oldest version that
may still write it (`meta` `compatible_since`): a newer journal this release may write is used,
what it does not know left alone; any other is set aside whole and a new one started, never a
refusal to start. Rows an older release wrote are noticed by their `writer` column.
Real SQLite files.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from publisher.journal import schema as journal_schema
from publisher.journal.store import Attachment, Journal


def user_version(state_dir) -> int:
    db = sqlite3.connect(os.path.join(state_dir, "journal.db"))
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def columns(state_dir, table: str) -> set[str]:
    db = sqlite3.connect(os.path.join(state_dir, "journal.db"))
    try:
        return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    finally:
        db.close()


def newer_journal(state_dir, version: int) -> None:
    """A journal as a newer release leaves it: a column this code does not know, a higher version."""
    Journal(str(state_dir)).close()
    db = sqlite3.connect(os.path.join(state_dir, "journal.db"))
    db.execute("ALTER TABLE attachments ADD COLUMN from_the_future TEXT NOT NULL DEFAULT ''")
    db.execute(f"PRAGMA user_version={version}")
    db.close()


def test_a_new_journal_records_the_schema_version_that_follows_from_the_migrations(workdir):
    assert journal_schema.SCHEMA_VERSION == 1 + len(journal_schema.MIGRATIONS)
    Journal(str(workdir / "state")).close()
    assert user_version(workdir / "state") == journal_schema.SCHEMA_VERSION


def test_a_journal_from_before_schema_versions_is_migrated_and_stamped(workdir):
    """The first release's tables, version 0: every migration's column is added, then the version set."""
    state = workdir / "state"
    state.mkdir()
    db = sqlite3.connect(os.path.join(state, "journal.db"))
    db.executescript(journal_schema.SCHEMA + journal_schema.META_SCHEMA)
    for table, column, _decl in journal_schema.MIGRATIONS:  # SCHEMA is the first release's tables
        if column in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.close()
    assert user_version(state) == 0
    Journal(str(state)).close()
    assert user_version(state) == journal_schema.SCHEMA_VERSION
    for table, column, _decl in journal_schema.MIGRATIONS:
        assert column in columns(state, table), (table, column)


def set_meta(state_dir, key: str, value: int) -> None:
    db = sqlite3.connect(os.path.join(state_dir, "journal.db"))
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, str(value)))
    db.commit()
    db.close()


def meta(state_dir, key: str) -> str | None:
    db = sqlite3.connect(os.path.join(state_dir, "journal.db"))
    try:
        rows = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchall()
        return rows[0][0] if rows else None
    finally:
        db.close()


def test_a_new_journal_says_which_releases_may_still_write_it(workdir):
    state = workdir / "state"
    Journal(str(state)).close()
    assert meta(state, "compatible_since") == str(journal_schema.COMPATIBLE_SINCE)
    assert meta(state, "high_water") == str(journal_schema.SCHEMA_VERSION)


def test_a_newer_journal_this_release_may_write_is_used_and_what_it_does_not_know_stays(workdir):
    state = workdir / "state"
    newer_journal(state, journal_schema.SCHEMA_VERSION + 2)  # compatible_since stays this release's
    db = sqlite3.connect(os.path.join(state, "journal.db"))
    db.execute("CREATE TABLE future_things (k TEXT)")
    db.execute("INSERT INTO future_things VALUES ('kept')")
    db.commit()
    db.close()
    journal = Journal(str(state))
    try:
        assert journal.opening.event == "kept_newer" and not journal.opening.set_aside
        journal.finish(None, upsert=[Attachment(
            container_id="c1", ifname="net1", driver="vf.example.com", network="vf", pod_namespace="ns",
            pod_name="p", pod_uid="u1", claim_namespace="ns", claim_name="vfs", claim_uid="cu", pool="pool",
            device="vf-3", share_id="", entry={"device": "vf-3"}, result_hash="h", event_ts=1.0)])
    finally:
        journal.close()
    assert user_version(state) == journal_schema.SCHEMA_VERSION + 2  # never lowered
    assert "from_the_future" in columns(state, "attachments")
    db = sqlite3.connect(os.path.join(state, "journal.db"))
    try:
        assert db.execute("SELECT k FROM future_things").fetchall() == [("kept",)]
        assert db.execute("SELECT from_the_future, writer FROM attachments").fetchall() == \
            [("", journal_schema.SCHEMA_VERSION)]
    finally:
        db.close()


def test_a_newer_journal_this_release_may_not_write_is_set_aside_whole_and_a_new_one_started(workdir):
    state = workdir / "state"
    newer = journal_schema.SCHEMA_VERSION + 1
    names = []
    for _ in range(3):  # three rollbacks: only the newest two set-aside journals are kept
        newer_journal(state, newer)
        set_meta(state, "compatible_since", newer)
        before = (state / "journal.db").read_bytes()
        journal = Journal(str(state))
        try:
            aside = journal.opening.set_aside
            assert journal.opening.event == "set_aside" and f"schema version {newer}" in journal.opening.note()
        finally:
            journal.close()
        name = os.path.basename(aside)
        assert name.startswith(f"journal-schema{newer}-") and name.endswith(".db"), name
        assert Path(aside).read_bytes() == before  # moved as it was, nothing written into it
        names.append(name)
        assert user_version(state) == journal_schema.SCHEMA_VERSION
        assert "from_the_future" not in columns(state, "attachments")
    left = sorted(p for p in os.listdir(state) if p.startswith("journal-schema"))
    assert left == sorted(names[1:]), left


def test_rows_an_older_release_wrote_after_this_one_opened_the_journal_are_noticed(workdir):
    """An older release (0.1.0 knows no `writer` column) inserts a row: it carries the column's
    default, so the next open notices it and marks its claim to be checked again. Rows that were
    there before this release first opened the journal are an upgrade, not a rollback."""
    state = workdir / "state"
    Journal(str(state)).close()
    db = sqlite3.connect(os.path.join(state, "journal.db"))
    columns_0_1_0 = ("container_id, ifname, driver, network, pod_namespace, pod_name, pod_uid, claim_namespace,"
                     " claim_name, claim_uid, pool, device, share_id, entry, result_hash, event_ts, updated")
    db.execute(f"INSERT INTO attachments({columns_0_1_0}) VALUES ('c0', 'net1', 'd', 'n', 'ns', 'p', 'u', 'ns',"
               " 'older', 'cu', 'pool', 'dev', '', '{}', 'h', 1.0, 1.0)")
    db.commit()
    db.close()
    journal = Journal(str(state))
    try:
        assert (journal.opening.event, journal.opening.older_rows) == ("older_writer", 1)
        assert "an older release wrote this journal" in journal.opening.note()
        assert [(ns, name) for ns, name, _ in journal.dirty_claims()] == [("ns", "older")]
    finally:
        journal.close()
    journal = Journal(str(state))  # taken over: the next open is an ordinary one
    try:
        assert journal.opening.event == ""
    finally:
        journal.close()


def test_a_journal_of_the_previous_version_keeps_its_rows_and_its_events_keep_what_they_came_with(workdir):
    """A publisher upgraded over its journal: the newest column (the entry's extended resource) is
    added, what was stored is read as before, and a pending ADD keeps the device ID and extended
    resource it came with."""
    from cni_plugin.wire.event import Event, PodRef

    state = workdir / "state"
    journal = Journal(str(state))
    att = Attachment(container_id="c1", ifname="net1", driver="vf.example.com", network="vf", pod_namespace="ns",
                     pod_name="p", pod_uid="u1", claim_namespace="ns", claim_name="vfs", claim_uid="cu",
                     pool="pool", device="vf-3", share_id="", entry={"device": "vf-3"}, result_hash="h",
                     event_ts=1.0, request="vf", device_id="0000:00:05.2")
    journal.finish(None, upsert=[att])
    journal.append(Event(op="ADD", container_id="c1", ifname="net2", driver="vf.example.com", request="vf",
                         device_id="0000:00:05.3", extended_resource="example.com/vf", pod=PodRef("ns", "p", "u1"),
                         result={}))
    journal.close()
    newest_table, newest_column, _ = journal_schema.MIGRATIONS[-1]
    assert (newest_table, newest_column) == ("attachments", "extended_resource")
    db = sqlite3.connect(os.path.join(state, "journal.db"))
    db.execute(f"ALTER TABLE {newest_table} DROP COLUMN {newest_column}")
    db.execute(f"PRAGMA user_version={journal_schema.SCHEMA_VERSION - 1}")
    db.commit()
    db.close()

    journal = Journal(str(state))
    try:
        assert user_version(state) == journal_schema.SCHEMA_VERSION
        kept = journal.attachment("c1", "net1")
        assert kept is not None and (kept.device, kept.entry, kept.request, kept.device_id, kept.extended_resource) \
            == ("vf-3", {"device": "vf-3"}, "vf", "0000:00:05.2", "")
        pending = journal.ready(0, 1, float("inf"))
        assert [(p.event.ifname, p.event.device_id, p.event.extended_resource) for p in pending] == [
            ("net2", "0000:00:05.3", "example.com/vf")]
    finally:
        journal.close()
