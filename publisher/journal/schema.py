"""The journal's tables, and the rows the rest of the publisher works with.

Kept apart from publisher/journal/store.py (the connections, transactions and
queries) so that the shape of what is stored can be read in one place, and
so that a migration is a line here, not a change to the query code.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from cni_plugin.wire.event import Event

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    container_id TEXT NOT NULL,
    ifname TEXT NOT NULL,
    op TEXT NOT NULL,
    shard_key INTEGER NOT NULL,
    received REAL NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_try REAL NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    finished REAL
);
CREATE INDEX IF NOT EXISTS events_pending ON events(state, container_id, ifname, seq);
CREATE TABLE IF NOT EXISTS attachments (
    container_id TEXT NOT NULL,
    ifname TEXT NOT NULL,
    driver TEXT NOT NULL,
    network TEXT NOT NULL,
    pod_namespace TEXT NOT NULL,
    pod_name TEXT NOT NULL,
    pod_uid TEXT NOT NULL,
    claim_namespace TEXT NOT NULL,
    claim_name TEXT NOT NULL,
    claim_uid TEXT NOT NULL,
    pool TEXT NOT NULL,
    device TEXT NOT NULL,
    share_id TEXT NOT NULL DEFAULT '',
    entry TEXT NOT NULL,
    result_hash TEXT NOT NULL,
    event_ts REAL NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (container_id, ifname)
);
CREATE INDEX IF NOT EXISTS attachments_claim ON attachments(claim_namespace, claim_name);
CREATE TABLE IF NOT EXISTS applied (
    claim TEXT PRIMARY KEY,
    body_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tombstones (
    container_id TEXT NOT NULL,
    ifname TEXT NOT NULL,
    stamp TEXT NOT NULL,
    recorded REAL NOT NULL,
    PRIMARY KEY (container_id, ifname)
);
CREATE TABLE IF NOT EXISTS fences (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    driver TEXT NOT NULL,
    network TEXT NOT NULL,
    stamp TEXT NOT NULL,
    valid TEXT NOT NULL,
    recorded REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dirty (
    claim_namespace TEXT NOT NULL,
    claim_name TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_try REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (claim_namespace, claim_name)
);
CREATE TABLE IF NOT EXISTS boots (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    boot_id TEXT UNIQUE NOT NULL,
    first_seen REAL
);
"""
# Columns added after the first release: (table, column, declaration) for journals written before.
MIGRATIONS = (("attachments", "stamp", "TEXT NOT NULL DEFAULT ''"),
              ("attachments", "request", "TEXT NOT NULL DEFAULT ''"),
              ("attachments", "added", "TEXT NOT NULL DEFAULT ''"),
              # Generation of a dirty mark: bumped by every change, so a reconcile clears only
              # the marks it planned with (Journal.settle).
              ("dirty", "gen", "INTEGER NOT NULL DEFAULT 0"),
              # The sandbox's netns path (from the ADD) and what the live-interface watch last
              # saw there (publisher/live/): the entry shows that over the ADD's networkData.
              ("attachments", "netns", "TEXT NOT NULL DEFAULT ''"),
              ("attachments", "live", "TEXT NOT NULL DEFAULT ''"),
              # The device ID the plugin sent (a meta plugin's deviceID): on reallocation the
              # attachment goes to the allocated device carrying it, as its ADD did.
              ("attachments", "device_id", "TEXT NOT NULL DEFAULT ''"),
              # The schema version of the release that last wrote the row (or took it over at an
              # upgrade); 0, the default: a release that does not know this column (0.1.0), so a
              # row an older release wrote after a rollback is told apart (publisher/journal/compat.py).
              ("attachments", "writer", "INTEGER NOT NULL DEFAULT 0"),
              # The DRA extended resource the plugin's entry names: on reallocation of the claim
              # the scheduler made for it, the attachment goes to that resource's device again.
              ("attachments", "extended_resource", "TEXT NOT NULL DEFAULT ''"))
# The journal's schema version, kept in SQLite's `PRAGMA user_version`: 1 is the first
# release's tables, and each migration adds one, so adding a migration is what bumps it.
# Journals written before versions existed read 0 and are migrated by their columns.
SCHEMA_VERSION = 1 + len(MIGRATIONS)
# Schema versions whose migration an older release cannot write past (a column without a
# default, a changed meaning). Adding a column with a default is not one of them: an older
# release leaves it at its default, which the newer release reads as "written by an older
# release" (the `writer` column). Each migration that breaks older writers adds its version here.
BREAKS_OLDER_WRITERS: frozenset[int] = frozenset()
# The oldest schema version that may still write a journal of this schema, recorded in `meta`
# as `compatible_since`: a release of that version or newer opens a newer journal and works in
# it; an older one sets it aside (publisher/journal/compat.py).
COMPATIBLE_SINCE = max(BREAKS_OLDER_WRITERS, default=1)
# Facts about the journal itself; `boot_id` names the boot whose CLOCK_BOOTTIME the stored
# times (received, next_try, finished, recorded, updated) were taken on; `compatible_since` and
# `high_water` (the newest schema version that ever opened it) are publisher/journal/compat.py's.
META_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"


@dataclass
class Pending:
    seq: int
    event: Event
    attempts: int
    received: float  # node_seconds() when the journal received it (resolve timeouts count from it)


@dataclass
class Attachment:
    container_id: str
    ifname: str
    driver: str
    network: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    claim_namespace: str
    claim_name: str
    claim_uid: str
    pool: str
    device: str
    share_id: str
    entry: dict[str, Any]
    result_hash: str
    event_ts: float
    updated: float = 0.0
    stamp: list = field(default_factory=list)  # wire order stamp of the event that wrote it
    request: str = ""  # the plugin's configured request: the device is chosen again on reallocation
    # Stamp of the ADD that gave this sandbox its attachment: the sandbox's age. A CHECK moves
    # `stamp` (event order) but not this, so a CHECK of an older sandbox never makes it "latest".
    added: list = field(default_factory=list)
    netns: str = ""  # the sandbox's netns path as the runtime gave it (CNI_NETNS)
    # What the live-interface watch saw in the netns when it differs from the ADD (or after a
    # first change): publisher/live/status.py; {} while the ADD's networkData is the truth.
    live: dict = field(default_factory=dict)
    device_id: str = ""  # normalised device ID of the ADD (cni_plugin/wire/deviceid.py); "" when none
    writer: int = 0  # schema version of the release that wrote the row (Journal._put sets its own)
    extended_resource: str = ""  # the entry's extendedResourceName ('' when none)

    @property
    def claim_key(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.container_id, self.ifname)

    @property
    def device_key(self) -> tuple[str, str, str, str]:
        return (self.driver, self.pool, self.device, self.share_id)


_ATT_COLUMNS = list(Attachment.__dataclass_fields__)


def shard_key(container_id: str) -> int:
    """Events of one sandbox always land on the same worker: per-attachment order."""
    return zlib.crc32(container_id.encode())
