"""The journal's schema version: stamped on create and migrate, and a newer one refused.

A downgraded publisher that opened a newer release's journal would silently drop what
that release stored in columns it does not know (and write rows without them). So the
journal carries a schema version (SQLite `PRAGMA user_version`) that follows from
MIGRATIONS, and a journal newer than the code is refused at start, before anything is
written, with a message that says what to do. Real SQLite files, the real CLI.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest

from publisher.journal import schema as journal_schema
from publisher.journal.store import Journal
from publisher_testkit import BIN, unreachable_kubeconfig


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


def test_a_journal_of_a_newer_schema_is_refused_before_anything_is_written(workdir):
    state = workdir / "state"
    newer_journal(state, journal_schema.SCHEMA_VERSION + 1)
    before = (state / "journal.db").read_bytes()
    with pytest.raises(journal_schema.JournalTooNew) as info:
        Journal(str(state))
    message = str(info.value)
    assert f"schema version {journal_schema.SCHEMA_VERSION + 1}" in message and "newer" in message, message
    assert user_version(state) == journal_schema.SCHEMA_VERSION + 1
    assert (state / "journal.db").read_bytes() == before


def test_the_publisher_refuses_to_start_on_a_newer_journal_and_says_what_to_do(workdir):
    kubeconfig = unreachable_kubeconfig(workdir)
    state = workdir / "state"
    newer_journal(state, 999)  # far beyond any release: the version this test stands for
    out = subprocess.run(
        [str(BIN / "netclaim-publisher"), "run", "--node-name", "node-a", "--kubeconfig", str(kubeconfig),
         "--socket", str(workdir / "run" / "publisher.sock"), "--state-dir", str(state),
         "--spool-dir", str(workdir / "spool")],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    err = out.stderr.strip().splitlines()[-1]
    assert "cannot start" in err and "schema version 999" in err and "newer" in err, err
    assert "downgrade" in err and "journal.db" in err, err
    assert user_version(state) == 999 and "from_the_future" in columns(state, "attachments")


def test_a_journal_of_the_previous_version_keeps_its_rows_and_its_events_keep_their_device_id(workdir):
    """A publisher upgraded over its journal: the newest column (an attachment's device ID) is
    added, what was stored is read as before, and a pending ADD keeps the device ID it came with."""
    from cni_plugin.wire import Event, PodRef
    from publisher.journal.store import Attachment

    state = workdir / "state"
    journal = Journal(str(state))
    att = Attachment(container_id="c1", ifname="net1", driver="vf.example.com", network="vf", pod_namespace="ns",
                     pod_name="p", pod_uid="u1", claim_namespace="ns", claim_name="vfs", claim_uid="cu",
                     pool="pool", device="vf-3", share_id="", entry={"device": "vf-3"}, result_hash="h",
                     event_ts=1.0, request="vf")
    journal.finish(None, upsert=[att])
    journal.append(Event(op="ADD", container_id="c1", ifname="net2", driver="vf.example.com", request="vf",
                         device_id="0000:00:05.3", pod=PodRef("ns", "p", "u1"), result={}))
    journal.close()
    newest_table, newest_column, _ = journal_schema.MIGRATIONS[-1]
    assert (newest_table, newest_column) == ("attachments", "device_id")
    db = sqlite3.connect(os.path.join(state, "journal.db"))
    db.execute(f"ALTER TABLE {newest_table} DROP COLUMN {newest_column}")
    db.execute(f"PRAGMA user_version={journal_schema.SCHEMA_VERSION - 1}")
    db.commit()
    db.close()

    journal = Journal(str(state))
    try:
        assert user_version(state) == journal_schema.SCHEMA_VERSION
        kept = journal.attachment("c1", "net1")
        assert kept is not None and (kept.device, kept.entry, kept.request, kept.device_id) == \
            ("vf-3", {"device": "vf-3"}, "vf", "")
        pending = journal.ready(0, 1, float("inf"))
        assert [(p.event.ifname, p.event.device_id) for p in pending] == [("net2", "0000:00:05.3")]
    finally:
        journal.close()
